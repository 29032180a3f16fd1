package bench

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/migrations"
)

// TestConnectRolesLogsInAsTheRoles: with Config.Roles the relayers'
// connections log in as outbox_relayer and the producers' as
// outbox_producer; without it both are the Pool's.
func TestConnectRolesLogsInAsTheRoles(t *testing.T) {
	t.Parallel()
	pool := superuserPool(t)
	if err := migrations.CreateRoles(t.Context(), pool, ""); err != nil {
		t.Fatal(err)
	}
	who := func(db *pgxpool.Pool) string {
		t.Helper()
		var u string
		if err := db.QueryRow(t.Context(), `SELECT session_user`).Scan(&u); err != nil {
			t.Fatal(err)
		}
		return u
	}
	for _, roles := range []bool{false, true} {
		r := &runner{cfg: Config{Pool: pool, Roles: roles}}
		done, err := r.connectRoles(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		relayer, producer := who(r.relayerDB), who(r.producerDB)
		done()
		want := [2]string{pool.Config().ConnConfig.User, pool.Config().ConnConfig.User}
		if roles {
			want = [2]string{migrations.RoleRelayer, migrations.RoleProducer}
		}
		if relayer != want[0] || producer != want[1] {
			t.Errorf("roles %v: relayers as %s, producers as %s; want %s and %s", roles, relayer, producer, want[0], want[1])
		}
	}
}

// superuserPool is a pool on the test's database as the cluster's
// superuser (roles are created by one).
func superuserPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testdb.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	admin, err := pgx.ParseConfig(testdb.AdminURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User, cfg.ConnConfig.Password = admin.User, admin.Password
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}
