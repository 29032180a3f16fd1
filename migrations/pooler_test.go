package migrations_test

import (
	"errors"
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/internal/pglocal"
	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/migrations"
)

// TestMigrateRefusesATransactionPooler: MigrateWith keeps a session
// advisory lock across the migrations' transactions, which a transaction
// pooler (PgBouncer pool_mode = transaction) cannot keep: the lock stays
// on whichever pooled server session took it, and the migrations after it
// run on others. Before the fix only `outbox migrate`'s --pooler flag
// refused it; a program's MigrateWith, or migrate given the pooler's URL
// without the flag, migrated through it and left the lock on a pooled
// session, where every later migration waited for it. MigrateWith must
// see it (the session it talks to changes from one statement to the
// next) and refuse with ErrTransactionPooler, writing nothing and leaving
// no lock; through a session pooler, where the session stays its own, it
// migrates.
func TestMigrateRefusesATransactionPooler(t *testing.T) {
	t.Parallel()
	cluster, direct := testdb.OwnCluster(t)
	bouncer := func(mode string) *pgxpool.Pool {
		b, err := pglocal.StartPgBouncer(t.Context(), cluster, pglocal.PgBouncerOptions{PoolMode: mode, PoolSize: 4})
		if errors.Is(err, pglocal.ErrNoPgBouncer) && os.Getenv("OUTBOX_REQUIRE_PGBOUNCER") == "" {
			t.Skip(err)
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(b.Stop)
		cfg, err := pgxpool.ParseConfig(b.ConnString("postgres", "postgres"))
		if err != nil {
			t.Fatal(err)
		}
		// pgx's default, prepared statements: what migrate uses without
		// --pooler transaction, the case to see.
		pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		return pool
	}
	ctx := t.Context()

	err := migrations.MigrateWith(ctx, bouncer("transaction"), migrations.Options{Schema: "via_transactions"})
	if !errors.Is(err, migrations.ErrTransactionPooler) {
		t.Fatalf("MigrateWith through PgBouncer in transaction mode: %v, want ErrTransactionPooler", err)
	}
	var schema bool
	var locks int
	if err := direct.QueryRow(ctx, `SELECT to_regnamespace('via_transactions') IS NOT NULL,
		(SELECT count(*) FROM pg_locks WHERE locktype = 'advisory')`).Scan(&schema, &locks); err != nil {
		t.Fatal(err)
	}
	if schema || locks != 0 {
		t.Fatalf("after the refusal: schema created %v, %d advisory locks held: want neither", schema, locks)
	}

	if err := migrations.MigrateWith(ctx, bouncer("session"), migrations.Options{Schema: "via_sessions"}); err != nil {
		t.Fatalf("MigrateWith through PgBouncer in session mode: %v", err)
	}
	st, err := migrations.GetStatus(ctx, direct, "via_sessions")
	if err != nil || st.Current != st.Latest {
		t.Fatalf("status through a session pooler %+v, %v: want the latest", st, err)
	}
}
