package store_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ledgerline/outbox/internal/store"
)

// TestEnsurePartitionsReportsAMonthItCannotCreate: when the default
// partition holds rows of a month (written while no upkeep ran that far
// ahead), that month's partition cannot be created, and partition upkeep
// says so with ErrPartitionMissing naming it. It used to return nil (the
// function's warning reaches no log), so the month's rows went on into
// the default partition unseen, never to be detached, exported by month
// or have their keys retired.
func TestEnsurePartitionsReportsAMonthItCannotCreate(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	if err := b.st.EnsurePartitions(b.ctx, b.pool, 3); err != nil {
		t.Fatalf("upkeep of an empty archive: %v", err)
	}
	var start time.Time
	if err := b.pool.QueryRow(b.ctx, `SELECT (date_trunc('month', now() AT TIME ZONE 'UTC') + interval '2 months') AT TIME ZONE 'UTC'`).Scan(&start); err != nil {
		t.Fatal(err)
	}
	month := "attempts_" + start.UTC().Format("2006_01")
	execAll(t, b.pool, "DROP TABLE outbox."+month)
	if _, err := b.pool.Exec(b.ctx, `INSERT INTO outbox.attempts (outbox_id, instruction_id, participant_id, sequence_id,
		idempotency_key, rail_type, attempt_no, state, relayer_id, claimed_at, created_at)
		VALUES (gen_random_uuid(), 'ins-k1', 'p1', 1, 'k1', 'sandbox', 1, 'CANCELLED', 'op', $1::timestamptz + interval '1 day', $1::timestamptz + interval '1 day')`, start); err != nil {
		t.Fatal(err)
	}
	err := b.st.EnsurePartitions(b.ctx, b.pool, 3)
	if !errors.Is(err, store.ErrPartitionMissing) || !strings.Contains(err.Error(), month) {
		t.Fatalf("upkeep with %s's rows in the default partition: %v, want ErrPartitionMissing naming it", month, err)
	}
	var n int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pg_class WHERE relname = $1`, month).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%s created: %d, %v", month, n, err)
	}
}
