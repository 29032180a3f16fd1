package store_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/internal/store"
)

// A checkpoint digests every archive row of its period in one statement
// (string_agg of their hashes, then sha256), and its period ran from the
// end of the last one to now. After hours without a checkpoint (every
// checkpoint refused while a long transaction ran anywhere in the
// cluster, or checkpointing left off), the next one had hours of rows to
// digest at once: past the relayers' 30 s statement timeout, or past
// PostgreSQL's 1 GB for one value (34 million rows: under five hours at
// 1,000 instructions/s), it failed, and every later attempt started at
// the same place with a longer period, so no checkpoint was ever taken
// again and no month could be detached. Since migration 043 a checkpoint
// digests at most outbox.checkpoint_max_rows rows (1,000,000 by default;
// four here) unless it lasts a millisecond, also when that makes it
// shorter than its minimum period, and a backlog is closed in steps.
func TestCheckpointAfterAGapIsTakenInSteps(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	// The last checkpoint (here: the start of the chain) was three hours
	// ago; fifteen rows have been archived since.
	if _, err := b.pool.Exec(b.ctx, `UPDATE outbox.settings SET chained_since = clock_timestamp() - interval '3 hours'`); err != nil {
		t.Fatal(err)
	}
	b.history(t)
	time.Sleep(2 * time.Millisecond)
	cfg := b.pool.Config()
	cfg.ConnConfig.RuntimeParams["outbox.checkpoint_max_rows"] = "4"
	capped, err := pgxpool.NewWithConfig(b.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer capped.Close()

	var cps []store.Checkpoint
	for tail := false; !tail; {
		cp, more, err := b.st.TakeCheckpointStep(b.ctx, capped, time.Millisecond, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if cp != nil && !more && len(cps) < 3 {
			t.Errorf("checkpoint %d of a backlog of fifteen rows says it is not cut short", len(cps)+1)
		}
		if cp == nil {
			// Caught up but for a tail shorter than the minimum period:
			// taken as audit checkpoint takes it.
			tail = true
			if cp, err = b.st.TakeCheckpoint(b.ctx, capped, time.Millisecond, 0); err != nil || cp == nil {
				t.Fatalf("tail checkpoint %v, %v", cp, err)
			}
		}
		if cp.Rows > 4 && cp.PeriodEnd.Sub(cp.PeriodStart) > time.Millisecond {
			t.Errorf("checkpoint %s to %s digests %d rows at once, want at most outbox.checkpoint_max_rows = 4",
				cp.PeriodStart, cp.PeriodEnd, cp.Rows)
		}
		cps = append(cps, *cp)
		if len(cps) > 60 {
			t.Fatal("more than 60 checkpoints for fifteen rows")
		}
	}
	if len(cps) < 4 {
		t.Errorf("%d checkpoints for fifteen rows, want at least four of at most four rows", len(cps))
	}
	var rows int64
	for i, c := range cps {
		rows += c.Rows
		if i > 0 && !c.PeriodStart.Equal(cps[i-1].PeriodEnd) {
			t.Errorf("checkpoint %d starts at %s, the one before ends at %s", i, c.PeriodStart, cps[i-1].PeriodEnd)
		}
	}
	if rows != 15 {
		t.Errorf("the checkpoints digest %d rows, want the history's 15", rows)
	}
	var behind time.Duration
	if err := b.pool.QueryRow(b.ctx, `SELECT clock_timestamp() - max(period_end) FROM outbox.checkpoints`).Scan(&behind); err != nil || behind > 5*time.Second {
		t.Errorf("the checkpoints end %s ago (%v) once caught up, want up to now", behind, err)
	}
	for _, v := range b.verifyTampered(t, cps) {
		t.Errorf("verify: %s", v)
	}
}
