package store_test

import (
	"errors"
	"testing"
	"time"

	"github.com/ledgerline/outbox/internal/store"
)

// TestCheckpointWaitsOnlyForArchiveWriters: a checkpoint waits for the
// transactions that could still commit rows into its period, and only
// for those. A transaction holding a transaction id that never touched
// the archive (a producer's long business transaction, here one that
// just took an id) used to refuse every checkpoint for as long as it ran
// (30 s, then lock_not_available); one that inserted an archive row
// before the period's end is still waited for, and its row is in the
// checkpoint once it commits.
func TestCheckpointWaitsOnlyForArchiveWriters(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	b.enqueue(t, "p1", "k1")
	b.record(t, recordOutcome(t, b.claimOne(t, "r1", longLease), "r1", store.Dispatched))

	business, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = business.Rollback(b.ctx) }()
	if _, err := business.Exec(b.ctx, `SELECT txid_current()`); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Millisecond)
	// Waiting for it would end in lock_not_available (after 30 s).
	cp, err := b.st.TakeCheckpoint(b.ctx, b.pool, time.Millisecond, 0)
	if err != nil || cp == nil || cp.Rows != 2 {
		t.Fatalf("checkpoint beside a long transaction that never touched the archive: %+v, %v", cp, err)
	}

	// A writer of the archive, its row stamped before the next period's
	// end and not committed yet: waited for, then counted.
	writer, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = writer.Rollback(b.ctx) }()
	if _, err := writer.Exec(b.ctx, `INSERT INTO outbox.attempts (outbox_id, instruction_id, participant_id, sequence_id,
		idempotency_key, rail_type, attempt_no, state, relayer_id, claimed_at)
		VALUES (gen_random_uuid(), 'ins-w', 'p-w', 1, 'k-w', 'sandbox', 1, 'RETRYABLE', 'r1', now())`); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	committed := make(chan error, 1)
	go func() {
		// Commit once the checkpoint waits for the writer (take_checkpoint
		// polls the locks, sleeping between looks), not after a fixed
		// time: a commit that landed before the checkpoint began to wait
		// would let the test pass without showing the wait.
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			var waiting bool
			if err := b.pool.QueryRow(b.ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity
				WHERE datname = current_database() AND wait_event = 'PgSleep' AND query LIKE '%take_checkpoint%')`).Scan(&waiting); err != nil {
				committed <- err
				return
			}
			if waiting {
				break
			}
			if time.Now().After(deadline) {
				committed <- errors.New("the checkpoint never waited for the uncommitted archive writer")
				return
			}
		}
		committed <- writer.Commit(b.ctx)
	}()
	cp, err = b.st.TakeCheckpoint(b.ctx, b.pool, time.Millisecond, 0)
	if err := <-committed; err != nil {
		t.Fatal(err)
	}
	if err != nil || cp == nil || cp.Rows != 1 {
		t.Fatalf("checkpoint beside an uncommitted archive row: %+v, %v; want it to wait and count the row", cp, err)
	}
}
