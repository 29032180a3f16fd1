package store_test

import (
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerline/outbox/internal/store"
)

// TestClaimTakesNoInstructionBehindALowerSequence: with ordering on, a
// claim checks each candidate for a lower pending sequence of its
// participant, so an instruction that is due but not its participant's
// head (a hand edit of next_attempt_at, a broken writer) is not claimed
// before the head, whichever is older, nor beside it. Without that check
// the claim took the later instruction first, or both, which the ordered
// in-flight index then refused.
func TestClaimTakesNoInstructionBehindALowerSequence(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	head := b.enqueue(t, "p-behind", "k-head")
	later := b.enqueue(t, "p-behind", "k-later")
	// The later one due, and due before the head.
	execAll(t, b.pool,
		`UPDATE outbox.pending SET next_attempt_at = now() - interval '2 minutes' WHERE outbox_id = '`+later.String()+`'`,
		`UPDATE outbox.pending SET next_attempt_at = now() - interval '1 minute' WHERE outbox_id = '`+head.String()+`'`)

	claimed, err := b.st.Claim(b.ctx, b.pool, store.ClaimParams{RelayerID: "r-1", Limit: 10,
		Leases: map[string]time.Duration{"sandbox": longLease}})
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	if len(claimed) != 1 || claimed[0].OutboxID != head {
		t.Fatalf("claimed %v, want only the head %s (not %s, behind it)", outboxIDs(claimed), head, later)
	}
}

// TestClaimTakesTheOldestDueFirst: a claim takes the oldest due
// instructions first, within a rail and across rails, whatever order the
// rails are asked in and the rows lie in the table (a row made due
// earlier by an update lies after the others, and most of the rail's due
// instructions are younger). Dropping either ORDER BY of
// the claim (dueRows) took a younger instruction first.
func TestClaimTakesTheOldestDueFirst(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	if err := b.st.SetOrdered(b.ctx, b.pool, false); err != nil {
		t.Fatal(err)
	}
	execAll(t, b.pool,
		`INSERT INTO outbox.pending (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type, payload, next_attempt_at, created_at)
		 VALUES ('00000000-0000-7000-8000-0000000000a1', 'i-a1', 'p-a1', 1, 'k-a1', 'sandbox', '{}', now() - interval '1 minute', now() - interval '9 minutes'),
		        ('00000000-0000-7000-8000-0000000000a2', 'i-a2', 'p-a2', 1, 'k-a2', 'sandbox', '{}', now() - interval '1 minute', now() - interval '9 minutes'),
		        ('00000000-0000-7000-8000-0000000000b1', 'i-b1', 'p-b1', 1, 'k-b1', 'other', '{}', now() - interval '2 minutes', now() - interval '9 minutes')`,
		// Many more due on the rail, younger, so that a claim that did not
		// sort would read the table in its order.
		`INSERT INTO outbox.pending (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type, payload, next_attempt_at, created_at)
		 SELECT gen_random_uuid(), 'i-' || n, 'p-' || n, 1, 'k-' || n, 'sandbox', '{}', now() - interval '1 minute', now() - interval '5 minutes'
		 FROM generate_series(1, 2000) n`,
		// a2 is due first, and now lies after all the others in the table.
		`UPDATE outbox.pending SET next_attempt_at = now() - interval '3 minutes' WHERE instruction_id = 'i-a2'`,
		`ANALYZE outbox.pending`)
	// claim runs the claim statement with the rails in the order given
	// (Claim passes them in a map's order) and without index scans: the
	// due index's order is the one wanted, so a plan that reads it would
	// hide a missing sort; a bitmap scan (the generic plan without the
	// store's settings: TestClaimReadsTheDueIndexInOrder) reads rows in
	// the table's order.
	claim := func(limit int, rails string) []string {
		t.Helper()
		var got []string
		err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(b.ctx, `SET LOCAL enable_indexscan = off`); err != nil {
				return err
			}
			rows, err := tx.Query(b.ctx, b.st.HotPath().Claim, "r-1", limit, rails, "{60000,60000}")
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				vals, err := rows.Values()
				if err != nil {
					return err
				}
				got = append(got, vals[3].(string)) // instruction_id
			}
			return rows.Err()
		})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := claim(1, "{other,sandbox}"); !slices.Equal(got, []string{"i-a2"}) {
		t.Fatalf("first claim took %v, want [i-a2] (due 3 minutes ago)", got)
	}
	if got := claim(2, "{sandbox,other}"); !slices.Equal(got, []string{"i-b1", "i-a1"}) {
		t.Fatalf("second claim took %v, want [i-b1 i-a1] (due 2 and 1 minutes ago)", got)
	}
}
