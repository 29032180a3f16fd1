package store_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerline/outbox/internal/store"
)

// closers counts the archive's rows that close claim: the reaper's, and
// outcomes (on time or late).
func (b *recordBundle) closers(t *testing.T, c store.Claimed) (reaper, outcomes int) {
	t.Helper()
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FILTER (WHERE state = 'ZOMBIE_REQUEUE'),
		count(*) FILTER (WHERE state <> 'ZOMBIE_REQUEUE') FROM outbox.attempts
		WHERE claim_attempt_id = $1 AND state <> 'DISPATCHING'`, c.AttemptID).Scan(&reaper, &outcomes); err != nil {
		t.Fatal(err)
	}
	return reaper, outcomes
}

// TestTwoLateOutcomesOfOneClaimArchiveOne: two writers record late
// outcomes of one reaped claim under different outcome ids at once (each
// waits for the participant's lock, held by a third transaction, and both
// go when it ends), ordering on and off. The archive keeps one of them
// after the reaper's row, the other is reported absorbed and withdraws
// nothing, and audit verify passes. Before migration 050 both were
// archived and verify reported the claim closed twice.
func TestTwoLateOutcomesOfOneClaimArchiveOne(t *testing.T) {
	t.Parallel()
	for _, ordered := range []bool{true, false} {
		t.Run(map[bool]string{true: "ordered", false: "unordered"}[ordered], func(t *testing.T) {
			t.Parallel()
			b := setupRecord(t)
			if err := b.st.SetOrdered(b.ctx, b.pool, ordered); err != nil {
				t.Fatal(err)
			}
			b.enqueue(t, "p1", "k1")
			c := b.claimOne(t, "slow", shortLease)
			b.reap(t, c)
			first := recordOutcome(t, c, "slow", store.Retryable)
			second := recordOutcome(t, c, "slow", store.Dispatched)

			holder, err := b.pool.Begin(b.ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer holder.Rollback(b.ctx) //nolint:errcheck // committed below
			if _, err := holder.Exec(b.ctx, `SELECT 1 FROM outbox.sequences WHERE participant_id = 'p1' FOR UPDATE`); err != nil {
				t.Fatal(err)
			}
			type result struct {
				rec []store.Recorded
				err error
			}
			done := make(chan result, 2)
			for _, o := range []store.Outcome{first, second} {
				go func() {
					rec, _, err := b.st.Record(b.ctx, b.pool, []store.Outcome{o}, store.HandoffParams{})
					done <- result{rec, err}
				}()
			}
			// Both wait for the lock (with ordering off, writers that do
			// not lock go on at once; then there is nothing to wait for).
			// Asked outside holder: a transaction reads pg_stat_activity
			// once.
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
				var waiting int
				if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pg_stat_activity
					WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting); err != nil {
					t.Fatal(err)
				}
				if waiting == 2 || len(done) == 2 {
					break
				}
			}
			if err := holder.Commit(b.ctx); err != nil {
				t.Fatal(err)
			}
			var recorded []store.Recorded
			for range 2 {
				r := <-done
				if r.err != nil || len(r.rec) != 1 || !r.rec[0].Late {
					t.Fatalf("recorded %+v, %v: want one late outcome", r.rec, r.err)
				}
				recorded = append(recorded, r.rec[0])
			}
			if reaper, outcomes := b.closers(t, c); reaper != 1 || outcomes != 1 {
				t.Fatalf("claim closed by %d reaper rows and %d outcomes: want 1 and 1", reaper, outcomes)
			}
			if recorded[0].Absorbed == recorded[1].Absorbed {
				t.Errorf("recorded %+v: want one of them absorbed", recorded)
			}
			for _, r := range recorded {
				if r.Absorbed && r.Withdrew {
					t.Errorf("the absorbed outcome withdrew the requeued copy: %+v", r)
				}
			}
			b.verifyOK(t)
		})
	}
}

// TestLateOutcomeAfterTheOnTimeOneIsAbsorbed: a claim's outcome is
// recorded on time, then a second outcome of the same claim under another
// outcome id comes (its in-flight row is gone: it is late). It is absorbed:
// the archive keeps the first alone, the participant's queue is not
// touched, and verify passes; the first sent again is still a resend.
func TestLateOutcomeAfterTheOnTimeOneIsAbsorbed(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	b.enqueue(t, "p1", "k1")
	next := b.enqueue(t, "p1", "k2")
	c := b.claimOne(t, "r1", longLease)
	first := recordOutcome(t, c, "r1", store.Retryable)
	first.RetryDelay = time.Hour
	b.record(t, first)
	second := recordOutcome(t, c, "r1", store.Dispatched)
	rec := b.record(t, second)
	if !rec[0].Late || !rec[0].Absorbed || rec[0].Withdrew {
		t.Fatalf("recorded %+v: want late, absorbed, nothing withdrawn", rec[0])
	}
	if rec := b.record(t, first); rec[0].Absorbed || rec[0].Late {
		t.Fatalf("the first outcome again: %+v, want a resend of an on-time outcome", rec[0])
	}
	if _, outcomes := b.closers(t, c); outcomes != 1 {
		t.Fatalf("claim closed by %d outcomes, want 1", outcomes)
	}
	if w := b.where(t, c.OutboxID); !w.pending {
		t.Fatalf("%s: %+v, want pending (its retry)", c.OutboxID, w)
	}
	if w := b.where(t, next); !w.pending {
		t.Fatalf("%s: %+v, want pending behind it", next, w)
	}
	var rows int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox.attempts WHERE outbox_id = $1 AND state = 'DISPATCHED'`,
		c.OutboxID).Scan(&rows); err != nil && err != pgx.ErrNoRows {
		t.Fatal(err)
	}
	if rows != 0 {
		t.Fatalf("%d DISPATCHED rows archived for the absorbed outcome's instruction, want 0", rows)
	}
	b.verifyOK(t)
}
