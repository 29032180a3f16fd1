package store_test

import (
	"testing"

	"github.com/ledgerline/outbox/internal/store"
)

// TestVerifyWorkersShareOneSnapshot: a transaction that imports the first
// one's snapshot does not see what committed after it was taken, so a
// verify whose checks run on several connections reports one instant.
func TestVerifyWorkersShareOneSnapshot(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	b.enqueue(t, "p1", "k1")
	first, err := store.BeginVerify(b.ctx, b.pool, "")
	if err != nil {
		t.Fatal(err)
	}
	defer first.Rollback(b.ctx)
	var snapshot string
	if err := first.QueryRow(b.ctx, `SELECT pg_export_snapshot()`).Scan(&snapshot); err != nil {
		t.Fatal(err)
	}
	b.enqueue(t, "p1", "k2") // commits after the snapshot
	worker, err := store.BeginVerify(b.ctx, b.pool, snapshot)
	if err != nil {
		t.Fatal(err)
	}
	defer worker.Rollback(b.ctx)
	var seen, now int
	if err := worker.QueryRow(b.ctx, `SELECT count(*) FROM outbox.pending`).Scan(&seen); err != nil {
		t.Fatal(err)
	}
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox.pending`).Scan(&now); err != nil {
		t.Fatal(err)
	}
	if seen != 1 || now != 2 {
		t.Fatalf("the worker sees %d pending instructions, the database %d; want 1 (the snapshot's) and 2", seen, now)
	}
	if _, err := store.BeginVerify(b.ctx, b.pool, "00000003-0000001B-1'; DROP TABLE outbox.pending; --"); err == nil {
		t.Fatal("a snapshot id that is not one was taken")
	}
}
