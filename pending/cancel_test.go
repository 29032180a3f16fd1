package pending_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ledgerline/outbox/pending"
)

// TestEnqueueCancelledMidStatementWritesNothing: a caller's context that
// ends while an enqueue waits in the database (here for the participant's
// sequence row, which another transaction holds) fails the enqueue with
// the context's error, and the caller's transaction, its own business
// row included, can no longer commit: pgx closes the connection of a
// statement it gives up on, and nothing of the enqueue is half-written.
func TestEnqueueCancelledMidStatementWritesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.pool.Exec(b.ctx, `CREATE TABLE payouts (id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{1, 2} {
		hold, err := b.pool.Begin(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.producer.Enqueue(b.ctx, hold, payout("p1", fmt.Sprintf("held-%d", n))); err != nil {
			t.Fatal(err)
		}
		tx, err := b.pool.Begin(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(b.ctx, `INSERT INTO payouts VALUES ($1)`, fmt.Sprint(n)); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(b.ctx, 300*time.Millisecond)
		ins := []pending.Instruction{payout("p1", fmt.Sprintf("c%d-1", n)), payout("p2", fmt.Sprintf("c%d-2", n))}[:n]
		_, err = b.producer.EnqueueBatch(ctx, tx, ins)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("batch of %d: %v, want the context's error", n, err)
		}
		if err := tx.Commit(b.ctx); err == nil {
			t.Errorf("batch of %d: the caller's transaction committed after its enqueue was cut off", n)
		}
		_ = hold.Rollback(b.ctx)
	}
	var payouts int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM payouts`).Scan(&payouts); err != nil {
		t.Fatal(err)
	}
	if c := b.counts(t); c != (tableCounts{}) || payouts != 0 {
		t.Fatalf("counts %+v, %d payouts: a cut-off enqueue's transaction wrote something", c, payouts)
	}
}
