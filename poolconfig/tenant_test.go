package poolconfig_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/internal/pglocal"
	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/migrations"
	"github.com/ledgerline/outbox/pending"
	"github.com/ledgerline/outbox/poolconfig"
)

// TestTenantBehindATransactionPooler: behind PgBouncer in transaction
// mode, outbox.tenant set per connection (pgx's AfterConnect with
// set_config(..., false), which docs/audit.md used to offer beside per
// transaction) stays on the server session that ran it, and the next
// client whose transaction lands there reads as that tenant: a reader
// scoped to tenant A read tenant B's keys. Set per transaction
// (set_config(..., true)) it holds for that transaction only. The test
// shows both on a real PgBouncer with one server connection, the
// deterministic form of any pool under load.
func TestTenantBehindATransactionPooler(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	viaBouncer := setupTenants(t).behindPgBouncer(t, migrations.RoleAuditor)
	connect := func(afterConnect func(context.Context, *pgx.Conn) error) *pgxpool.Pool {
		return poolThrough(t, viaBouncer, migrations.RoleAuditor, afterConnect)
	}
	tenantsSeen := func(q querier) []string { return keysSeen(t, q) }

	// Per connection: the last client to connect chose the tenant of the
	// one server session, for everyone.
	perConnection := func(tenant string) *pgxpool.Pool { return connect(setTenant(tenant)) }
	readerA := perConnection("tenant-a")
	if got := tenantsSeen(readerA); !slices.Equal(got, []string{"tenant-a"}) {
		t.Fatalf("reader A alone sees the keys of %v", got)
	}
	if err := perConnection("tenant-b").Ping(ctx); err != nil {
		t.Fatal(err)
	}
	leaked := tenantsSeen(readerA)
	t.Logf("per connection, reader A then sees the keys of %v", leaked)
	if !slices.Equal(leaked, []string{"tenant-b"}) {
		t.Fatalf("reader A saw the keys of %v after reader B connected; this test expects the leak PgBouncer causes", leaked)
	}

	// Per transaction: each transaction reads its own tenant, and leaves
	// nothing behind on the server session.
	perTx := connect(nil)
	// Clear what the per-connection readers left on the server session.
	if _, err := perTx.Exec(ctx, "SELECT set_config($1, '', false)", migrations.TenantSetting); err != nil {
		t.Fatal(err)
	}
	for _, tenant := range []string{"tenant-a", "tenant-b"} {
		var got []string
		if err := pgx.BeginFunc(ctx, perTx, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SELECT set_config($1, $2, true)", migrations.TenantSetting, tenant); err != nil {
				return err
			}
			got = tenantsSeen(tx)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, []string{tenant}) {
			t.Errorf("a transaction of %s sees the keys of %v", tenant, got)
		}
	}
	if got := tenantsSeen(perTx); len(got) != 0 {
		t.Errorf("after the transactions, a statement without a tenant sees the keys of %v", got)
	}
}

// TestBoundTenantBehindATransactionPooler: a login role bound to its
// tenants (migration 035) is held to them behind PgBouncer in transaction
// mode too, whatever outbox.tenant the server session it lands on was
// left with: the binding follows the login, which PgBouncer pools by.
func TestBoundTenantBehindATransactionPooler(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	tb := setupTenants(t)
	admin := tb.admin
	role := fmt.Sprintf("bound_reader_%x", rand.Uint64())
	if _, err := admin.Exec(ctx, fmt.Sprintf("CREATE ROLE %s LOGIN IN ROLE %s", role, migrations.RoleAuditor)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP ROLE IF EXISTS "+role) })
	if _, err := admin.Exec(ctx, `INSERT INTO outbox.tenant_bindings (role_name, tenant_id) VALUES ($1, 'tenant-a')`, role); err != nil {
		t.Fatal(err)
	}
	viaBouncer := tb.behindPgBouncer(t, role)
	// Each pool sets the tenant per connection, on the one server session.
	connect := func(tenant string) *pgxpool.Pool { return poolThrough(t, viaBouncer, role, setTenant(tenant)) }
	seen := func(db *pgxpool.Pool) []string { return keysSeen(t, db) }
	readerA := connect("tenant-a")
	if got := seen(readerA); !slices.Equal(got, []string{"tenant-a"}) {
		t.Fatalf("bound reader, setting A, sees the keys of %v", got)
	}
	// Another client of the same login leaves '*' on the server session:
	// the binding still keeps reader A (and itself) to tenant A.
	all := connect("*")
	if got := seen(all); !slices.Equal(got, []string{"tenant-a"}) {
		t.Errorf("bound reader, setting *, sees the keys of %v", got)
	}
	if got := seen(readerA); !slices.Equal(got, []string{"tenant-a"}) {
		t.Errorf("bound reader A, after another client set *, sees the keys of %v", got)
	}
	if got := seen(connect("tenant-b")); len(got) != 0 {
		t.Errorf("bound reader, setting B, sees the keys of %v", got)
	}
}

// tenantsBundle is a database of the local cluster with the roles in
// place and one instruction each of tenant-a and tenant-b.
type tenantsBundle struct {
	cluster *pglocal.Cluster
	url     string
	admin   *pgxpool.Pool
}

// setupTenants makes one, or skips the test when the tests run against
// OUTBOX_TEST_DATABASE_URL (no local cluster to put PgBouncer in front of).
func setupTenants(t *testing.T) *tenantsBundle {
	t.Helper()
	cluster := testdb.Cluster(t)
	if cluster == nil {
		t.Skip("tests run against OUTBOX_TEST_DATABASE_URL: no local cluster to put PgBouncer in front of")
	}
	ctx := t.Context()
	dbURL := testdb.URL(t)
	admin, err := pgxpool.New(ctx, testdb.AsAdmin(t, dbURL))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	if err := migrations.CreateRoles(ctx, admin, ""); err != nil {
		t.Fatal(err)
	}
	for _, tenant := range []string{"tenant-a", "tenant-b"} {
		if _, err := pending.Enqueue(ctx, admin, pending.Instruction{InstructionID: "i-" + tenant, ParticipantID: "p-" + tenant,
			IdempotencyKey: "k-" + tenant, TenantID: tenant, RailType: "sandbox", AmountMinor: 100, Currency: "USD",
			Destination: "acct-1"}); err != nil {
			t.Fatal(err)
		}
	}
	return &tenantsBundle{cluster: cluster, url: dbURL, admin: admin}
}

// behindPgBouncer starts PgBouncer in transaction mode with one server
// connection for user, the deterministic form of any pool under load, and
// returns the database's URL through it.
func (tb *tenantsBundle) behindPgBouncer(t *testing.T, user string) string {
	t.Helper()
	bouncer, err := pglocal.StartPgBouncer(t.Context(), tb.cluster, pglocal.PgBouncerOptions{Users: []string{user}, PoolSize: 1})
	if errors.Is(err, pglocal.ErrNoPgBouncer) && os.Getenv("OUTBOX_REQUIRE_PGBOUNCER") == "" {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(bouncer.Stop)
	viaBouncer, err := bouncer.Rewrite(tb.url)
	if err != nil {
		t.Fatal(err)
	}
	return viaBouncer
}

// poolThrough opens a pool through PgBouncer (viaBouncer) as user, set up
// as an operator's pool behind a transaction pooler, with afterConnect
// run on each new connection.
func poolThrough(t *testing.T, viaBouncer, user string, afterConnect func(context.Context, *pgx.Conn) error) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(viaBouncer)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User, cfg.ConnConfig.Password = user, ""
	s := poolconfig.Operator("audit")
	s.Pooler = poolconfig.PoolerTransaction
	s.ApplyPool(cfg)
	cfg.AfterConnect = afterConnect
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// setTenant sets outbox.tenant for the session (per connection: what a
// transaction pooler leaks to the next client).
func setTenant(tenant string) func(context.Context, *pgx.Conn) error {
	return func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, "SELECT set_config($1, $2, false)", migrations.TenantSetting, tenant)
		return err
	}
}

// querier is a pool, a connection or a transaction.
type querier interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}

// keysSeen is the tenants of the idempotency keys q reads, in order.
func keysSeen(t *testing.T, q querier) []string {
	t.Helper()
	rows, err := q.Query(t.Context(), `SELECT tenant_id FROM outbox.idempotency_keys ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return got
}
