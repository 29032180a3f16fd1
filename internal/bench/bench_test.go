package bench_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"math"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ledgerline/outbox/internal/bench"
	"github.com/ledgerline/outbox/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// TestEveryWorkloadReports runs every workload, tiny, and reads the JSON
// lines as a script would: every line carries the fixed fields, every
// figure comes from work that was done (the ceiling's claim+outcome line
// counts DISPATCHED archive rows that pgbench's transactions wrote, so it
// is zero if the claim's result did not feed the outcome statement), and
// the runs kept every invariant (drain and latency verify before they
// report).
func TestEveryWorkloadReports(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	var out bytes.Buffer
	results, err := bench.Run(t.Context(), bench.Config{
		Pool: pool, Out: &out, JSON: true,
		Instructions: 400, Participants: 10, Rate: 200, Duration: time.Second, Producers: 4, Pairs: 1,
		Clients: []int{1, 2}, MaxConcurrency: 16, BatchSize: 20, FlushSize: 20, Report: 300 * time.Millisecond,
	}, bench.Workloads)
	if err != nil {
		t.Fatal(err)
	}
	// The soak prints a line per report (about three in a second at 300
	// ms) and its summary: counted apart.
	want := map[string]int{"drain": 2, "latency": 1, "enqueue": 1, "ceiling": 5, "notify": 2}
	atRate := map[string]bool{}
	got := map[string]int{}
	sc := bufio.NewScanner(&out)
	lines := 0
	soakRecorded := 0.0
	for sc.Scan() {
		lines++
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		for _, f := range []string{"workload", "ordered", "participants", "instructions", "msgs_per_sec", "rss_mib", "procs"} {
			if _, ok := m[f]; !ok {
				t.Errorf("line %q has no %s", sc.Text(), f)
			}
		}
		if p, _ := m["procs"].(float64); int(p) != runtime.GOMAXPROCS(0) {
			t.Errorf("line %q: procs %v, want GOMAXPROCS (%d)", sc.Text(), m["procs"], runtime.GOMAXPROCS(0))
		}
		w, _ := m["workload"].(string)
		got[w]++
		// A soak's report of an interval may rightly count nothing (the
		// first 300 ms on a loaded machine: the stream's first outcomes
		// not recorded yet); its summary and every other line may not.
		if _, summary := m["note"]; w == "soak" && !summary {
			soakRecorded += m["instructions"].(float64)
			if m["instructions"].(float64) < 0 || m["msgs_per_sec"].(float64) < 0 {
				t.Errorf("line %q: a negative count", sc.Text())
			}
		} else if m["instructions"].(float64) <= 0 || m["msgs_per_sec"].(float64) <= 0 {
			t.Errorf("line %q: no work measured", sc.Text())
		}
		if w == "latency" {
			for _, f := range []string{"rate", "achieved_rate", "call_p50_ms", "call_p99_ms", "call_p999_ms", "p50_ms", "p99_ms", "p999_ms"} {
				if v, ok := m[f].(float64); !ok || v <= 0 {
					t.Errorf("latency line %q: %s missing or zero", sc.Text(), f)
				}
			}
			if m["call_p50_ms"].(float64) > m["p50_ms"].(float64) {
				t.Errorf("latency line %q: the rail call comes after its outcome", sc.Text())
			}
			// The split after the producer's commit: the wait may be
			// negative (a claim can start before the commit's reply
			// arrives), the claim's own part may not, and it is a part of
			// each instruction's call latency, so of its median too.
			for _, f := range []string{"claim_wait_p50_ms", "claim_wait_p99_ms", "claim_to_call_p50_ms", "claim_to_call_p99_ms"} {
				if _, ok := m[f].(float64); !ok {
					t.Errorf("latency line %q: no %s", sc.Text(), f)
				}
			}
			if v, _ := m["claim_to_call_p50_ms"].(float64); v <= 0 || v > m["call_p50_ms"].(float64) {
				t.Errorf("latency line %q: claim start→rail call p50 %v, want above 0 and at most the call p50", sc.Text(), v)
			}
		}
		if st, _ := m["statements"].(string); w == "ceiling" && strings.HasSuffix(st, " at rate") {
			// A latency floor: pgbench's own transactions at the latency
			// workload's rate, timed from its per-transaction log.
			atRate[st] = true
			for _, f := range []string{"rate", "achieved_rate", "enqueue_p50_ms", "enqueue_p99_ms"} {
				if v, ok := m[f].(float64); !ok || v <= 0 {
					t.Errorf("ceiling line %q: %s missing or zero", sc.Text(), f)
				}
			}
			if m["enqueue_p50_ms"].(float64) > m["enqueue_p99_ms"].(float64) {
				t.Errorf("ceiling line %q: p50 above p99", sc.Text())
			}
		}
		if st, _ := m["statements"].(string); w == "ceiling" && st == "claim+outcome" {
			// Its figure is the queue's, not a few transactions': with ten
			// participants an ordered transaction claims ten, not a
			// batch of 20, and the run still dispatches most of the 400.
			if v := m["instructions"].(float64); v < 200 {
				t.Errorf("ceiling line %q: %v of 400 instructions dispatched, want most of them", sc.Text(), v)
			}
		}
		if w == "drain" {
			if m["rss_mib"].(float64) <= 0 {
				t.Errorf("drain line %q: no RSS", sc.Text())
			}
			// The relayers cannot drain without processor time, nor need a
			// second of it per instruction.
			if v, _ := m["process_cpu_us_per_msg"].(float64); v <= 0 || v > 1e6 {
				t.Errorf("drain line %q: process_cpu_us_per_msg %v", sc.Text(), v)
			}
			drainWrites(t, sc.Text(), m)
		}
	}
	if soakRecorded <= 0 {
		t.Error("the soak's reports recorded no outcome in any interval")
	}
	if got["soak"] < 3 {
		t.Errorf("%d soak lines, want a report every 300 ms and a summary", got["soak"])
	}
	for w, n := range want {
		if got[w] != n {
			t.Errorf("%d %s lines, want %d", got[w], w, n)
		}
	}
	if !atRate["enqueue at rate"] || !atRate["commit at rate"] {
		t.Errorf("latency floors reported: %v, want the enqueue's and a bare commit's", atRate)
	}
	if lines != len(results) {
		t.Errorf("%d lines printed, %d results returned", lines, len(results))
	}
	summary := bench.Summary(results)
	for _, line := range summary {
		t.Log(line)
	}
	if !slices.ContainsFunc(summary, func(l string) bool { return strings.HasPrefix(l, "latency: ") }) {
		t.Errorf("summary %q does not set the latency beside its floor", summary)
	}
}

// TestRoundsAlternateDrainOrder runs two rounds of a tiny drain: every
// result says its round, and the second round runs the ordering modes the
// other way round (the second of two back-to-back runs tends to be the
// faster, so a ratio from one order alone is biased).
func TestRoundsAlternateDrainOrder(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	var out bytes.Buffer
	results, err := bench.Run(t.Context(), bench.Config{
		Pool: pool, Out: &out, Instructions: 100, Participants: 5, Rounds: 2, MaxConcurrency: 16, BatchSize: 20, FlushSize: 20,
	}, []string{"drain"})
	if err != nil {
		t.Fatal(err)
	}
	type run struct {
		round   int
		ordered bool
	}
	var got []run
	for _, r := range results {
		got = append(got, run{r.Round, r.Ordered})
	}
	want := []run{{1, true}, {1, false}, {2, false}, {2, true}}
	if !slices.Equal(got, want) {
		t.Errorf("runs %v, want %v", got, want)
	}
	if n := strings.Count(out.String(), "[round 2]"); n != 2 {
		t.Errorf("%d text lines say round 2, want 2:\n%s", n, out.String())
	}
}

// TestSummaryPerRound checks the summary's arithmetic: one round states
// its ratios as they are; several are compared within each round, and
// each ratio gets its values and their median.
func TestSummaryPerRound(t *testing.T) {
	t.Parallel()
	drains := func(round int, on, off float64) []bench.Result {
		return []bench.Result{
			{Workload: "drain", Ordered: true, Participants: 1000, MsgsPerSec: on, Round: round},
			{Workload: "drain", Ordered: false, Participants: 1000, MsgsPerSec: off, Round: round},
		}
	}
	one := bench.Summary(drains(0, 500, 1000))
	if want := []string{"drain: ordered/unordered 0.50 (500 / 1000 msgs/s, 1000 participants)"}; !slices.Equal(one, want) {
		t.Errorf("one round: %q, want %q", one, want)
	}
	// Round 2's unordered figure must not be compared with round 1's
	// ordered one: 0.50, 0.90 and 0.60, never 400/1000 or 900/500.
	three := bench.Summary(slices.Concat(drains(1, 500, 1000), drains(2, 900, 1000), drains(3, 300, 500)))
	want := []string{
		"round 1: drain: ordered/unordered 0.50 (500 / 1000 msgs/s, 1000 participants)",
		"round 2: drain: ordered/unordered 0.90 (900 / 1000 msgs/s, 1000 participants)",
		"round 3: drain: ordered/unordered 0.60 (300 / 500 msgs/s, 1000 participants)",
		"drain ordered/unordered: 0.50, 0.90, 0.60 (median 0.60 over 3 rounds)",
	}
	if !slices.Equal(three, want) {
		t.Errorf("three rounds:\n%s\nwant\n%s", strings.Join(three, "\n"), strings.Join(want, "\n"))
	}
}

// drainWrites checks a drain line's outcome writes: every outcome is in
// one (400 instructions, none retried on the sandbox rail), none holds
// more than FlushSize (20), and their time fits in the drain's: at most
// two writes side by side in each of the two relayers. With ordering on,
// the participants' bound is 10 participants at one instruction per
// mean write.
func drainWrites(t *testing.T, line string, m map[string]any) {
	t.Helper()
	writes, _ := m["outcome_writes"].(float64)
	perWrite, _ := m["outcomes_per_write"].(float64)
	ms, _ := m["write_ms"].(float64)
	if writes < 1 || perWrite < 1 || perWrite > 20 || math.Round(writes*perWrite) != 400 {
		t.Errorf("drain line %q: %v writes of %v outcomes, want 400 outcomes in writes of 1 to 20", line, writes, perWrite)
	}
	if ms <= 0 || writes*ms > 2*2*1000*m["seconds"].(float64) {
		t.Errorf("drain line %q: %v writes of %v ms each, more than the drain's %v s allows", line, writes, ms, m["seconds"])
	}
	bound, ok := m["participant_bound_msgs_per_sec"].(float64)
	if ordered := m["ordered"].(bool); ordered != ok || (ok && math.Abs(bound-10*1000/ms) > 1e-6*bound) {
		t.Errorf("drain line %q: participants' bound %v (ordered %v), want 10 × 1000 / %v ms with ordering only", line, bound, ordered, ms)
	}
}

// TestCeilingClientsWriteSideBySide: two pgbench clients over 10
// participants are two pipelines of five. With a batch per client, the
// first client's first claim took all ten heads, the second client never
// dispatched anything, and the ceiling's best of one and two clients was
// one pipeline either way.
func TestCeilingClientsWriteSideBySide(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	results, err := bench.Run(t.Context(), bench.Config{
		Pool: pool, Out: io.Discard, JSON: true, Ordered: []bool{true},
		Instructions: 400, Participants: 10, Rate: 200, Duration: time.Second, Producers: 4,
		Clients: []int{2}, FlushSize: 20,
	}, []string{"ceiling"})
	if err != nil {
		t.Fatal(err)
	}
	for _, res := range results {
		if res.Statements != "claim+outcome" {
			continue
		}
		if len(res.ClientDispatched) != 2 {
			t.Fatalf("dispatched by client %v, want two clients", res.ClientDispatched)
		}
		for i, n := range res.ClientDispatched {
			if n < 100 {
				t.Errorf("client %d dispatched %d of %d, want about half", i, n, res.Instructions)
			}
		}
		return
	}
	t.Fatal("no claim+outcome line")
}
