package engine

import (
	"sync"
	"testing"
	"testing/synctest"
	"time"

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

// TestHoldWaitsForTheLastWritesHandoffs: after gather, a write waits for
// the outcomes of the last write's hand-offs that are still out, when a
// hand-off's dispatch takes less than half a write, for at most twice
// that time, and stops waiting as soon as they are all in. It does not
// wait for a slow rail, nor for hand-offs of older writes. Time is the
// synctest bubble's, so the waits are exact.
func TestHoldWaitsForTheLastWritesHandoffs(t *testing.T) {
	t.Parallel()
	const flush = 8
	const (
		took  = 200 * time.Microsecond
		write = 2 * time.Millisecond
	)
	newRec := func(pending int, took time.Duration) *recorder {
		rc := newRecorder(&run{Relayer: &Relayer{cfg: Config{FlushSize: flush, MaxConcurrency: 16}}})
		rc.handoffs = handoffWatch{last: 3, pending: pending, handoffTime: ewma{took}, writeTime: ewma{write}}
		return rc
	}
	outcome := func(write uint64) pendingOutcome { return pendingOutcome{handoffOf: write, took: took} }
	// send queues outcomes of the given writes' hand-offs, one every 100 µs
	// (the queue has room for them all), and returns when it is done.
	send := func(rc *recorder, writes ...uint64) (done func()) {
		var wg sync.WaitGroup
		wg.Go(func() {
			for _, w := range writes {
				time.Sleep(100 * time.Microsecond)
				rc.outcomes <- outcome(w)
			}
		})
		return wg.Wait
	}

	cases := []struct {
		name     string
		pending  int
		took     time.Duration
		arrive   []uint64
		want     int
		wantWait time.Duration
	}{
		{"both awaited arrive", 2, took, []uint64{3, 3, 3}, 3, 200 * time.Microsecond},
		{"an older write's hand-off is not awaited", 1, took, []uint64{2, 3}, 3, 200 * time.Microsecond},
		{"one never arrives: bounded by twice a hand-off", 2, took, []uint64{3}, 2, 2 * took},
		{"slow rail: no wait", 2, write / 2, []uint64{3, 3}, 1, 0},
		{"nothing awaited: no wait", 0, took, []uint64{0}, 1, 0},
		{"FlushSize ends the wait", 20, 900 * time.Microsecond, []uint64{3, 3, 3, 3, 3, 3, 3, 3, 3}, flush, 700 * time.Microsecond},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rc := newRec(c.pending, c.took)
				done := send(rc, c.arrive...)
				defer done()
				start := time.Now()
				got := rc.hold([]pendingOutcome{outcome(0)})
				if waited := time.Since(start); len(got) != c.want || waited != c.wantWait {
					t.Fatalf("hold returned %d outcomes after %v, want %d after %v", len(got), waited, c.want, c.wantWait)
				}
			})
		})
	}
}
