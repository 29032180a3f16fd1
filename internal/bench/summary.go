package bench

import (
	"fmt"
	"slices"
	"strings"
)

// Summary states the ratios a reader of results looks for: ordered against
// unordered drains of the same participants, each drain and the enqueue
// figure as a share of the ceiling of the same statements measured in the
// same run, and the latency beside its floor (the enqueue statements and
// a bare durable commit at the same rate).
//
// Results of several rounds (Config.Rounds) are compared within their
// round only: each round's lines carry its number, and each ratio then
// gets a line with its value in every round and their median.
func Summary(results []Result) []string {
	var rounds []int
	for _, r := range results {
		if !slices.Contains(rounds, r.Round) {
			rounds = append(rounds, r.Round)
		}
	}
	var (
		lines  []string
		keys   []string                 // ratio names, in order of first appearance
		values = map[string][]float64{} // per ratio, its value in each round that has it
	)
	for _, round := range rounds {
		in := slices.DeleteFunc(slices.Clone(results), func(r Result) bool { return r.Round != round })
		for _, f := range roundFigures(in) {
			line := f.line
			if round > 0 {
				line = fmt.Sprintf("round %d: %s", round, line)
			}
			lines = append(lines, line)
			if _, seen := values[f.key]; !seen {
				keys = append(keys, f.key)
			}
			values[f.key] = append(values[f.key], f.ratio)
		}
	}
	if len(rounds) < 2 {
		return lines
	}
	for _, k := range keys {
		v := values[k]
		each := make([]string, len(v))
		for i, x := range v {
			each[i] = fmt.Sprintf("%.2f", x)
		}
		lines = append(lines, fmt.Sprintf("%s: %s (median %.2f over %d rounds)", k, strings.Join(each, ", "), median(v), len(v)))
	}
	return lines
}

// figure is one ratio of a round's results and the line that states it.
type figure struct {
	key   string // what the ratio is, the same in every round
	ratio float64
	line  string
}

// roundFigures are the ratios of one round's results.
func roundFigures(results []Result) []figure {
	var out []figure
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
		out = append(out, figure{"drain ordered/unordered", on.MsgsPerSec / off.MsgsPerSec,
			fmt.Sprintf("drain: ordered/unordered %.2f (%.0f / %.0f msgs/s, %d participants)",
				on.MsgsPerSec/off.MsgsPerSec, on.MsgsPerSec, off.MsgsPerSec, on.Participants)})
	}
	for _, ordered := range []bool{true, false} {
		d, ok1 := find("drain", ordered, "")
		c, ok2 := find("ceiling", ordered, "claim+outcome")
		if ok1 && ok2 {
			out = append(out, figure{fmt.Sprintf("drain ordered=%v / its ceiling", ordered), d.MsgsPerSec / c.MsgsPerSec,
				fmt.Sprintf("drain ordered=%v: %.0f%% of the ceiling of its statements (%.0f / %.0f msgs/s at %d pgbench clients)",
					ordered, 100*d.MsgsPerSec/c.MsgsPerSec, d.MsgsPerSec, c.MsgsPerSec, c.Clients)})
		}
	}
	e, ok1 := find("enqueue", true, "")
	c, ok2 := find("ceiling", true, "enqueue")
	if ok1 && ok2 {
		out = append(out, figure{"enqueue / its ceiling", e.MsgsPerSec / c.MsgsPerSec,
			fmt.Sprintf("enqueue: %.0f%% of the ceiling of its statements (%.0f / %.0f per second at %d pgbench clients)",
				100*e.MsgsPerSec/c.MsgsPerSec, e.MsgsPerSec, c.MsgsPerSec, c.Clients)})
	}
	l, ok1 := find("latency", true, "")
	floor, ok2 := find("ceiling", true, statementsEnqueue)
	bare, ok3 := find("ceiling", true, statementsCommit)
	if ok1 && ok2 && ok3 {
		out = append(out, figure{"latency call p50 / the enqueue statements' p50 at its rate", *l.CallP50 / *floor.EnqueueP50,
			fmt.Sprintf("latency: enqueue→rail call p50 %.2f ms, the enqueue's own commit p50 %.2f ms; "+
				"at %.0f/s on an otherwise idle database the enqueue statements alone commit in p50 %.2f ms, a bare durable commit in p50 %.2f ms",
				*l.CallP50, *l.EnqueueP50, *floor.Rate, *floor.EnqueueP50, *bare.EnqueueP50)})
	}
	return out
}

// median is the middle value of v (the mean of the two middle ones for an
// even count).
func median(v []float64) float64 {
	s := slices.Sorted(slices.Values(v))
	if n := len(s); n%2 == 1 {
		return s[n/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
