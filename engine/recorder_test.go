package engine

import (
	"testing"

	"github.com/ledgerline/outbox/internal/store"
)

// TestGatherTakesWhatIsQueuedUpToFlushSize: gather adds the outcomes
// already queued to the write that starts, in arrival order, never more
// than FlushSize in all, and leaves the rest for the next write.
func TestGatherTakesWhatIsQueuedUpToFlushSize(t *testing.T) {
	t.Parallel()
	const flush = 8
	newRec := func() *recorder {
		return newRecorder(&run{Relayer: &Relayer{cfg: Config{FlushSize: flush, MaxConcurrency: 16}}})
	}
	outcome := func(n int) pendingOutcome { return pendingOutcome{Outcome: store.Outcome{AttemptNo: n}} }

	rc := newRec()
	for i := range 3 {
		rc.outcomes <- outcome(i + 1)
	}
	if got := rc.gather([]pendingOutcome{outcome(0)}); len(got) != 4 {
		t.Fatalf("gathered %d outcomes with 3 queued behind the first, want 4", len(got))
	}

	rc = newRec()
	for i := range flush + 5 {
		rc.outcomes <- outcome(i + 1)
	}
	got := rc.gather([]pendingOutcome{outcome(0)})
	if len(got) != flush {
		t.Fatalf("gathered %d outcomes with %d queued, want FlushSize (%d)", len(got), flush+5, flush)
	}
	for i, o := range got {
		if o.AttemptNo != i {
			t.Fatalf("outcome %d of the write is #%d: gather must keep arrival order", i, o.AttemptNo)
		}
	}
	if left := len(rc.outcomes); left != 6 {
		t.Fatalf("%d outcomes left queued, want 6 for the next write", left)
	}
}
