package store_test

import (
	"testing"

	"github.com/ledgerline/outbox/internal/store"
)

// TestReapReadsByKey: a reaper pass reads the in-flight table once (there
// is no index on the lease, by design) and otherwise reaches rows by key,
// also when pending's and inflight's statistics are those of vacuumed
// empty tables (0 rows on their pages: PostgreSQL then estimates one row
// whatever they hold), as after a quiet spell before an incident. Joins
// the planner chose read the in-flight table once per expired row and
// every waiting row of pending to promote a poison instruction's
// successor.
func TestReapReadsByKey(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	statisticsOfEmpty(t, b.pool, "pending", "inflight")
	poison := b.enqueue(t, "p1", "k1")
	successor := b.enqueue(t, "p1", "k2")
	b.enqueue(t, "p2", "k3")
	claims := []store.Claimed{b.claimOne(t, "dead", shortLease), b.claimOne(t, "dead", shortLease)}
	// k1 has been reaped as often as the limit allows (as
	// TestPoisonInstructionIsDeadLettered gets there): this expiry makes
	// it a dead letter and k2 its participant's head.
	if _, err := b.pool.Exec(b.ctx, `UPDATE outbox.inflight SET zombie_count = 3 WHERE outbox_id = $1`, poison); err != nil {
		t.Fatal(err)
	}
	// What the rest of the fleet holds, and the backlog.
	for _, q := range []string{`
INSERT INTO outbox.inflight (outbox_id, attempt_id, attempt_no, relayer_id, ordered, claimed_at, lease_until,
                             instruction_id, participant_id, sequence_id, idempotency_key, rail_type, payload, created_at)
SELECT gen_random_uuid(), gen_random_uuid(), 1, 'alive', false, now(), now() + interval '1 hour',
       'i-' || g, 'busy-' || g, 1, 'k-' || g, 'sandbox', '{}', now()
FROM generate_series(1, 5000) AS g`, otherBacklogSQL} {
		if _, err := b.pool.Exec(b.ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	wantStatisticsOfEmpty(t, b.pool, "pending", "inflight")
	b.waitExpired(t, claims...)

	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(b.ctx)
	tables := []string{"outbox.pending", "outbox.inflight"}
	before := readsOf(t, tx, tables...)
	reaped, err := b.st.Reap(b.ctx, tx, 100, "test-reaper", 3)
	if err != nil {
		t.Fatal(err)
	}
	after := readsOf(t, tx, tables...)
	if len(reaped) != 2 {
		t.Fatalf("reaped %+v, want the two expired claims", reaped)
	}
	// Two passes over inflight (the lock statement's and the reap's), and
	// a few index entries: the rows found by key.
	if n := after[0].seqTuples - before[0].seqTuples; n > 0 {
		t.Errorf("sequential scans read %d rows of pending", n)
	}
	if n := after[0].indexEntries - before[0].indexEntries; n > 20 {
		t.Errorf("pending's indexes returned %d entries for two expired claims", n)
	}
	if n := after[1].seqTuples - before[1].seqTuples; n > 2*5002 {
		t.Errorf("sequential scans read %d rows of inflight, which holds 5,002", n)
	}
	if n := after[1].indexEntries - before[1].indexEntries; n > 20 {
		t.Errorf("inflight's indexes returned %d entries for two expired claims", n)
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	if w := b.where(t, poison); !w.dead || w.pending || w.inflight != nil {
		t.Errorf("poison instruction is %+v, want a dead letter", w)
	}
	var due bool
	if err := b.pool.QueryRow(b.ctx, `SELECT next_attempt_at <= now() FROM outbox.pending WHERE outbox_id = $1`, successor).Scan(&due); err != nil || !due {
		t.Errorf("the poison instruction's successor: due %v (%v), want due", due, err)
	}
}
