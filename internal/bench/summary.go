package bench

import "fmt"

// Summary states the ratios a reader of results looks for: ordered against
// unordered drains of the same participants, each drain and the enqueue
// figure as a share of the ceiling of the same statements measured in the
// same run, and the latency beside its floor (the enqueue statements and
// a bare durable commit at the same rate).
func Summary(results []Result) []string {
	var lines []string
	find := func(workload string, ordered bool, statements string) (Result, bool) {
		for _, r := range results {
			if r.Workload == workload && r.Ordered == ordered && r.Statements == statements {
				return r, true
			}
		}
		return Result{}, false
	}
	on, okOn := find("drain", true, "")
	off, okOff := find("drain", false, "")
	if okOn && okOff {
		lines = append(lines, fmt.Sprintf("drain: ordered/unordered %.2f (%.0f / %.0f msgs/s, %d participants)",
			on.MsgsPerSec/off.MsgsPerSec, on.MsgsPerSec, off.MsgsPerSec, on.Participants))
	}
	for _, ordered := range []bool{true, false} {
		d, ok1 := find("drain", ordered, "")
		c, ok2 := find("ceiling", ordered, "claim+outcome")
		if ok1 && ok2 {
			lines = append(lines, fmt.Sprintf("drain ordered=%v: %.0f%% of the ceiling of its statements (%.0f / %.0f msgs/s at %d pgbench clients)",
				ordered, 100*d.MsgsPerSec/c.MsgsPerSec, d.MsgsPerSec, c.MsgsPerSec, c.Clients))
		}
	}
	e, ok1 := find("enqueue", true, "")
	c, ok2 := find("ceiling", true, "enqueue")
	if ok1 && ok2 {
		lines = append(lines, fmt.Sprintf("enqueue: %.0f%% of the ceiling of its statements (%.0f / %.0f per second at %d pgbench clients)",
			100*e.MsgsPerSec/c.MsgsPerSec, e.MsgsPerSec, c.MsgsPerSec, c.Clients))
	}
	l, ok1 := find("latency", true, "")
	floor, ok2 := find("ceiling", true, statementsEnqueue)
	bare, ok3 := find("ceiling", true, statementsCommit)
	if ok1 && ok2 && ok3 {
		lines = append(lines, fmt.Sprintf("latency: enqueue→rail call p50 %.2f ms, the enqueue's own commit p50 %.2f ms; "+
			"at %.0f/s on an otherwise idle database the enqueue statements alone commit in p50 %.2f ms, a bare durable commit in p50 %.2f ms",
			*l.CallP50, *l.EnqueueP50, *floor.Rate, *floor.EnqueueP50, *bare.EnqueueP50))
	}
	return lines
}
