package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ledgerline/outbox/internal/store"
)

// hotPath is the hot path's statements in the default schema.
func hotPath(t *testing.T) store.HotPath {
	t.Helper()
	st, err := store.New("outbox")
	if err != nil {
		t.Fatal(err)
	}
	return st.HotPath()
}

// TestDispatchScriptIsOneWrite: the ceiling's transaction is a relayer's
// write as the relayer sends it, one pipeline led by its plan settings.
// Statements sent one by one and planned afresh at each call measured
// pgbench's round trips and PostgreSQL's planner instead: over 10
// participants they ran at 54–62% of this script's rate.
func TestDispatchScriptIsOneWrite(t *testing.T) {
	t.Parallel()
	h := hotPath(t)
	script, err := dispatchScript(h, true)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(script), "\n")
	if lines[0] != `\startpipeline` || lines[len(lines)-1] != `\endpipeline` {
		t.Errorf("script is not one pipeline: starts %q, ends %q", lines[0], lines[len(lines)-1])
	}
	if lines[1] != h.PlanSettings+";" {
		t.Errorf("the pipeline starts with %q, want the relayer's plan settings %q", lines[1], h.PlanSettings)
	}
	for _, meta := range []string{`\gset`, `\aset`, "BEGIN", "COMMIT"} {
		if strings.Contains(script, meta) {
			t.Errorf("script holds %s, which a pipeline of one implicit transaction does not", meta)
		}
	}
	// Each of the write's statements once, in the relayer's order, with
	// no parameter left for pgbench to bind but the hand-off's own.
	at := -1
	for _, stmt := range []string{h.LockParticipants, h.RecordDispatched, h.HandoffAsOutcomes} {
		head := strings.SplitN(strings.TrimSpace(stmt), "\n", 2)[0]
		i := strings.Index(script, head)
		if i <= at {
			t.Errorf("statement %q missing or out of order", head)
		}
		at = i
	}
	if i := strings.Index(script, "$"); i >= 0 {
		t.Errorf("script leaves a parameter unbound: %q", script[i:min(len(script), i+20)])
	}
}

// TestDispatchScriptWithoutRefill: when the clients hold every
// participant, a client's first write refills (its first batch) and every
// later one sends the hand-off without the refill, as a relayer whose
// claims come back short does.
func TestDispatchScriptWithoutRefill(t *testing.T) {
	t.Parallel()
	h := hotPath(t)
	script, err := dispatchScript(h, false)
	if err != nil {
		t.Fatal(err)
	}
	first, later, ok := strings.Cut(script, `\else`)
	if !ok || !strings.HasPrefix(first, `\if :first`) || !strings.Contains(first, `\set first 0`) ||
		!strings.HasSuffix(strings.TrimSpace(later), `\endif`) {
		t.Fatalf("script is not a first write and the others:\n%s", script)
	}
	// The refill is a claim of the due queue, which skips rows other
	// claims hold; nothing else in a hand-off does.
	const refill = "SKIP LOCKED"
	if !strings.Contains(h.HandoffAsOutcomes, refill) || strings.Contains(h.HandoffSuccessorsAsOutcomes, refill) {
		t.Fatalf("cannot tell the hand-offs apart by %q", refill)
	}
	if !strings.Contains(first, refill) {
		t.Error("the first write does not refill")
	}
	if strings.Contains(later, refill) {
		t.Error("the later writes refill")
	}
}

// TestClientBatchSharesHeldParticipants: with ordering on and fewer
// participants than the clients' batches, each client takes an equal
// share (so that they write side by side); otherwise the batch stands.
func TestClientBatchSharesHeldParticipants(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		ordered                      bool
		clients, batch, participants int
		want                         int
		held                         bool
	}{
		{true, 1, 256, 10, 10, true},
		{true, 2, 256, 10, 5, true},
		{true, 4, 256, 10, 3, true},
		{true, 2, 256, 1000, 256, false},
		{true, 4, 256, 1000, 250, true},
		{false, 2, 256, 10, 256, false},
		{true, 2, 256, 0, 256, false},
	} {
		got, held := clientBatch(c.ordered, c.clients, c.batch, c.participants)
		if got != c.want || held != c.held {
			t.Errorf("clientBatch(%v, %d, %d, %d) = %d, %v; want %d, %v", c.ordered, c.clients, c.batch, c.participants,
				got, held, c.want, c.held)
		}
	}
}

// TestPgbenchSQLRefusesMismatchedArguments: a statement rendered with an
// argument it has no parameter for, or without one for a parameter, is an
// error, not a script that measures the statement with its arguments in
// the wrong places (the enqueue's ceiling once mapped six arguments onto a
// statement of four, and only a failing jsonb cast showed it).
func TestPgbenchSQLRefusesMismatchedArguments(t *testing.T) {
	t.Parallel()
	const q = "SELECT $1::int + $2::int"
	if got, err := pgbenchSQL(q, map[int]string{1: ":a", 2: ":b"}); err != nil || got != "SELECT :a::int + :b::int" {
		t.Errorf("exact arguments: %q, %v", got, err)
	}
	for name, args := range map[string]map[int]string{
		"an extra argument": {1: ":a", 2: ":b", 3: ":c"},
		"a missing one":     {1: ":a"},
		"shifted":           {2: ":a", 3: ":b"},
	} {
		if got, err := pgbenchSQL(q, args); err == nil {
			t.Errorf("%s: %q, want an error", name, got)
		}
	}
}

// TestTxLogsOfAClientThatRanNothing: pgbench's per-client log of a client
// that ran no transaction (its connection took the whole run, on a busy
// machine) is empty; the other clients' transactions still count. An
// empty log was read as a line that was no transaction, and the ceiling
// failed.
func TestTxLogsOfAClientThatRanNothing(t *testing.T) {
	t.Parallel()
	prefix := filepath.Join(t.TempDir(), "txlog")
	var lines strings.Builder
	for i := range warmTransactions + 2 {
		fmt.Fprintf(&lines, "0 %d 1500 0 1700000000 %d 200\n", i, i)
	}
	for name, text := range map[string]string{".1": lines.String(), ".1.1": ""} {
		if err := os.WriteFile(prefix+name, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	own, lag, err := readTxLogs(prefix)
	if err != nil {
		t.Fatal(err)
	}
	if own.TotalCount() != 2 || own.Max() < 1300 || lag.Max() < 200 {
		t.Errorf("%d transactions, own time up to %d µs, lag up to %d: want the two past the warm-up, 1,300 and 200 µs",
			own.TotalCount(), own.Max(), lag.Max())
	}
}
