package pending_test

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/pending"
)

// TestEnqueueRefusedAsReadOnlyIsTyped: an enqueue the database refuses as
// read-only (a READ ONLY transaction, or a session that defaults to one,
// as on a standby a pool reached after a failover) is
// pending.ErrReadOnly, the database's error still in it, and writes
// nothing. It was an untyped database error, which a caller could tell
// from a refusal for good only by its SQLSTATE. A batch's savepoint keeps
// the caller's transaction usable; a single enqueue's refused statement
// aborts it, as any refused statement does.
func TestEnqueueRefusedAsReadOnlyIsTyped(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.pool.Config().Copy()
	cfg.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on"
	readOnly, err := pgxpool.NewWithConfig(b.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer readOnly.Close()
	for _, n := range []int{1, 2} {
		ins := []pending.Instruction{payout("p1", "ro-1"), payout("p2", "ro-2")}[:n]
		// A READ ONLY transaction of a writable pool.
		tx, err := b.pool.BeginTx(b.ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
		if err != nil {
			t.Fatal(err)
		}
		_, err = b.producer.EnqueueBatch(b.ctx, tx, ins)
		var pgErr *pgconn.PgError
		if !errors.Is(err, pending.ErrReadOnly) || !errors.As(err, &pgErr) || pgErr.Code != "25006" {
			t.Errorf("%d in a read-only transaction: %v, want pending.ErrReadOnly with the database's 25006 in it", n, err)
		}
		var one int
		usable := tx.QueryRow(b.ctx, `SELECT 1`).Scan(&one)
		if n > 1 && usable != nil {
			t.Errorf("batch of %d: the transaction is unusable after the refusal: %v", n, usable)
		}
		_ = tx.Rollback(b.ctx)
		// A pool whose sessions are read-only, outside a transaction.
		if _, err := b.producer.EnqueueBatch(b.ctx, readOnly, ins); !errors.Is(err, pending.ErrReadOnly) {
			t.Errorf("%d on a read-only pool: %v, want pending.ErrReadOnly", n, err)
		}
		if _, err := b.producer.Enqueue(b.ctx, readOnly, ins[0]); !errors.Is(err, pending.ErrReadOnly) {
			t.Errorf("Enqueue on a read-only pool: %v, want pending.ErrReadOnly", err)
		}
	}
	if c := b.counts(t); c != (tableCounts{}) {
		t.Fatalf("counts %+v: a refused enqueue wrote something", c)
	}
}
