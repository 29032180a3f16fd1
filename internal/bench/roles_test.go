package bench_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/internal/bench"
	"github.com/ledgerline/outbox/internal/testdb"
)

// TestDrainAsRoles: with Config.Roles a drain runs (as outbox_relayer,
// its grants and row-level security policies in force:
// TestConnectRolesLogsInAsTheRoles), keeps every invariant, and every line
// says so.
func TestDrainAsRoles(t *testing.T) {
	t.Parallel()
	pool := superuserPool(t)
	var out bytes.Buffer
	results, err := bench.Run(t.Context(), bench.Config{
		Pool: pool, Out: &out, JSON: true, Roles: true, Ordered: []bool{true},
		Instructions: 300, Participants: 10, MaxConcurrency: 16, BatchSize: 20, FlushSize: 20,
	}, []string{"drain"})
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != 1 || !results[0].Roles || results[0].MsgsPerSec <= 0 {
		t.Fatalf("results %+v, want one drain as the roles", results)
	}
	var line map[string]any
	if err := json.Unmarshal(bytes.TrimSpace(out.Bytes()), &line); err != nil || line["roles"] != true {
		t.Fatalf("the line %q does not say roles (%v)", out.String(), err)
	}
	if strings.Contains(out.String(), `"roles":false`) {
		t.Fatalf("a line says it ran without the roles: %s", out.String())
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
