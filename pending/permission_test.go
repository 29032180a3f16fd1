package pending_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/pending"
)

// TestEnqueueWithoutGrantsIsTyped: an enqueue by a role the outbox's
// tables are not granted to (not a member of outbox_producer) is refused
// by the database (42501), and comes back as pending.ErrPermissionDenied,
// the database's error in it, for one instruction and for a batch. It was
// the database's untyped error.
func TestEnqueueWithoutGrantsIsTyped(t *testing.T) {
	t.Parallel()
	b := setup(t)
	adminCfg, err := pgx.ParseConfig(testdb.AdminURL(t))
	if err != nil {
		t.Fatal(err)
	}
	adminPool := b.pool.Config().Copy()
	adminPool.ConnConfig.User, adminPool.ConnConfig.Password = adminCfg.User, adminCfg.Password
	admin, err := pgxpool.NewWithConfig(b.ctx, adminPool)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	// Roles are cluster-wide: a fresh name, dropped after the test.
	role := fmt.Sprintf("nogrants_%x", rand.Uint64())
	if _, err := admin.Exec(b.ctx, "CREATE ROLE "+role+" LOGIN"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		pool, err := pgxpool.NewWithConfig(context.Background(), adminPool.Copy())
		if err == nil {
			defer pool.Close()
			_, err = pool.Exec(context.Background(), "DROP ROLE IF EXISTS "+role)
		}
		if err != nil {
			t.Errorf("dropping %s: %v", role, err)
		}
	})
	cfg := b.pool.Config().Copy()
	cfg.ConnConfig.User, cfg.ConnConfig.Password = role, ""
	noGrants, err := pgxpool.NewWithConfig(b.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer noGrants.Close()

	var pgErr *pgconn.PgError
	if _, err := b.producer.Enqueue(b.ctx, noGrants, payout("p1", "ng-1")); !errors.Is(err, pending.ErrPermissionDenied) ||
		!errors.As(err, &pgErr) || pgErr.Code != "42501" {
		t.Errorf("Enqueue without grants: %v, want pending.ErrPermissionDenied with the database's 42501 in it", err)
	}
	ins := []pending.Instruction{payout("p1", "ng-2"), payout("p2", "ng-3")}
	if _, err := b.producer.EnqueueBatch(b.ctx, noGrants, ins); !errors.Is(err, pending.ErrPermissionDenied) {
		t.Errorf("EnqueueBatch without grants: %v, want pending.ErrPermissionDenied", err)
	}
	// In the caller's transaction, a batch's refusal leaves it usable:
	// the producer's check of the schema's version, before the batch's
	// savepoint, must not be what the role is refused.
	tx, err := noGrants.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(b.ctx)
	fresh, err := pending.NewProducer(pending.Config{}) // it checks the schema again
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fresh.EnqueueBatch(b.ctx, tx, ins); !errors.Is(err, pending.ErrPermissionDenied) {
		t.Errorf("EnqueueBatch without grants, in a transaction: %v, want pending.ErrPermissionDenied", err)
	}
	var one int
	if err := tx.QueryRow(b.ctx, `SELECT 1`).Scan(&one); err != nil {
		t.Errorf("the transaction is unusable after a refused batch: %v", err)
	}
	if c := b.counts(t); c != (tableCounts{}) {
		t.Fatalf("counts %+v: a refused enqueue wrote something", c)
	}
}
