package bench

import (
	"strings"
	"testing"

	"github.com/ledgerline/outbox/internal/store"
)

// TestDispatchScriptIsOneWrite: the ceiling's transaction is a relayer's
// write as the relayer sends it, one pipeline led by its plan settings.
// Statements sent one by one and planned afresh at each call measured
// pgbench's round trips and PostgreSQL's planner instead: over 10
// participants they ran at 54–62% of this script's rate.
func TestDispatchScriptIsOneWrite(t *testing.T) {
	t.Parallel()
	st, err := store.New("outbox")
	if err != nil {
		t.Fatal(err)
	}
	h := st.HotPath()
	script := dispatchScript(h)
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
