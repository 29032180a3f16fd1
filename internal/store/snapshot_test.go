package store_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestDueOlderThanReadsOnlyDue: readiness probes ask whether a due
// instruction is older than their threshold every few seconds, also while a
// backlog waits. The answer must come from the due index, and from no more
// of it than the due instructions, with or without statistics; old
// instructions waiting for their turn or for a retry are not due.
func TestDueOlderThanReadsOnlyDue(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	// Autovacuum stays out of the way, so the first checks run without
	// statistics, as on a fresh schema or after a backlog was loaded.
	if _, err := b.pool.Exec(b.ctx, `ALTER TABLE outbox.pending SET (autovacuum_enabled = false)`); err != nil {
		t.Fatal(err)
	}
	// ask runs the statement once in a transaction of its own and returns
	// its answer and what it read of pending.
	ask := func(age time.Duration) (late bool, before, after pendingReads) {
		t.Helper()
		tx, err := b.pool.Begin(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(b.ctx)
		before = readsOfPending(t, tx)
		late, err = b.st.DueOlderThan(b.ctx, tx, age)
		if err != nil {
			t.Fatal(err)
		}
		return late, before, readsOfPending(t, tx)
	}
	// The due index may hold dead entries before any row is written: when
	// the template's schema is migrated while an older snapshot is open in
	// its database (an autoanalyze on a loaded machine; reproduced with a
	// transaction held open), the 4,000 rows migration 005 writes and
	// deletes are not yet removable when 021 builds the index, so they are
	// in it, and with autovacuum off they stay (this test once read 4,001
	// entries so). The statement's search for the rail types steps over
	// them, as over any dead entries before a vacuum, so the bound below
	// counts them, read on the queue without a live row.
	_, before, after := ask(time.Minute)
	dead := after.dueEntries - before.dueEntries

	const due = 1000
	if _, err := b.pool.Exec(b.ctx, `
INSERT INTO outbox.pending (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
                            payload, attempt_count, next_attempt_at, created_at)
SELECT gen_random_uuid(), 'i-' || g, 'p-' || (g % 500), g, 'k-' || g, 'sandbox', '{}', 0,
       CASE WHEN g <= $1 THEN now() - interval '1 minute'   -- due, enqueued just now
            WHEN g <= 3000 THEN now() + interval '1 hour'   -- waiting for a retry
            ELSE 'infinity' END,                            -- waiting for its turn
       CASE WHEN g <= $1 THEN now() ELSE now() - interval '1 day' END
FROM generate_series(1, 20000) AS g`, due); err != nil {
		t.Fatal(err)
	}

	// check asks once and fails the test if the statement read pending
	// other than through the due index, or more of that index than the
	// due instructions.
	check := func(when string, age time.Duration) bool {
		t.Helper()
		late, before, after := ask(age)
		if after.seqScans > before.seqScans || after.otherIndexScans > before.otherIndexScans {
			t.Errorf("%s: %d sequential scans and %d scans of other indexes of pending", when,
				after.seqScans-before.seqScans, after.otherIndexScans-before.otherIndexScans)
		}
		// The due instructions, and an entry per rail type to find them
		// (one here), and the index's end, beside the dead entries.
		if n := after.dueEntries - before.dueEntries; n > due+2+dead {
			t.Errorf("%s: read %d entries of the due index, %d instructions are due and %d entries dead", when, n, due, dead)
		}
		return late
	}

	var analyzed bool
	if err := b.pool.QueryRow(b.ctx, `SELECT EXISTS (SELECT 1 FROM pg_stats
  WHERE schemaname = 'outbox' AND tablename = 'pending')`).Scan(&analyzed); err != nil {
		t.Fatal(err)
	}
	if analyzed {
		t.Fatal("pending has statistics already: the checks below would not run without them")
	}
	if check("no statistics, every due instruction enqueued just now", time.Minute) {
		t.Fatal("late, with 19,000 old instructions that are not due and 1,000 due ones enqueued just now")
	}
	if _, err := b.pool.Exec(b.ctx, `UPDATE outbox.pending SET created_at = now() - interval '2 minutes' WHERE instruction_id = 'i-500'`); err != nil {
		t.Fatal(err)
	}
	if !check("no statistics, one due instruction enqueued 2 minutes ago", time.Minute) {
		t.Fatal("not late after a minute, with a due instruction enqueued 2 minutes ago")
	}
	if check("no statistics, one due instruction enqueued 2 minutes ago", time.Hour) {
		t.Fatal("late after an hour, with the oldest due instruction enqueued 2 minutes ago")
	}
	if _, err := b.pool.Exec(b.ctx, `ANALYZE outbox.pending`); err != nil {
		t.Fatal(err)
	}
	if !check("with statistics, one due instruction enqueued 2 minutes ago", time.Minute) {
		t.Fatal("not late after a minute, with a due instruction enqueued 2 minutes ago")
	}
}

// TestSnapshotReadsPendingOnce: every scrape reads the snapshot, during a
// backlog too, so its three figures of pending (all, due, oldest due) come
// from one scan of it, not one each.
func TestSnapshotReadsPendingOnce(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	for i := range 3 {
		b.enqueue(t, "p1", fmt.Sprintf("k%d", i))
	}
	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(b.ctx)
	before := readsOfPending(t, tx)
	snap, err := b.st.Snapshot(b.ctx, tx)
	if err != nil {
		t.Fatal(err)
	}
	after := readsOfPending(t, tx)
	if n := after.scans() - before.scans(); n != 1 {
		t.Errorf("the snapshot scanned pending %d times, want once", n)
	}
	// p1's head is due, its two successors wait for their turn.
	if snap.Pending != 3 || snap.Due != 1 || snap.OldestPendingAge <= 0 {
		t.Fatalf("snapshot %+v, want 3 pending, 1 due, an oldest due age", snap)
	}
}

// pendingReads are the reads of pending counted so far in a transaction.
type pendingReads struct {
	seqScans        int64 // sequential scans of the table
	dueScans        int64 // scans of the due index
	otherIndexScans int64 // scans of its other indexes
	dueEntries      int64 // entries the due index returned
}

// scans is how many times pending was scanned, whichever way.
func (r pendingReads) scans() int64 { return r.seqScans + r.dueScans + r.otherIndexScans }

// readsOfPending reads tx's counters of pending, which also hold what the
// connection did before the transaction and has not reported yet: only
// differences between two readings in one transaction mean anything.
func readsOfPending(t *testing.T, tx pgx.Tx) (r pendingReads) {
	t.Helper()
	if err := tx.QueryRow(t.Context(), `
SELECT pg_stat_get_xact_numscans('outbox.pending'::regclass),
       pg_stat_get_xact_numscans('outbox.pending_rail_due_idx'::regclass),
       (SELECT coalesce(sum(pg_stat_get_xact_numscans(indexrelid)), 0) FROM pg_index
        WHERE indrelid = 'outbox.pending'::regclass AND indexrelid <> 'outbox.pending_rail_due_idx'::regclass),
       pg_stat_get_xact_tuples_returned('outbox.pending_rail_due_idx'::regclass)`).
		Scan(&r.seqScans, &r.dueScans, &r.otherIndexScans, &r.dueEntries); err != nil {
		t.Fatal(err)
	}
	return r
}
