package store_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/ledgerline/outbox/internal/store"
)

// TestSnapshotTellsTheArchivesUpkeep: the snapshot says how long ago the
// last checkpoint ended, how many months from this one on have their
// partition, and how many rows the default partition holds, so that an
// operator learns that upkeep stopped before verify can no longer see a
// deletion or a month is stuck in the default partition.
func TestSnapshotTellsTheArchivesUpkeep(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	health := func() store.ArchiveHealth {
		t.Helper()
		snap, err := b.st.Snapshot(b.ctx, b.pool)
		if err != nil {
			t.Fatal(err)
		}
		return snap.Archive
	}
	if h := health(); h.CheckpointAgeSecs != nil || h.MonthsReady != 4 || h.DefaultRows != 0 {
		t.Fatalf("a new schema: %+v (checkpoint age %v), want no checkpoint, 4 months ready, no default rows", h, h.CheckpointAgeSecs)
	}

	b.enqueue(t, "p1", "k1")
	b.record(t, recordOutcome(t, b.claimOne(t, "r1", longLease), "r1", store.Dispatched))
	b.checkpoint(t)
	if h := health(); h.CheckpointAgeSecs == nil || *h.CheckpointAgeSecs < 0 || *h.CheckpointAgeSecs > 60 {
		t.Fatalf("after a checkpoint: checkpoint age %v", h.CheckpointAgeSecs)
	}

	month := func(ahead int) string {
		var name string
		if err := b.pool.QueryRow(b.ctx, `SELECT 'attempts_' || to_char(date_trunc('month', now() AT TIME ZONE 'UTC') + make_interval(months => $1), 'YYYY_MM')`,
			ahead).Scan(&name); err != nil {
			t.Fatal(err)
		}
		return name
	}
	b.execAll(t, fmt.Sprintf(`ALTER TABLE outbox.attempts DETACH PARTITION outbox.%s`, month(2)))
	if h := health(); h.MonthsReady != 2 {
		t.Fatalf("the month after next detached: %d months ready, want 2", h.MonthsReady)
	}
	b.execAll(t, fmt.Sprintf(`ALTER TABLE outbox.attempts DETACH PARTITION outbox.%s`, month(0)))
	if h := health(); h.MonthsReady != 0 {
		t.Fatalf("this month detached: %d months ready, want 0", h.MonthsReady)
	}
	// This month's rows now go to the default partition.
	b.enqueue(t, "p2", "k2")
	b.record(t, recordOutcome(t, b.claimOne(t, "r1", longLease), "r1", store.Dispatched))
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if h := health(); h.DefaultRows >= 2 { // the claim's row and the outcome's
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rows in the default partition never counted: %+v", health())
		}
	}
}

// TestSnapshotCountsMonthsMadeFarAhead: with every month of the two years
// upkeep may make ahead, and one more made by hand, the count says all of
// them (26) rather than failing the snapshot (and with it every gauge of
// the scrape) on the look-up's empty answer.
func TestSnapshotCountsMonthsMadeFarAhead(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	if err := b.st.EnsurePartitions(b.ctx, b.pool, 24); err != nil {
		t.Fatal(err)
	}
	b.execAll(t, `DO $$ DECLARE m date := (date_trunc('month', now() AT TIME ZONE 'UTC') + interval '25 months')::date; BEGIN
		EXECUTE format('CREATE TABLE outbox.%I PARTITION OF outbox.attempts FOR VALUES FROM (%L) TO (%L)',
			'attempts_' || to_char(m, 'YYYY_MM'), m::text || ' 00:00:00+00', (m + interval '1 month')::date::text || ' 00:00:00+00');
	END $$`)
	snap, err := b.st.Snapshot(b.ctx, b.pool)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Archive.MonthsReady != 26 {
		t.Fatalf("%d months ready, want 26", snap.Archive.MonthsReady)
	}
}
