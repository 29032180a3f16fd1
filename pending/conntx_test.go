package pending_test

import (
	"testing"

	"github.com/ledgerline/outbox/pending"
)

// TestBatchOnAConnInsideItsCallersTransaction: a batch enqueued on a
// *pgx.Conn (or a pool's connection) inside a transaction the caller
// began with a BEGIN statement, not through pgx, stays inside that
// transaction: rolled back with it, nothing is written, and a refused
// batch leaves the transaction open and usable. The batch's savepoint was
// pgx's Begin, which on such a connection sends BEGIN (PostgreSQL only
// warns) and then COMMIT: the caller's transaction, business rows and
// instructions, committed halfway through, and the caller's ROLLBACK
// undid nothing: instructions the caller had abandoned would be paid.
func TestBatchOnAConnInsideItsCallersTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.pool.Exec(b.ctx, `CREATE TABLE payouts (id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.producer.Enqueue(b.ctx, b.pool, payout("p0", "k0")); err != nil {
		t.Fatal(err)
	}
	pc, err := b.pool.Acquire(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Release()
	for name, db := range map[string]pending.DBTX{"pgx.Conn": pc.Conn(), "pgxpool.Conn": pc} {
		exec := func(sql string) {
			t.Helper()
			if _, err := pc.Exec(b.ctx, sql); err != nil {
				t.Fatalf("%s: %s: %v", name, sql, err)
			}
		}
		exec(`BEGIN`)
		exec(`INSERT INTO payouts VALUES ('` + name + `')`)
		bad := payout("p0", "k0")
		bad.AmountMinor = 1
		// Refused by the database (k0 has another payload): the caller's
		// transaction is still open, its row in it.
		if _, err := b.producer.EnqueueBatch(b.ctx, db, []pending.Instruction{payout("p1", "kx-"+name), bad}); err == nil {
			t.Fatalf("%s: a batch with a mismatch was enqueued", name)
		}
		if tx := pc.Conn().PgConn().TxStatus(); tx != 'T' {
			t.Errorf("%s: after a refused batch the connection's transaction status is %q, want still in the caller's transaction", name, tx)
		}
		if _, err := b.producer.EnqueueBatch(b.ctx, db, []pending.Instruction{payout("p1", "k1-"+name), payout("p2", "k2-"+name)}); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if tx := pc.Conn().PgConn().TxStatus(); tx != 'T' {
			t.Errorf("%s: after the batch the connection's transaction status is %q, want still in the caller's transaction", name, tx)
		}
		exec(`ROLLBACK`) // the caller abandons the payout
	}
	var payouts int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM payouts`).Scan(&payouts); err != nil {
		t.Fatal(err)
	}
	if c := b.counts(t); c != (tableCounts{keys: 1, pending: 1, sequences: 1}) || payouts != 0 {
		t.Fatalf("counts %+v, %d payouts after the caller rolled back: its transaction was committed under it", c, payouts)
	}
}
