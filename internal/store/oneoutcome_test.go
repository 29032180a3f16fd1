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

// TestLateOutcomeRacingTheOnTimeOneUnorderedIsAbsorbed: with ordering off
// the on-time outcome's write takes no participant lock, so nothing but
// the in-flight row serializes it with a second outcome of the same claim
// sent straight to the late statement (a caller's transaction). The
// on-time write is held after its delete of the in-flight row (a trigger
// on the archive waits for an advisory lock the test holds) while the
// second write's statement waits on that row. late_outcome_prior must run
// after that wait, as it does because the statement reads its fenced
// outcomes (the delete, and its wait) before the others: called first, it
// missed the uncommitted on-time outcome and the second was archived too
// (checked by calling it first: "want late and absorbed").
func TestLateOutcomeRacingTheOnTimeOneUnorderedIsAbsorbed(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	if err := b.st.SetOrdered(b.ctx, b.pool, false); err != nil {
		t.Fatal(err)
	}
	b.enqueue(t, "p1", "k1")
	c := b.claimOne(t, "r1", longLease)
	onTime := recordOutcome(t, c, "r1", store.Dispatched)
	second := recordOutcome(t, c, "r1", store.Retryable)

	const lockKey = 5059 // the trigger's
	if _, err := b.pool.Exec(b.ctx, `
		CREATE FUNCTION public.hold_archive() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM pg_advisory_xact_lock_shared(5059); RETURN NEW; END $$;
		CREATE TRIGGER hold_archive BEFORE INSERT ON outbox.attempts FOR EACH ROW EXECUTE FUNCTION public.hold_archive()`); err != nil {
		t.Fatal(err)
	}
	holder := b.conn(t)
	if _, err := holder.Exec(b.ctx, `SELECT pg_advisory_lock($1)`, lockKey); err != nil {
		t.Fatal(err)
	}
	waiting := func(event string, n int) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			var got int
			if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND wait_event_type = 'Lock' AND wait_event = $1`, event).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if got >= n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d sessions wait on %s, want %d", got, event, n)
			}
		}
	}
	type result struct {
		rec []store.Recorded
		err error
	}
	first := make(chan result, 1)
	go func() {
		rec, _, err := b.st.Record(b.ctx, b.pool, []store.Outcome{onTime}, store.HandoffParams{})
		first <- result{rec, err}
	}()
	waiting("advisory", 1) // the on-time write deleted the in-flight row and waits to archive

	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(b.ctx) //nolint:errcheck // committed below
	late := make(chan result, 1)
	go func() {
		rec, _, err := b.st.Record(b.ctx, tx, []store.Outcome{second}, store.HandoffParams{})
		late <- result{rec, err}
	}()
	waiting("transactionid", 1) // the second write waits on the on-time write's delete
	if _, err := holder.Exec(b.ctx, `SELECT pg_advisory_unlock($1)`, lockKey); err != nil {
		t.Fatal(err)
	}
	if r := <-first; r.err != nil || len(r.rec) != 1 || r.rec[0].Late {
		t.Fatalf("on-time write: %+v, %v", r.rec, r.err)
	}
	r := <-late
	if r.err != nil || len(r.rec) != 1 {
		t.Fatalf("second write: %+v, %v", r.rec, r.err)
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	if !r.rec[0].Late || !r.rec[0].Absorbed {
		t.Errorf("second outcome recorded %+v: want late and absorbed", r.rec[0])
	}
	if _, outcomes := b.closers(t, c); outcomes != 1 {
		t.Fatalf("claim closed by %d outcomes, want 1", outcomes)
	}
	if _, err := b.pool.Exec(b.ctx, `DROP TRIGGER hold_archive ON outbox.attempts`); err != nil {
		t.Fatal(err)
	}
	b.verifyOK(t)
}
