// Package testdb gives every test its own real PostgreSQL database, cloned
// from a migrated template (pgtestdb), on a throwaway cluster that the test
// binary starts itself; OUTBOX_TEST_DATABASE_URL points tests at an existing
// server instead.
package testdb

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx", used by pgtestdb
	"github.com/peterldowns/pgtestdb"
	"go.uber.org/goleak"

	"github.com/ledgerline/outbox/internal/pglocal"
	"github.com/ledgerline/outbox/migrations"
)

// EnvURL names the variable that overrides the throwaway cluster.
const EnvURL = "OUTBOX_TEST_DATABASE_URL"

var (
	startOnce sync.Once
	cluster   *pglocal.Cluster
	adminURL  string
	startErr  error
)

// Main is TestMain for packages whose tests use the database: it runs the
// tests, stops the throwaway cluster if one was started, and fails the run
// if goroutines leaked.
func Main(m *testing.M) {
	code := m.Run()
	for i := len(exampleCleanups) - 1; i >= 0; i-- {
		exampleCleanups[i]()
	}
	if cluster != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if err := cluster.Stop(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "testdb: stop cluster:", err)
		}
		cancel()
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// AdminURL returns the URL of the server's administrative database, starting
// the throwaway cluster on first use.
func AdminURL(t TB) string {
	t.Helper()
	startOnce.Do(func() {
		if u := os.Getenv(EnvURL); u != "" {
			adminURL = u
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		// Throwaway clusters skip fsync; benchmarks that measure commit cost
		// set OUTBOX_TEST_FSYNC=on to get durable commits like production.
		fsync := os.Getenv("OUTBOX_TEST_FSYNC") == "on"
		// Prepared transactions are allowed so that a test can show one
		// holding the vacuum horizon.
		cluster, startErr = pglocal.Start(ctx, pglocal.Options{Ephemeral: true, TCP: true, Fsync: fsync,
			Settings: map[string]string{"max_prepared_transactions": "8"}})
		if startErr == nil {
			adminURL = cluster.ConnString("postgres")
		}
	})
	if startErr != nil {
		t.Fatalf("testdb: start PostgreSQL: %v", startErr)
	}
	return adminURL
}

// Cluster returns the throwaway cluster, or nil when tests run against
// OUTBOX_TEST_DATABASE_URL. Crash tests use it to restart the server.
func Cluster(t TB) *pglocal.Cluster {
	AdminURL(t)
	return cluster
}

// TB is what the helpers need from a test: *testing.T, *testing.B and
// *testing.F satisfy it, and so does the one [ForExample] uses.
type TB = pgtestdb.TB

type migrator struct{}

func (migrator) Hash() (string, error) { return migrations.Hash(), nil }

func (migrator) Migrate(ctx context.Context, _ *sql.DB, conf pgtestdb.Config) error {
	pool, err := pgxpool.New(ctx, conf.URL())
	if err != nil {
		return err
	}
	defer pool.Close()
	return migrations.Migrate(ctx, pool)
}

// URL returns the URL of a fresh, migrated database for this test. It is
// dropped when the test ends (kept if the test failed).
func URL(t TB) string {
	t.Helper()
	cfg, err := pgx.ParseConfig(AdminURL(t))
	if err != nil {
		t.Fatalf("testdb: parse %s: %v", EnvURL, err)
	}
	conf := pgtestdb.Config{
		DriverName:                "pgx",
		Host:                      cfg.Host,
		Port:                      fmt.Sprint(cfg.Port),
		User:                      cfg.User,
		Password:                  cfg.Password,
		Database:                  cfg.Database,
		Options:                   "sslmode=disable",
		ForceTerminateConnections: true,
	}
	inst := pgtestdb.Custom(t, conf, migrator{})
	u := &url.URL{
		Scheme:   "postgres",
		User:     url.UserPassword(inst.User, inst.Password),
		Host:     fmt.Sprintf("%s:%s", inst.Host, inst.Port),
		Path:     "/" + inst.Database,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// AsAdmin returns dbURL (one of URL's) as the server's administrative
// role: a superuser on the throwaway cluster, who sees every session's
// details in pg_stat_activity.
func AsAdmin(t TB, dbURL string) string {
	t.Helper()
	admin, err := url.Parse(AdminURL(t))
	if err != nil {
		t.Fatalf("testdb: parse %s: %v", EnvURL, err)
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	u.User = admin.User
	return u.String()
}

// Starting bounds the start of a throwaway cluster, or of a standby of
// one (pglocal's StartReplica), by the shared cluster's two minutes
// (AdminURL), not pglocal's default 30 s: with other tests' clusters and
// race-built tests beside it, a loaded 2-core machine took longer than
// that (initdb killed in its post-bootstrap step, pg_ctl given 1 s left,
// pg_basebackup killed).
func Starting(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, 2*time.Minute)
}

// OwnCluster starts a throwaway cluster for this test alone (for one it
// replicates from, crashes or reconfigures), stopped when the test ends,
// and returns it with a pool on its migrated postgres database, as the
// cluster's superuser.
func OwnCluster(t TB) (*pglocal.Cluster, *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	starting, cancel := Starting(ctx)
	defer cancel()
	c, err := pglocal.Start(starting, pglocal.Options{Ephemeral: true, TCP: true})
	if err != nil {
		t.Fatalf("testdb: start a cluster: %v", err)
	}
	t.Cleanup(func() { _ = c.Stop(context.Background()) })
	pool, err := pgxpool.New(ctx, c.ConnString("postgres"))
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	t.Cleanup(pool.Close)
	if err := migrations.Migrate(ctx, pool); err != nil {
		t.Fatalf("testdb: migrate: %v", err)
	}
	return c, pool
}

// New returns a pool on a fresh, migrated database for this test, closed
// when the test ends.
func New(t TB) *pgxpool.Pool {
	t.Helper()
	return NewWithConfig(t, nil)
}

// NewWithConfig is New with a hook to adjust the pool configuration.
func NewWithConfig(t TB, adjust func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(URL(t))
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	if adjust != nil {
		adjust(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// exampleTB lets runnable examples (which get no *testing.T) use a fresh
// database; its cleanups run when Main finishes.
type exampleTB struct{}

var exampleCleanups []func()

func (exampleTB) Cleanup(f func())    { exampleCleanups = append(exampleCleanups, f) }
func (exampleTB) Failed() bool        { return false }
func (exampleTB) Helper()             {}
func (exampleTB) Logf(string, ...any) {}
func (exampleTB) Fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "testdb (example): "+format+"\n", args...)
	os.Exit(1)
}

// ForExample returns a pool on a fresh, migrated database for a runnable
// example; it is dropped when the test binary's Main finishes.
func ForExample() *pgxpool.Pool { return New(exampleTB{}) }
