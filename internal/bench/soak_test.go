package bench_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/ledgerline/outbox/internal/bench"
	"github.com/ledgerline/outbox/internal/testdb"
)

// TestSoakStaysBounded runs the soak workload for a minute at a steady
// rate, ordering on, relayers and a reaper running, and fails if the hot
// tables (pending and inflight, with their indexes), the Go heap or the
// resident set keep growing: after a warm-up, the largest value of the last
// stretch must stay within a quarter (plus a small slack) of the largest of
// the stretch before it. The keys and the archive grow by design and are
// only reported. It relies on autovacuum visiting often
// (autovacuum_naptime 10 s, what the project's clusters run with and
// docs/operations.md recommends).
func TestSoakStaysBounded(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	var naptime float64
	if err := pool.QueryRow(t.Context(),
		`SELECT setting::float * CASE unit WHEN 'min' THEN 60 WHEN 'ms' THEN 0.001 ELSE 1 END FROM pg_settings WHERE name = 'autovacuum_naptime'`).Scan(&naptime); err != nil {
		t.Fatal(err)
	}
	if naptime > 15 {
		t.Skipf("the server's autovacuum_naptime is %.0f s: the hot tables are vacuumed too rarely for a one-minute soak to tell bounded from unbounded", naptime)
	}
	results, err := bench.Run(t.Context(), bench.Config{Pool: pool, Rate: 500, Participants: 1000,
		Duration: time.Minute, Report: 5 * time.Second}, []string{"soak"})
	if err != nil {
		t.Fatal(err)
	}
	var samples []bench.SoakSample
	for _, r := range results[:len(results)-1] {
		samples = append(samples, *r.Soak)
		t.Log(r.Soak)
	}
	t.Log(results[len(results)-1].Note)
	// From 20 s on: two stretches of equal length.
	var from int
	for from < len(samples) && samples[from].ElapsedSeconds < 20 {
		from++
	}
	window := samples[from:]
	if len(window) < 4 {
		t.Fatalf("only %d samples after the warm-up", len(window))
	}
	half := len(window) / 2
	for _, m := range []struct {
		name  string
		slack float64 // MiB
		value func(bench.SoakSample) float64
	}{
		{"pending and inflight (MiB)", 1, func(s bench.SoakSample) float64 {
			return float64(total(s.Table("pending"))+total(s.Table("inflight"))) / (1 << 20)
		}},
		{"live heap (MiB)", 2, func(s bench.SoakSample) float64 { return s.HeapMiB }},
		{"resident set (MiB)", 16, func(s bench.SoakSample) float64 { return s.RSSMiB }},
	} {
		before, after := 0.0, 0.0
		for i, s := range window {
			if i < half {
				before = max(before, m.value(s))
			} else {
				after = max(after, m.value(s))
			}
		}
		msg := fmt.Sprintf("%s: largest %.1f from %.0f s, %.1f from %.0f s", m.name, before, window[0].ElapsedSeconds, after, window[half].ElapsedSeconds)
		if after > before*1.25+m.slack {
			t.Errorf("%s: grows without bound", msg)
		} else {
			t.Log(msg)
		}
	}
}

func total(t bench.TableStats) int64 { return t.HeapBytes + t.IndexBytes }

// TestSoakEndsWithASampleOfItsEnd: the soak's last report is of its end,
// so that its "start vs end" line compares the end. The stream ends with
// the duration, usually before the report tick of the same moment, and
// the last report was one interval before the end (with the duration two
// intervals, the line compared the first report with itself).
func TestSoakEndsWithASampleOfItsEnd(t *testing.T) {
	t.Parallel()
	duration := 3 * time.Second
	results, err := bench.Run(t.Context(), bench.Config{Pool: testdb.New(t), Rate: 200, Participants: 10,
		Duration: duration, Report: 2 * time.Second}, []string{"soak"})
	if err != nil {
		t.Fatal(err)
	}
	if len(results) < 3 {
		t.Fatalf("%d results, want a report, the end's report and the summary", len(results))
	}
	last := results[len(results)-2].Soak
	if last == nil || last.ElapsedSeconds < 0.9*duration.Seconds() {
		t.Fatalf("the last report is of %v s into a %v soak, not its end", last.ElapsedSeconds, duration)
	}
}
