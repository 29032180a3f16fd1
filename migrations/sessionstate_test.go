package migrations_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/migrations"
)

// TestMigrateLockTimeoutHoldsForEveryMigration: Options.LockTimeout bounds
// the lock wait of every migration statement, not only the first
// migration's. tern resets every session setting (RESET ALL) after each
// migration, which took the lock timeout MigrateWith had set for the
// session back to the server's default (none): on a program's pool
// without a lock_timeout of its own, the second migration of a run waited
// for a lock for as long as its holder kept it. Before the fix migration
// 021 (an index on pending) waited behind an open transaction on pending
// until the test's deadline instead of failing with 55P03 within the lock
// timeout. MigrateWith must also leave the caller's pool as it was: no
// session setting of the caller's connections is reset.
func TestMigrateLockTimeoutHoldsForEveryMigration(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const schema = "lock_each"
	if err := migrations.MigrateWith(b.ctx, b.pool, migrations.Options{Schema: schema, TargetVersion: 19}); err != nil {
		t.Fatal(err)
	}
	// A transaction holding pending's ROW EXCLUSIVE lock (as a producer's
	// enqueue does until it commits): 020 does not need it, 021's index
	// build does.
	holder, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(context.Background())
	if _, err := holder.Exec(b.ctx, "LOCK TABLE "+schema+".pending IN ROW EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}

	// The caller's pool: one connection with a session setting of its own
	// (set after connecting, as an AfterConnect hook does).
	cfg, err := pgxpool.ParseConfig(b.url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, "SET application_name = 'payments-api'")
		return err
	}
	pool, err := pgxpool.NewWithConfig(b.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	ctx, cancel := context.WithTimeout(b.ctx, 20*time.Second)
	defer cancel()
	start := time.Now()
	err = migrations.MigrateWith(ctx, pool, migrations.Options{Schema: schema, TargetVersion: 21, LockTimeout: 500 * time.Millisecond})
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "55P03" {
		t.Fatalf("MigrateWith behind a held lock after %s: %v, want a lock timeout (55P03)", time.Since(start).Round(time.Millisecond), err)
	}
	st, err := migrations.GetStatus(b.ctx, b.pool, schema)
	if err != nil || st.Current != 20 {
		t.Fatalf("status %+v, %v: want 020 applied and 021 not", st, err)
	}
	var name string
	if err := pool.QueryRow(b.ctx, "SELECT current_setting('application_name')").Scan(&name); err != nil || name != "payments-api" {
		t.Fatalf("the caller's connection has application_name %q (%v) after MigrateWith, want its own %q", name, err, "payments-api")
	}
}
