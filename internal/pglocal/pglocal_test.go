package pglocal

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// start starts a cluster and makes sure the test never leaves it running.
func start(t *testing.T, opts Options) *Cluster {
	t.Helper()
	c, err := Start(testCtx(t), opts)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Stop(context.Background()); err != nil {
			t.Errorf("Stop: %v", err)
		}
	})
	return c
}

// queryOne runs a single-value query on a fresh connection.
func queryOne(t *testing.T, connString, sql string) string {
	t.Helper()
	ctx := testCtx(t)
	conn, err := pgx.Connect(ctx, connString)
	if err != nil {
		t.Fatalf("connect %s: %v", connString, err)
	}
	defer conn.Close(ctx)
	var v string
	if err := conn.QueryRow(ctx, sql).Scan(&v); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return v
}

func exec1(t *testing.T, connString, sql string) {
	t.Helper()
	ctx := testCtx(t)
	conn, err := pgx.Connect(ctx, connString)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func TestEphemeralSocket(t *testing.T) {
	t.Parallel()
	c := start(t, Options{Ephemeral: true, Settings: map[string]string{"work_mem": "8MB", "application_name": "it's"}})
	url := c.ConnString("postgres")
	if want := fmt.Sprintf("postgres://postgres@/postgres?host=%s&port=%d&sslmode=disable", c.SocketDir(), c.Port()); url != want {
		t.Errorf("socket ConnString = %s", url)
	}
	if !strings.HasPrefix(c.DataDir(), ephemeralBase+"/") || c.Port() == 0 {
		t.Errorf("DataDir %s Port %d", c.DataDir(), c.Port())
	}
	if _, err := os.Stat(filepath.Join(c.SocketDir(), fmt.Sprintf(".s.PGSQL.%d", c.Port()))); err != nil {
		t.Errorf("socket file: %v", err)
	}
	if got := queryOne(t, url, "SELECT 1::text"); got != "1" {
		t.Errorf("SELECT 1 = %q", got)
	}
	for setting, want := range map[string]string{"work_mem": "8MB", "max_connections": "300", "fsync": "off", "synchronous_commit": "on"} {
		if got := queryOne(t, url, "SHOW "+setting); got != want {
			t.Errorf("%s = %q, want %q", setting, got, want)
		}
	}

	root := filepath.Dir(c.DataDir())
	if err := c.Stop(testCtx(t)); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if _, err := os.Stat(root); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ephemeral dir %s still there after Stop: %v", root, err)
	}
	if err := c.Stop(testCtx(t)); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

func TestEphemeralTCPRestart(t *testing.T) {
	t.Parallel()
	c := start(t, Options{Ephemeral: true, TCP: true})
	url := c.ConnString("postgres")
	if want := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.Port()); url != want {
		t.Errorf("ConnString = %s, want %s", url, want)
	}
	exec1(t, url, "CREATE TABLE t (v int); INSERT INTO t VALUES (42)")
	if err := c.Restart(testCtx(t), "immediate"); err != nil {
		t.Fatalf("Restart: %v", err)
	}
	// A committed row survives the simulated crash: synchronous_commit is on.
	if got := queryOne(t, url, "SELECT v::text FROM t"); got != "42" {
		t.Errorf("after restart: %q", got)
	}
}

func TestPersistentReuse(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	// t.TempDir's parent is 0700; the postgres OS user must traverse it.
	if err := os.Chmod(filepath.Dir(dir), 0o755); err != nil {
		t.Fatal(err)
	}
	opts := Options{DataDir: filepath.Join(dir, "data"), Fsync: true}
	c1 := start(t, opts)
	exec1(t, c1.ConnString(""), "CREATE TABLE kept (v int); INSERT INTO kept VALUES (7)")

	// A second Start while it runs attaches instead of starting another.
	c2 := start(t, opts)
	if !c1.Started() || c2.Started() {
		t.Errorf("Started() = %v, %v; want true, false", c1.Started(), c2.Started())
	}
	if c2.Port() != c1.Port() || c2.SocketDir() != c1.SocketDir() {
		t.Errorf("attach: port %d/%d socket %s/%s", c2.Port(), c1.Port(), c2.SocketDir(), c1.SocketDir())
	}
	if err := c2.Stop(testCtx(t)); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if err := c1.Stop(testCtx(t)); err != nil { // its server is already gone
		t.Fatalf("Stop of stopped server: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "data", "PG_VERSION")); err != nil {
		t.Fatalf("persistent data dir gone after Stop: %v", err)
	}

	c3 := start(t, opts)
	if got := queryOne(t, c3.ConnString(""), "SELECT v::text FROM kept"); got != "7" {
		t.Errorf("after re-Start: %q", got)
	}
	if got := queryOne(t, c3.ConnString(""), "SHOW fsync"); got != "on" {
		t.Errorf("fsync = %q", got)
	}
}

func TestConcurrentStartSameDataDir(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := os.Chmod(filepath.Dir(dir), 0o755); err != nil {
		t.Fatal(err)
	}
	opts := Options{DataDir: filepath.Join(dir, "data")}
	clusters := make(chan *Cluster, 2)
	for range 2 {
		go func() {
			c, err := Start(testCtx(t), opts)
			if err != nil {
				t.Errorf("Start: %v", err)
			}
			clusters <- c
		}()
	}
	a, b := <-clusters, <-clusters
	for _, c := range []*Cluster{a, b} {
		if c != nil {
			t.Cleanup(func() { c.Stop(context.Background()) })
		}
	}
	if a == nil || b == nil {
		t.FailNow()
	}
	// One ran initdb and started the server, the other waited and attached.
	if a.Port() != b.Port() || a.Started() == b.Started() {
		t.Errorf("ports %d, %d; started %v, %v", a.Port(), b.Port(), a.Started(), b.Started())
	}
	if got := queryOne(t, b.ConnString(""), "SELECT 1::text"); got != "1" {
		t.Errorf("SELECT 1 = %q", got)
	}
}

func TestUntraversableDataDir(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("only root delegates to the postgres OS user")
	}
	_, err := Start(testCtx(t), Options{DataDir: filepath.Join(t.TempDir(), "data")}) // parent is 0700
	if err == nil || !strings.Contains(err.Error(), "cannot traverse") {
		t.Fatalf("Start = %v, want a traverse error", err)
	}
}

func TestInvalidSetting(t *testing.T) {
	t.Parallel()
	for _, key := range []string{"port", "bad key"} {
		if _, err := Start(testCtx(t), Options{Ephemeral: true, Settings: map[string]string{key: "1"}}); err == nil {
			t.Errorf("setting %q accepted", key)
		}
	}
}

func TestCleanupStale(t *testing.T) {
	t.Parallel()
	child := exec.Command("true")
	if err := child.Run(); err != nil {
		t.Fatal(err)
	}
	deadPID := child.Process.Pid

	c := start(t, Options{Ephemeral: true})
	postmaster := postmasterPID(c.DataDir())
	if postmaster == 0 {
		t.Fatal("no postmaster running")
	}
	// Make it look like the leftover of a process that died without Stop.
	stale := filepath.Join(ephemeralBase, fmt.Sprintf("%d-stale%d", deadPID, time.Now().UnixNano()))
	if err := os.Rename(filepath.Dir(c.DataDir()), stale); err != nil {
		t.Fatal(err)
	}
	if err := CleanupStale(); err != nil {
		t.Fatalf("CleanupStale: %v", err)
	}
	if _, err := os.Stat(stale); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("stale dir still there: %v", err)
	}
	for deadline := time.Now().Add(10 * time.Second); processAlive(postmaster); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("stale postmaster %d still running", postmaster)
		}
	}
}

// TestFailoverToSynchronousStandby crashes a primary whose commits wait for
// a synchronous standby, promotes the standby, and finds every committed
// row there; a multi-host URL with target_session_attrs=read-write reaches
// whichever of the two accepts writes.
func TestFailoverToSynchronousStandby(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	primary := start(t, Options{Ephemeral: true, TCP: true})
	standby, err := primary.StartReplica(ctx, Options{TCP: true})
	if err != nil {
		t.Fatalf("StartReplica: %v", err)
	}
	t.Cleanup(func() {
		if err := standby.Stop(context.Background()); err != nil {
			t.Errorf("Stop standby: %v", err)
		}
	})
	if err := primary.RequireSynchronousStandby(ctx); err != nil {
		t.Fatal(err)
	}
	both := fmt.Sprintf("postgres://postgres@/postgres?host=127.0.0.1,127.0.0.1&port=%d,%d&target_session_attrs=read-write&sslmode=disable",
		primary.Port(), standby.Port())
	exec1(t, both, "CREATE TABLE t (v int); INSERT INTO t SELECT generate_series(1, 1000)")
	if got := queryOne(t, both, "SELECT inet_server_port()::text"); got != strconv.Itoa(primary.Port()) {
		t.Errorf("before the failover the URL reached port %s, want the primary's %d", got, primary.Port())
	}

	if err := primary.Crash(ctx); err != nil {
		t.Fatalf("Crash: %v", err)
	}
	if err := standby.Promote(ctx); err != nil {
		t.Fatalf("Promote: %v", err)
	}
	if got := queryOne(t, both, "SELECT inet_server_port()::text"); got != strconv.Itoa(standby.Port()) {
		t.Errorf("after the failover the URL reached port %s, want the promoted standby's %d", got, standby.Port())
	}
	if got := queryOne(t, both, "SELECT count(*)::text FROM t"); got != "1000" {
		t.Errorf("promoted standby has %s rows, want 1000", got)
	}
	exec1(t, both, "INSERT INTO t VALUES (0)")
	if err := primary.Stop(ctx); err != nil {
		t.Errorf("Stop of a crashed primary: %v", err)
	}
}
