package store_test

import (
	"testing"

	"github.com/gofrs/uuid/v5"

	"github.com/ledgerline/outbox/internal/store"
)

// TestDeadLetterPagesReadOnlyTheirRows: acknowledged dead letters stay for
// good, so over the years the table grows without bound. A page of the
// list, open or all, reads its rows through an index in the list's order,
// never the whole table, on custom and generic plans alike; and the pages
// together are the list, in order, each row once.
func TestDeadLetterPagesReadOnlyTheirRows(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	// 20,000 dead letters, one failure a second. As in use, the oldest are
	// acknowledged and the last 2,000 are open; the last 100 of them failed
	// in one outcome write: one failed_at, so page boundaries fall inside a
	// tie.
	if _, err := b.pool.Exec(b.ctx, `
INSERT INTO outbox.dead_letters (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
                                 payload, attempt_count, error_code, attempt_id, created_at, failed_at, acknowledged_at)
SELECT gen_random_uuid(), 'i-' || g, 'p-' || (g % 500), g, 'k-' || g, 'sandbox', '{}', 1, 'RAIL_REJECTED',
       gen_random_uuid(), now() - interval '1 day',
       CASE WHEN g > 19900 THEN now() ELSE now() - interval '1 day' + g * interval '1 second' END,
       CASE WHEN g <= 18000 THEN now() END
FROM generate_series(1, 20000) AS g`); err != nil {
		t.Fatal(err)
	}
	const limit = 50
	const tie = 100 // the open dead letters that share a failed_at

	for _, all := range []bool{false, true} {
		want := 2000
		if all {
			want = 20000
		}
		for _, plans := range []string{"auto", "force_custom_plan", "force_generic_plan"} {
			for _, analyzed := range []bool{false, true} {
				if analyzed {
					if _, err := b.pool.Exec(b.ctx, `ANALYZE outbox.dead_letters`); err != nil {
						t.Fatal(err)
					}
				}
				tx, err := b.pool.Begin(b.ctx)
				if err != nil {
					t.Fatal(err)
				}
				// Fatal skips the loop's rollback; the pool's close waits for it.
				t.Cleanup(func() { tx.Rollback(b.ctx) })
				if _, err := tx.Exec(b.ctx, `SELECT set_config('plan_cache_mode', $1, true)`, plans); err != nil {
					t.Fatal(err)
				}
				var (
					after store.Cursor
					seen  = map[uuid.UUID]bool{}
					last  store.DeadLetter
				)
				for page := 0; ; page++ {
					before := readsOf(t, tx, "outbox.dead_letters")[0]
					items, err := b.st.DeadLettersAfter(b.ctx, tx, all, after, limit)
					if err != nil {
						t.Fatal(err)
					}
					reads := readsOf(t, tx, "outbox.dead_letters")[0]
					if n := reads.seqScans - before.seqScans; n > 0 {
						t.Fatalf("all=%v, %s plans, statistics %v, page %d: %d sequential scans of dead_letters",
							all, plans, analyzed, page, n)
					}
					// The whole list: an index entry per row, one past the
					// page, and at most the tie's entries before the cursor
					// within its failed_at. The open list may read all the
					// open ones (a plan made when they looked few does), but
					// none of the acknowledged.
					bound := limit + 1 + tie
					if !all {
						bound = want
					}
					if n := reads.indexEntries - before.indexEntries; n > int64(bound) {
						t.Fatalf("all=%v, %s plans, statistics %v, page %d: %d index entries for a page of %d",
							all, plans, analyzed, page, n, limit)
					}
					for _, d := range items {
						if seen[d.OutboxID] {
							t.Fatalf("all=%v, page %d: %s listed twice", all, page, d.OutboxID)
						}
						if d.AcknowledgedAt != nil && !all {
							t.Fatalf("page %d of the open list: %s is acknowledged", page, d.OutboxID)
						}
						if len(seen) > 0 && (d.FailedAt.Before(last.FailedAt) ||
							d.FailedAt.Equal(last.FailedAt) && d.OutboxID.String() <= last.OutboxID.String()) {
							t.Fatalf("all=%v, page %d: %s (%s) after %s (%s)", all, page,
								d.OutboxID, d.FailedAt, last.OutboxID, last.FailedAt)
						}
						seen[d.OutboxID], last = true, d
					}
					if len(items) < limit {
						break
					}
					after = store.Cursor{At: last.FailedAt, ID: last.OutboxID}
				}
				if len(seen) != want {
					t.Errorf("all=%v, %s plans: the pages listed %d dead letters, want %d", all, plans, len(seen), want)
				}
				tx.Rollback(b.ctx)
			}
		}
	}
}

// TestCountDeadLetters: the count the console's list shows above it is of
// the list's own filter (open ones only or all, one participant's or
// everyone's), and stops at its bound: acknowledged dead letters stay
// until their archive month is detached, and a count of all of them on
// every page view would read years of rows.
func TestCountDeadLetters(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	// 30 dead letters of p-0, p-1 and p-2 (10 each); the first 12 (4 of
	// each) acknowledged.
	if _, err := b.pool.Exec(b.ctx, `
INSERT INTO outbox.dead_letters (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
                                 payload, attempt_count, error_code, attempt_id, created_at, failed_at, acknowledged_at)
SELECT gen_random_uuid(), 'i-' || g, 'p-' || (g % 3), g, 'k-' || g, 'sandbox', '{}', 1, 'RAIL_REJECTED',
       gen_random_uuid(), now(), now() + g * interval '1 second', CASE WHEN g <= 12 THEN now() END
FROM generate_series(1, 30) AS g`); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		all         bool
		participant string
		max         int
		want        int64
	}{
		{false, "", 100, 18},
		{true, "", 100, 30},
		{false, "p-1", 100, 6},
		{true, "p-1", 100, 10},
		{false, "nobody", 100, 0},
		{true, "", 20, 20},   // stops at its bound
		{false, "p-2", 6, 6}, // exactly the bound
		{false, "p-2", 5, 5},
	} {
		n, err := b.st.CountDeadLetters(b.ctx, b.pool, c.all, c.participant, c.max)
		if err != nil {
			t.Fatal(err)
		}
		if n != c.want {
			t.Errorf("CountDeadLetters(all=%v, participant=%q, max=%d) = %d, want %d", c.all, c.participant, c.max, n, c.want)
		}
	}
}
