package store_test

import (
	"bytes"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"

	"github.com/ledgerline/outbox/internal/store"
)

// TestListQueuedByParticipantReadsItsRows: the console lists a
// participant's instructions (and its view refreshes every 5 s). Those
// pages read the participant's rows through its index, on custom and
// generic plans, also when pending's statistics are those of the vacuumed
// empty table (0 rows on its pages), as after a drained queue was
// vacuumed before a backlog arrived.
func TestListQueuedByParticipantReadsItsRows(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	statisticsOfEmpty(t, b.pool, "pending")
	for _, q := range []string{`
INSERT INTO outbox.pending (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
                            payload, attempt_count, next_attempt_at, created_at)
SELECT gen_random_uuid(), 'i-' || g, CASE WHEN g % 400 = 0 THEN 'p1' ELSE 'other-' || (g % 500) END, g, 'k-' || g, 'sandbox', '{}', 0,
       CASE WHEN g <= 500 THEN now() ELSE 'infinity' END, now() - g * interval '1 second'
FROM generate_series(1, 20000) AS g`,
	} {
		if _, err := b.pool.Exec(b.ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	wantStatisticsOfEmpty(t, b.pool, "pending")
	const mine, limit = 50, 20 // p1 has 50 rows, listed in pages of 20
	conn := b.conn(t)
	for round, plans := range []string{"force_custom_plan", "force_generic_plan", "auto", "auto", "auto", "auto", "auto", "auto", "auto"} {
		tx, err := conn.Begin(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(b.ctx, `SELECT set_config('plan_cache_mode', $1, true)`, plans); err != nil {
			t.Fatal(err)
		}
		before := readsOf(t, tx, "outbox.pending")
		var listed int
		for after := (store.Cursor{}); ; {
			items, err := b.st.ListQueued(b.ctx, tx, store.QueuedFilter{Participant: "p1", After: after, Limit: limit})
			if err != nil {
				t.Fatal(err)
			}
			for _, q := range items {
				if q.ParticipantID != "p1" {
					t.Fatalf("listed %s's instruction", q.ParticipantID)
				}
			}
			listed += len(items)
			if len(items) < limit {
				break
			}
			after = store.Cursor{At: items[len(items)-1].EnqueuedAt, ID: items[len(items)-1].OutboxID}
		}
		reads := readsOf(t, tx, "outbox.pending")
		tx.Rollback(b.ctx)
		if listed != mine {
			t.Fatalf("round %d: listed %d of p1's %d instructions", round, listed, mine)
		}
		// Three pages, each reading p1's rows at most.
		if n := reads[0].seqTuples - before[0].seqTuples; n > 0 {
			t.Errorf("round %d (%s plans): sequential scans read %d rows of pending", round, plans, n)
		}
		if n := reads[0].indexEntries - before[0].indexEntries; n > 3*mine {
			t.Errorf("round %d (%s plans): pending's indexes returned %d entries for three pages of p1's %d instructions",
				round, plans, n, mine)
		}
	}
}

// TestListQueuedReadsItsPage: the console's instruction list, unfiltered,
// pages through the whole queue, also during a backlog. Each page reads
// its rows through the primary key (outbox ids are UUIDv7: enqueue order),
// never the queue, on custom and generic plans, with pending analyzed or
// with the vacuumed empty table's statistics; the pages together are the
// queue in enqueue order, each instruction once.
func TestListQueuedReadsItsPage(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	statisticsOfEmpty(t, b.pool, "pending")
	// Enqueued through the producer, one after the other: their order.
	var enqueued []uuid.UUID
	for i := range 5 {
		enqueued = append(enqueued, b.enqueue(t, fmt.Sprintf("p%d", i%2), fmt.Sprintf("k%d", i)))
		time.Sleep(2 * time.Millisecond)
	}
	if _, err := b.pool.Exec(b.ctx, otherBacklogSQL); err != nil {
		t.Fatal(err)
	}
	wantStatisticsOfEmpty(t, b.pool, "pending")
	const limit = 500
	conn := b.conn(t)
	for round, plans := range []string{"force_custom_plan", "force_generic_plan", "auto", "auto", "auto", "auto", "auto", "auto", "analyze", "auto"} {
		if plans == "analyze" {
			if _, err := b.pool.Exec(b.ctx, `ANALYZE outbox.pending`); err != nil {
				t.Fatal(err)
			}
			plans = "auto"
		}
		tx, err := conn.Begin(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(b.ctx, `SELECT set_config('plan_cache_mode', $1, true)`, plans); err != nil {
			t.Fatal(err)
		}
		var (
			listed []uuid.UUID
			after  store.Cursor
		)
		for page := 0; ; page++ {
			before := readsOf(t, tx, "outbox.pending")
			items, err := b.st.ListQueued(b.ctx, tx, store.QueuedFilter{After: after, Limit: limit})
			if err != nil {
				t.Fatal(err)
			}
			reads := readsOf(t, tx, "outbox.pending")
			if n := reads[0].seqTuples - before[0].seqTuples; n > 0 {
				t.Fatalf("round %d (%s plans), page %d: sequential scans read %d rows of pending", round, plans, page, n)
			}
			if n := reads[0].indexEntries - before[0].indexEntries; n > limit+1 {
				t.Fatalf("round %d (%s plans), page %d: pending's indexes returned %d entries for a page of %d",
					round, plans, page, n, limit)
			}
			for _, q := range items {
				listed = append(listed, q.OutboxID)
			}
			if len(items) < limit {
				break
			}
			after = store.Cursor{ID: items[len(items)-1].OutboxID}
		}
		tx.Rollback(b.ctx)
		if len(listed) != 20005 {
			t.Fatalf("round %d: the pages listed %d instructions, want 20,005", round, len(listed))
		}
		if !slices.IsSortedFunc(listed, func(a, b uuid.UUID) int { return bytes.Compare(a[:], b[:]) }) ||
			len(slices.Compact(slices.Clone(listed))) != len(listed) {
			t.Fatalf("round %d: the pages are not in outbox id order, each once", round)
		}
		if !slices.Equal(listed[:5], enqueued) {
			t.Fatalf("round %d: first listed %v, want the instructions in the order they were enqueued %v", round, listed[:5], enqueued)
		}
	}
}
