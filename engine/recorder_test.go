package engine

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerline/outbox/internal/retry"
	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/rails"
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

// TestWritesReuseTheirBatches: a write's batch, once it has ended, is the
// next write's, emptied and with nothing of its outcomes left in it; a
// write that finds none spare gets one with room for FlushSize outcomes.
func TestWritesReuseTheirBatches(t *testing.T) {
	t.Parallel()
	const flush = 8
	rc := newRecorder(&run{Relayer: &Relayer{cfg: Config{FlushSize: flush, MaxConcurrency: 16, OutcomeWriters: 2}}})

	first := rc.newBatch()
	if len(first) != 0 || cap(first) != flush {
		t.Fatalf("new batch has length %d, room for %d, want 0 and FlushSize (%d)", len(first), cap(first), flush)
	}
	first = append(first, pendingOutcome{Outcome: store.Outcome{AttemptNo: 1, ErrorMessage: "kept?"}})
	second := append(rc.newBatch(), pendingOutcome{Outcome: store.Outcome{AttemptNo: 2}})
	rc.reuse(first)

	next := rc.newBatch()
	if len(next) != 0 || cap(next) != flush || &next[:1][0] != &first[0] {
		t.Fatalf("the next write's batch is not the one that ended (length %d, room %d)", len(next), cap(next))
	}
	if o := next[:1][0]; o.AttemptNo != 0 || o.ErrorMessage != "" {
		t.Fatalf("a reused batch still holds the outcome of #%d (%q)", o.AttemptNo, o.ErrorMessage)
	}
	if other := rc.newBatch(); &other[:1][0] == &second[0] || &other[:1][0] == &first[0] {
		t.Fatal("a batch still being written was handed to another write")
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

// TestNextWriteWaitsUnlessFull: while a write is in progress, the next
// one waits for it, taking what arrives meanwhile, unless it fills up
// (FlushSize) and a writer is free; with no write in progress it starts
// at once. Time is the synctest bubble's: "waits" means durably blocked.
func TestNextWriteWaitsUnlessFull(t *testing.T) {
	t.Parallel()
	const flush = 3
	synctest.Test(t, func(t *testing.T) {
		rc := newRecorder(&run{Relayer: &Relayer{cfg: Config{FlushSize: flush, MaxConcurrency: 16, OutcomeWriters: 2}}})
		outcome := pendingOutcome{}

		// No write in progress: at once, alone.
		if n := <-startWriter(rc); n != 1 {
			t.Fatalf("with no write in progress the write started with %d outcomes, want 1", n)
		}

		// One in progress: a write that is not full waits, and takes what
		// arrives, until it is full.
		inProgress := <-rc.writers
		got := startWriter(rc)
		synctest.Wait()
		select {
		case n := <-got:
			t.Fatalf("a write of %d outcomes (FlushSize %d) started beside the one in progress", n, flush)
		default:
		}
		rc.outcomes <- outcome
		synctest.Wait()
		if len(got) != 0 {
			t.Fatal("a write of 2 outcomes started beside the one in progress")
		}
		rc.outcomes <- outcome
		if n := <-got; n != flush {
			t.Fatalf("the full write started with %d outcomes, want %d", n, flush)
		}

		// One in progress: a write that is not full starts when it ends.
		got = startWriter(rc)
		synctest.Wait()
		if len(got) != 0 {
			t.Fatal("a write of 1 outcome started beside the one in progress")
		}
		endWrite(rc, inProgress)
		if n := <-got; n != 1 {
			t.Fatalf("after the write in progress ended the next started with %d outcomes, want 1", n)
		}
	})
}

// startWriter asks rc for a writer for a write of one outcome, in a
// goroutine of its own; the channel gets the write's size once it may
// start (its writer goes straight back).
func startWriter(rc *recorder) chan int {
	got := make(chan int, 1)
	go func() {
		w, batch := rc.writer([]pendingOutcome{{}})
		rc.writers <- w
		got <- len(batch)
	}()
	return got
}

// endWrite ends the write in progress on writer w, as the loop's write
// goroutine does.
func endWrite(rc *recorder, w *retry.Loop) {
	rc.setStarted(w, time.Time{})
	rc.writers <- w
	rc.wrote <- struct{}{}
}

// TestNextWriteStartsBesideAHeldUpOne: a write that is not full starts
// beside the one in progress once that one has run for stallAfter (here
// its floor: no write has been timed yet), if a writer is free; before
// that it waits, and with one writer it waits for the write to end.
func TestNextWriteStartsBesideAHeldUpOne(t *testing.T) {
	t.Parallel()
	for _, writers := range []int{1, 2} {
		t.Run(fmt.Sprintf("%d writers", writers), func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				rc := newRecorder(&run{Relayer: &Relayer{cfg: Config{FlushSize: 16, MaxConcurrency: 16, OutcomeWriters: writers}}})
				inProgress := <-rc.writers
				rc.setStarted(inProgress, time.Now())
				got := startWriter(rc)
				time.Sleep(writeStallFloor - time.Millisecond)
				synctest.Wait()
				if len(got) != 0 {
					t.Fatalf("a write started beside one that has run for %v", writeStallFloor-time.Millisecond)
				}
				time.Sleep(2 * time.Millisecond)
				synctest.Wait()
				if writers == 2 {
					if len(got) != 1 || <-got != 1 {
						t.Fatalf("no write started beside one that has run for %v", writeStallFloor+time.Millisecond)
					}
					return
				}
				if len(got) != 0 {
					t.Fatal("a write started with no writer free")
				}
				endWrite(rc, inProgress)
				if n := <-got; n != 1 {
					t.Fatalf("after the write in progress ended the next started with %d outcomes, want 1", n)
				}
			})
		})
	}
}

// TestHeldUpWriteIsNotWaitedForAgain: once the oldest write in progress
// is held up, each later write starts as soon as a writer is free, not
// after waiting for the write that started last.
func TestHeldUpWriteIsNotWaitedForAgain(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		rc := newRecorder(&run{Relayer: &Relayer{cfg: Config{FlushSize: 16, MaxConcurrency: 16, OutcomeWriters: 2}}})
		held := <-rc.writers
		rc.setStarted(held, time.Now())
		time.Sleep(2 * writeStallFloor)
		second := <-rc.writers
		rc.setStarted(second, time.Now())
		got := startWriter(rc)
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if len(got) != 0 {
			t.Fatal("a write started with no writer free")
		}
		// The second write ends; the held one goes on.
		endWrite(rc, second)
		synctest.Wait()
		if len(got) != 1 {
			t.Fatal("the next write waited although the write in progress is held up and a writer is free")
		}
	})
}

// TestWriteHeldUpByALockHoldsUpOnlyItsOwnOutcomes: with two outcome
// writers, a write waiting for a participant's lock (here a transaction
// holding its sequences row) does not keep another participant's outcome
// from being recorded, whether that write is full (FlushSize 1: one
// outcome) or not (the default FlushSize: it starts once the held one
// has run for stallAfter); with one writer it does, until the lock goes.
func TestWriteHeldUpByALockHoldsUpOnlyItsOwnOutcomes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ writers, flush int }{{1, 1}, {2, 1}, {2, 0}} {
		writers := tc.writers
		t.Run(fmt.Sprintf("%d writers, FlushSize %d", writers, tc.flush), func(t *testing.T) {
			t.Parallel()
			b := setup(t, rails.SandboxOptions{})
			b.enqueueOne(t, "held")
			lock := b.lockParticipant(t, "held")

			cfg := b.config("writers")
			cfg.OutcomeWriters, cfg.FlushSize = writers, tc.flush
			r := b.start(t, cfg)
			// The outcome of "held" is paid, and its write waits for the lock.
			waitFor(t, 10*time.Second, "the write of the held participant's outcome to wait for its lock", func() bool {
				var waiting bool
				err := b.pool.QueryRow(b.ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity
					WHERE datname = current_database() AND wait_event_type = 'Lock')`).Scan(&waiting)
				return err == nil && waiting && b.sandbox.Stats().Payments == 1
			})
			held := time.Now()

			b.enqueueOne(t, "free")
			waitFor(t, 10*time.Second, "the free participant's instruction to be paid", func() bool {
				return b.sandbox.Stats().Payments == 2
			})
			if writers == 1 {
				// Its outcome waits behind the held write: nothing recorded.
				time.Sleep(300 * time.Millisecond)
				if got := r.Stats().Dispatched; got != 0 {
					t.Fatalf("%d outcomes recorded while the only writer waits for a lock, want 0", got)
				}
			} else {
				waitFor(t, 10*time.Second, "the free participant's outcome to be recorded while the other write waits", func() bool {
					return r.Stats().Dispatched == 1
				})
			}
			// Taken before the rollback is sent: the held write cannot end
			// before the server has it. Taken after its reply, it could be
			// later than the write's end by a scheduling delay (once 70 µs
			// under -race).
			releasing := time.Now()
			if err := lock.Rollback(b.ctx); err != nil {
				t.Fatal(err)
			}
			waitFor(t, 10*time.Second, "both outcomes recorded once the lock is gone", func() bool {
				return r.Stats().Dispatched == 2
			})
			// The held write's time counts its wait for the lock: it was
			// waiting before held and ended after releasing.
			if st := r.Stats(); st.OutcomeWriteTime < releasing.Sub(held) {
				t.Errorf("outcome writes took %v in all, want at least the %v the lock was seen held", st.OutcomeWriteTime, releasing.Sub(held))
			}
			b.waitDrained(t, 10*time.Second)
			b.verify(t, true)
		})
	}
}

// enqueueOne enqueues participant's instruction 0 in a transaction of its
// own.
func (b *testBundle) enqueueOne(t *testing.T, participant string) {
	t.Helper()
	if err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		_, err := b.producer.Enqueue(b.ctx, tx, instruction(participant, 0))
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

// lockParticipant holds participant's sequence row, as a producer's open
// transaction does, until the returned transaction ends (at the latest
// when the test ends): an outcome write for the participant waits on it.
func (b *testBundle) lockParticipant(t *testing.T, participant string) pgx.Tx {
	t.Helper()
	lock, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lock.Rollback(context.WithoutCancel(b.ctx)) })
	if _, err := lock.Exec(b.ctx, `SELECT 1 FROM outbox.sequences WHERE participant_id = $1 FOR UPDATE`, participant); err != nil {
		t.Fatal(err)
	}
	return lock
}
