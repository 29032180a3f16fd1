package store_test

import (
	"testing"

	"github.com/ledgerline/outbox/internal/store"
)

// TestParticipantDeadLettersReadTheirRows: after a rail outage, tens of
// thousands of dead letters, and acknowledged ones stay until their month
// is detached. A participant's dead letters (the participant page's count,
// its list, open or all, and the list's count) were found through the
// index by failure time, filtered by participant: every view of one
// participant read every dead letter before its own. They are read
// through an index by participant: its own rows, and one past the page.
// (The participant page's count of its open dead letters, in
// Participant's own transaction, is the count measured here.)
func TestParticipantDeadLettersReadTheirRows(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	// 20,000 dead letters of 500 other participants, the oldest 18,000
	// acknowledged; then the participant's three, the middle one open.
	if _, err := b.pool.Exec(b.ctx, `
INSERT INTO outbox.dead_letters (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
                                 payload, attempt_count, error_code, attempt_id, created_at, failed_at, acknowledged_at)
SELECT gen_random_uuid(), 'i-' || g, CASE WHEN g > 20000 THEN 'solo' ELSE 'p-' || (g % 500) END, g, 'k-' || g, 'sandbox', '{}', 1,
       'RAIL_REJECTED', gen_random_uuid(), now() - interval '1 day', now() - interval '1 day' + g * interval '1 second',
       CASE WHEN g <= 18000 OR g IN (20001, 20003) THEN now() END
FROM generate_series(1, 20003) AS g`); err != nil {
		t.Fatal(err)
	}
	const own, ownOpen = 3, 1
	for _, analyzed := range []bool{false, true} {
		if analyzed {
			if _, err := b.pool.Exec(b.ctx, `ANALYZE outbox.dead_letters`); err != nil {
				t.Fatal(err)
			}
		}
		for _, plans := range []string{"force_custom_plan", "force_generic_plan"} {
			tx, err := b.pool.Begin(b.ctx)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { tx.Rollback(b.ctx) })
			if _, err := tx.Exec(b.ctx, `SELECT set_config('plan_cache_mode', $1, true)`, plans); err != nil {
				t.Fatal(err)
			}
			measure := func(what string, want, got int64, read func() (int64, error)) {
				t.Helper()
				before := readsOf(t, tx, "outbox.dead_letters")[0]
				n, err := read()
				if err != nil {
					t.Fatal(err)
				}
				reads := readsOf(t, tx, "outbox.dead_letters")[0]
				if n != want {
					t.Errorf("%s: %d, want %d", what, n, want)
				}
				if s := reads.seqTuples - before.seqTuples; s > 0 {
					t.Errorf("%s (%s plans, statistics %v): %d rows read by sequential scans of dead_letters", what, plans, analyzed, s)
				}
				if e := reads.indexEntries - before.indexEntries; e > got {
					t.Errorf("%s (%s plans, statistics %v): %d index entries read, want at most %d (the participant's)", what, plans, analyzed, e, got)
				}
			}
			for _, all := range []bool{false, true} {
				want := int64(ownOpen)
				if all {
					want = own
				}
				measure("list", want, own+1, func() (int64, error) {
					items, err := b.st.DeadLettersOf(b.ctx, tx, all, "solo", store.Cursor{}, 50)
					return int64(len(items)), err
				})
				measure("count", want, own+1, func() (int64, error) {
					return b.st.CountDeadLetters(b.ctx, tx, all, "solo", 10_000)
				})
			}
			tx.Rollback(b.ctx)
		}
	}
}
