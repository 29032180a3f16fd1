package bench

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/internal/testdb"
)

// TestPgBenchGetsNoPasswordInItsArguments: the ceiling runs pgbench with
// the database's connection string, and a process's arguments are
// readable by every user of the machine (ps, /proc/PID/cmdline): the
// password was among them for the whole run. pgbench gets the
// connection string without it, and the password in its environment,
// which only its own user can read; it still connects.
func TestPgBenchGetsNoPasswordInItsArguments(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	password := pool.Config().ConnConfig.Password
	if password == "" {
		t.Skip("the test database's connection string has no password")
	}
	r := &runner{cfg: Config{Pool: pool}}
	bin, err := r.pgbench()
	if err != nil {
		t.Skip(err)
	}
	ctx := t.Context()
	// An advisory lock the test holds keeps pgbench running while its
	// arguments are read.
	holder, err := pgx.Connect(ctx, pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(context.WithoutCancel(ctx))
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_lock(4242)`); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := r.runPgBench(ctx, bin, t.TempDir(), "SELECT pg_advisory_lock(4242);\nSELECT pg_advisory_unlock(4242);\n", 1, []string{"-t", "1"})
		done <- err
	}()
	var args []byte
	for deadline := time.Now().Add(20 * time.Second); args == nil; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting for pgbench to start")
		}
		args = childArgs(t, filepath.Base(bin))
	}
	if bytes.Contains(args, []byte(password)) {
		t.Errorf("pgbench's arguments, readable by every user of the machine, hold the password: %q", bytes.ReplaceAll(args, []byte{0}, []byte{' '}))
	}
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_unlock(4242)`); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Errorf("pgbench: %v", err)
	}
}

// childArgs returns the command line of this process's child named name,
// nil while there is none.
func childArgs(t *testing.T, name string) []byte {
	t.Helper()
	procs, err := os.ReadDir("/proc")
	if err != nil {
		t.Skip("no /proc:", err)
	}
	me := strconv.Itoa(os.Getpid())
	for _, p := range procs {
		if _, err := strconv.Atoi(p.Name()); err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", p.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 || !strings.HasPrefix(string(stat[:i]), p.Name()+" ("+name) {
			continue
		}
		if f := strings.Fields(string(stat[i+1:])); len(f) < 2 || f[1] != me {
			continue
		}
		if args, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline")); err == nil && len(args) > 0 {
			return args
		}
	}
	return nil
}

// TestPgBenchConnLeavesOutThePassword: the password leaves the
// connection string pgbench gets wherever a URL or a keyword=value string
// keeps it, and goes to PGPASSWORD; the rest of the string stays.
func TestPgBenchConnLeavesOutThePassword(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ in, keep string }{
		{"postgres://alice:s3cr%40t@db.example:5433/ledger?sslmode=require", "alice@db.example:5433/ledger"},
		{"postgresql://alice@db.example/ledger?password=s3cr%40t&sslmode=require", "alice@db.example/ledger"},
		{"host=db.example user=alice password=s3cr@t dbname=ledger sslmode=require", "host=db.example user=alice dbname=ledger"},
		{"host=db.example user=alice password = 'it\\'s s3cr@t' dbname=ledger", "dbname=ledger"},
	} {
		cfg, err := pgxpool.ParseConfig(tt.in)
		if err != nil {
			t.Fatal(err)
		}
		conn, env := pgbenchConn(cfg)
		if strings.Contains(conn, "s3cr") || !strings.Contains(conn, tt.keep) || !strings.Contains(conn, "sslmode=require") == strings.Contains(tt.in, "sslmode") ||
			len(env) != 1 || env[0] != "PGPASSWORD="+cfg.ConnConfig.Password {
			t.Errorf("%s: %q %q", tt.in, conn, env)
		}
	}
}
