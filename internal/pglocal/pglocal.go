// Package pglocal runs a real PostgreSQL server from the locally installed
// server binaries, for tests (throwaway "ephemeral" clusters) and the demo
// (a persistent, durable cluster).
//
// It exists because CI runs as root on a fresh Debian machine, where
// initdb/postgres refuse to run as root, unix socket paths are short, and
// several test binaries start clusters at the same time. Ephemeral clusters
// live under /tmp/outbox-pg/<pid>-<random>/ so that CleanupStale can find and
// remove those whose creating process died without calling Stop.
package pglocal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// EnvBinDir names the environment variable that overrides where the server
// binaries (initdb, pg_ctl, postgres) are looked up.
const EnvBinDir = "OUTBOX_PG_BINDIR"

const (
	// ephemeralBase is fixed and short: socket paths must stay below the
	// sun_path limit, and CleanupStale must know where to look.
	ephemeralBase = "/tmp/outbox-pg"
	// maxSocketDir leaves room for the "/.s.PGSQL.<port>.lock" the server
	// appends within the 108-byte sun_path (including the NUL).
	maxSocketDir   = 107 - len("/.s.PGSQL.65535.lock")
	defaultTimeout = 30 * time.Second
	confFile       = "pglocal.conf" // our settings, rewritten on every Start
	logName        = "server.log"
)

// Options configures Start. The zero value is not usable: set DataDir,
// Ephemeral, or both.
type Options struct {
	// DataDir is the cluster data directory. Empty with Ephemeral set means
	// a fresh directory under /tmp/outbox-pg.
	DataDir string
	// SocketDir is the unix socket directory. Default: the ephemeral scratch
	// directory, else DataDir (which must then be short enough).
	SocketDir string
	// Port names the socket file .s.PGSQL.<Port> and is the TCP port when
	// TCP is set; 0 picks a free TCP port so concurrent clusters never clash.
	Port int
	// TCP makes the server also listen on 127.0.0.1:Port, and ConnString
	// use TCP. The default is unix socket only.
	TCP bool
	// Fsync false turns off fsync and full_page_writes: fast, but a machine
	// crash may corrupt the cluster (fine for tests). True is durable (demo).
	// synchronous_commit stays on either way, so commit semantics are real.
	Fsync bool
	// Ephemeral makes Stop remove the data and scratch directories.
	Ephemeral bool
	// BinDir holds the server binaries. Default: FindBinDir.
	BinDir string
	// Settings are extra postgresql.conf settings (e.g. max_connections,
	// which defaults to 300 because tests open many pools). The keys
	// port, listen_addresses and unix_socket_directories are managed by
	// pglocal and rejected here, since ConnString depends on them.
	Settings map[string]string
	// Log receives progress messages; nil discards them.
	Log *slog.Logger
}

// Cluster is a running PostgreSQL server. Its methods are safe for
// concurrent use.
type Cluster struct {
	bin, dataDir, socketDir string
	port                    int
	tcp, started            bool     // started: by this Start, not attached to
	as                      *account // nil: the server runs as ourselves
	log                     *slog.Logger
	remove                  []string // directories Stop deletes (ephemeral)

	mu      sync.Mutex // serialises Restart and Stop
	stopped bool
}

// FindBinDir returns $OUTBOX_PG_BINDIR if set, else the
// /usr/lib/postgresql/<major>/bin with the highest major version that
// contains initdb (the Debian layout).
func FindBinDir() (string, error) {
	if dir := os.Getenv(EnvBinDir); dir != "" {
		if _, err := os.Stat(filepath.Join(dir, "initdb")); err != nil {
			return "", fmt.Errorf("pglocal: $%s=%q has no initdb: %w", EnvBinDir, dir, err)
		}
		return dir, nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin") // the pattern is valid
	best, bestMajor := "", -1.0
	for _, dir := range dirs {
		major, err := strconv.ParseFloat(filepath.Base(filepath.Dir(dir)), 64) // "15", "9.6"
		if _, statErr := os.Stat(filepath.Join(dir, "initdb")); err == nil && statErr == nil && major > bestMajor {
			best, bestMajor = dir, major
		}
	}
	if best == "" {
		return "", fmt.Errorf("pglocal: no PostgreSQL server binaries (initdb) in /usr/lib/postgresql/*/bin; install them with `apt-get install -y postgresql` or set $%s", EnvBinDir)
	}
	return best, nil
}

// Start starts a cluster as described by opts and returns once it accepts
// connections. An existing data directory (PG_VERSION present) is reused
// without initdb; if a server is already running on it, Start attaches to
// that server instead of starting another. Without a deadline on ctx, Start
// gives up after 30 s.
func Start(ctx context.Context, opts Options) (c *Cluster, err error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	if opts.DataDir == "" && !opts.Ephemeral {
		return nil, errors.New("pglocal: Options.DataDir is required unless Ephemeral is set")
	}
	for k := range opts.Settings {
		if !settingName.MatchString(k) || k == "port" || k == "listen_addresses" || k == "unix_socket_directories" {
			return nil, fmt.Errorf("pglocal: setting %q is invalid or managed by pglocal", k)
		}
	}
	c = &Cluster{bin: opts.BinDir, port: opts.Port, tcp: opts.TCP, log: opts.Log}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	if c.bin == "" {
		if c.bin, err = FindBinDir(); err != nil {
			return nil, err
		}
	}
	if c.as, err = serverAccount(); err != nil {
		return nil, err
	}
	unlock := func() {}
	defer func() { // leave no half-started server or scratch dir behind
		defer unlock() // only after cleanup, or another Start could attach to a dying server
		if err == nil {
			return
		}
		if c.started { // only ours: a server we attached to may be in use
			err = errors.Join(err, c.Stop(context.Background())) // also removes c.remove
		} else {
			for _, dir := range c.remove {
				os.RemoveAll(dir)
			}
		}
		c = nil
	}()

	scratch := ""
	if opts.Ephemeral {
		if err := CleanupStale(); err != nil {
			c.log.Warn("pglocal: removing stale clusters", "err", err)
		}
		if scratch, err = c.as.makeScratch(); err != nil {
			return c, err
		}
		c.remove = append(c.remove, scratch)
	}
	if c.dataDir = opts.DataDir; c.dataDir == "" {
		c.dataDir = filepath.Join(scratch, "data")
	} else if c.dataDir, err = filepath.Abs(c.dataDir); err != nil {
		return c, fmt.Errorf("pglocal: data dir: %w", err)
	}
	switch {
	case opts.SocketDir != "":
		if c.socketDir, err = filepath.Abs(opts.SocketDir); err == nil {
			err = c.as.prepareSocketDir(c.socketDir)
		}
	case scratch != "":
		c.socketDir = scratch
	default:
		c.socketDir = c.dataDir
	}
	if err != nil {
		return c, err
	}
	if len(c.socketDir) > maxSocketDir {
		return c, fmt.Errorf("pglocal: socket directory %s is longer than %d bytes (unix socket path limit); set Options.SocketDir to a shorter path", c.socketDir, maxSocketDir)
	}
	if err := c.as.prepareDataDir(c.dataDir); err != nil {
		return c, err
	}
	release, err := lockDir(ctx, c.dataDir)
	if err != nil {
		return c, err
	}
	unlock = release

	if pid := postmasterPID(c.dataDir); pid > 0 {
		if err := c.attach(); err != nil {
			return c, err
		}
		c.log.Info("pglocal: attached to running server", "pid", pid, "datadir", c.dataDir, "port", c.port)
		return c, c.waitReady(ctx)
	}
	if opts.Ephemeral && opts.DataDir != "" { // only now: it might have been a live cluster
		c.remove = append(c.remove, c.dataDir)
	}
	if _, err := os.Stat(filepath.Join(c.dataDir, "PG_VERSION")); errors.Is(err, fs.ErrNotExist) {
		args := []string{"-D", c.dataDir, "--auth=trust", "-U", "postgres", "--encoding=UTF8", "--no-locale"}
		if !opts.Fsync {
			args = append(args, "--no-sync")
		}
		c.log.Info("pglocal: initdb", "datadir", c.dataDir)
		if err := run(ctx, c.bin, c.as, "initdb", args...); err != nil {
			return c, err
		}
	}
	// A port picked by probing can be taken by someone else before the
	// server binds it (clients' ephemeral ports come from the same range),
	// so a bind failure on a picked port is retried with a fresh one.
	for attempt := 1; ; attempt++ {
		if opts.Port == 0 {
			if c.port, err = freePort(); err != nil {
				return c, err
			}
		}
		if err := c.writeConfig(opts); err != nil {
			return c, err
		}
		c.started = true
		err = c.pgctl(ctx, "start")
		if err == nil || opts.Port != 0 || attempt == 3 || !strings.Contains(err.Error(), "could not bind") {
			break
		}
		c.log.Info("pglocal: port taken, retrying", "port", c.port)
	}
	if err != nil {
		return c, err
	}
	c.log.Info("pglocal: started", "datadir", c.dataDir, "conn", c.ConnString("postgres"))
	return c, c.waitReady(ctx)
}

// ConnString returns a pgx-compatible URL for database ("" means postgres):
// over TCP when the cluster listens on TCP, else over the unix socket.
func (c *Cluster) ConnString(database string) string {
	if database == "" {
		database = "postgres"
	}
	if c.tcp {
		return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.port, url.PathEscape(database))
	}
	q := url.Values{"host": {c.socketDir}, "port": {strconv.Itoa(c.port)}, "sslmode": {"disable"}}
	// "/" is legal in a query; leaving it unescaped keeps the URL readable.
	return "postgres://postgres@/" + url.PathEscape(database) + "?" + strings.ReplaceAll(q.Encode(), "%2F", "/")
}

// Started reports whether Start started the server, as opposed to attaching
// to one that was already running on the data dir; a caller that did not
// start it may want to leave it running (Stop would stop it regardless).
func (c *Cluster) Started() bool { return c.started }

// Port returns the server port (also the suffix of the socket file name).
func (c *Cluster) Port() int { return c.port }

// SocketDir returns the unix socket directory.
func (c *Cluster) SocketDir() string { return c.socketDir }

// DataDir returns the cluster data directory.
func (c *Cluster) DataDir() string { return c.dataDir }

// Restart runs pg_ctl restart -m mode ("smart", "fast" or "immediate"; the
// latter simulates a crash and makes the server run recovery) and waits until
// the server accepts connections again.
func (c *Cluster) Restart(ctx context.Context, mode string) error {
	return c.whileRunning(ctx, "restart", func(ctx context.Context) error {
		if err := c.pgctl(ctx, "restart", "-m", mode); err != nil {
			return err
		}
		return c.waitReady(ctx)
	})
}

// whileRunning runs act on the server, under the cluster's lock and the
// default timeout, unless the cluster is stopped (an error naming what).
func (c *Cluster) whileRunning(ctx context.Context, what string, act func(context.Context) error) error {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return fmt.Errorf("pglocal: %s of a stopped cluster", what)
	}
	return act(ctx)
}

// Crash stops the server the way a crash does (pg_ctl stop -m immediate:
// every process exits at once, nothing is checkpointed) and leaves it
// stopped; its directories stay until Stop.
func (c *Cluster) Crash(ctx context.Context) error {
	return c.whileRunning(ctx, "crash", func(ctx context.Context) error {
		return c.pgctl(ctx, "stop", "-m", "immediate")
	})
}

// RequireSynchronousStandby makes every commit on c wait until a standby
// has the commit's WAL (synchronous_standby_names = '*', written with
// ALTER SYSTEM), and waits until one of c's standbys is synchronous.
func (c *Cluster) RequireSynchronousStandby(ctx context.Context) error {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.ConnString("postgres"))
	if err != nil {
		return fmt.Errorf("pglocal: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "ALTER SYSTEM SET synchronous_standby_names = '*'"); err != nil {
		return fmt.Errorf("pglocal: %w", err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		return fmt.Errorf("pglocal: %w", err)
	}
	for {
		var sync bool
		if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_stat_replication WHERE sync_state = 'sync')").Scan(&sync); err != nil {
			return fmt.Errorf("pglocal: %w", err)
		}
		if sync {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pglocal: no synchronous standby: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Promote makes a standby (see StartReplica) a primary (pg_ctl promote)
// and waits until it accepts writes.
func (c *Cluster) Promote(ctx context.Context) error {
	return c.whileRunning(ctx, "promotion", func(ctx context.Context) error {
		if err := c.pgctl(ctx, "promote"); err != nil {
			return err
		}
		// pg_ctl promote -w returns once the server has left recovery; a
		// connection that sees it is the proof.
		conn, err := pgx.Connect(ctx, c.ConnString("postgres"))
		if err != nil {
			return fmt.Errorf("pglocal: connect after promotion: %w", err)
		}
		defer conn.Close(context.WithoutCancel(ctx))
		var recovering bool
		if err := conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&recovering); err != nil {
			return fmt.Errorf("pglocal: after promotion: %w", err)
		}
		if recovering {
			return errors.New("pglocal: still in recovery after pg_ctl promote")
		}
		return nil
	})
}

// Stop shuts the server down (pg_ctl stop -m fast) and, for ephemeral
// clusters, removes their directories. Stopping a stopped cluster, or one
// whose server is already gone, is not an error.
func (c *Cluster) Stop(ctx context.Context) error {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return nil
	}
	if c.dataDir != "" && postmasterPID(c.dataDir) > 0 {
		// pg_ctl fails when the server exits by itself meanwhile; only a
		// server that is still running is a failure.
		if err := c.pgctl(ctx, "stop", "-m", "fast"); err != nil && postmasterPID(c.dataDir) > 0 {
			return err
		}
	}
	var errs []error
	for _, dir := range c.remove {
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, fmt.Errorf("pglocal: remove %s: %w", dir, err))
		}
	}
	c.stopped = len(errs) == 0
	return errors.Join(errs...)
}

// CleanupStale removes the ephemeral clusters under /tmp/outbox-pg whose
// creating process is dead, stopping any server still running there. Start
// calls it for ephemeral clusters, so leftovers of killed test binaries do not
// pile up.
func CleanupStale() error {
	entries, err := os.ReadDir(ephemeralBase)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return fmt.Errorf("pglocal: %w", err)
	}
	as, asErr := serverAccount() // without it pg_ctl fails as root; we kill instead
	bin, binErr := FindBinDir()
	var errs []error
	for _, e := range entries {
		pidStr, _, ok := strings.Cut(e.Name(), "-")
		pid, err := strconv.Atoi(pidStr)
		if !ok || err != nil || !e.IsDir() || processAlive(pid) {
			continue
		}
		if info, err := e.Info(); err != nil || (os.Geteuid() != 0 && owner(info) != uint32(os.Geteuid())) {
			continue // gone meanwhile, or another user's (the sticky base dir forbids removing it)
		}
		if err := cleanEntry(filepath.Join(ephemeralBase, e.Name()), bin, as, errors.Join(asErr, binErr)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// cleanEntry stops the server in a dead process's scratch dir and removes it.
// whyNoPgctl is non-nil when pg_ctl cannot be used.
func cleanEntry(dir, bin string, as *account, whyNoPgctl error) error {
	f, err := os.Open(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("pglocal: %w", err)
	}
	defer f.Close()
	// Concurrent cleaners (parallel test binaries) must not fight over one
	// entry: whoever holds the lock cleans it, the others skip it.
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return nil
	}
	if _, err := os.Stat(dir); err != nil {
		return nil // removed by a cleaner that finished before we locked
	}
	data := filepath.Join(dir, "data")
	if pid := postmasterPID(data); pid > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), defaultTimeout)
		err := whyNoPgctl
		if err == nil {
			err = run(ctx, bin, as, "pg_ctl", "stop", "-D", data, "-m", "immediate", "-w", "-t", "20")
		}
		cancel()
		if err != nil && postmasterPID(data) > 0 {
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				return fmt.Errorf("pglocal: kill stale postmaster %d: %w", pid, err)
			}
			for deadline := time.Now().Add(5 * time.Second); processAlive(pid) && time.Now().Before(deadline); {
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("pglocal: remove stale cluster: %w", err)
	}
	return nil
}

// attach adopts the port, socket dir and TCP-ness of the server running on
// c.dataDir from its postmaster.pid, since it may differ from our options.
func (c *Cluster) attach() error {
	b, err := os.ReadFile(filepath.Join(c.dataDir, "postmaster.pid"))
	if err != nil {
		return fmt.Errorf("pglocal: attach: %w", err)
	}
	// Lines: pid, datadir, start time, port, socket dir, listen addr, ...
	lines := strings.Split(string(b), "\n")
	if len(lines) < 6 {
		return fmt.Errorf("pglocal: attach: short postmaster.pid in %s", c.dataDir)
	}
	if c.port, err = strconv.Atoi(strings.TrimSpace(lines[3])); err != nil {
		return fmt.Errorf("pglocal: attach: port in postmaster.pid: %w", err)
	}
	c.socketDir, _, _ = strings.Cut(strings.TrimSpace(lines[4]), ",")
	c.tcp = strings.TrimSpace(lines[5]) != "" || c.socketDir == ""
	return nil
}

// waitReady polls until a real connection succeeds: the postmaster accepts
// connections before recovery is done, and only a connection proves both.
func (c *Cluster) waitReady(ctx context.Context) error {
	for {
		attempt, cancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgx.Connect(attempt, c.ConnString("postgres"))
		if err == nil {
			err = conn.Close(attempt)
			cancel()
			return err
		}
		cancel()
		if postmasterPID(c.dataDir) == 0 {
			return fmt.Errorf("pglocal: server exited: %w\n%s", err, c.logTail())
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pglocal: server not accepting connections: %w (last error: %v)\n%s", ctx.Err(), err, c.logTail())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// pgctl runs pg_ctl action on the cluster, waiting for it to finish within
// ctx's deadline, and adds the server log to errors because pg_ctl's own
// messages ("could not start server") never say why.
func (c *Cluster) pgctl(ctx context.Context, action string, args ...string) error {
	secs := int(defaultTimeout.Seconds())
	if dl, ok := ctx.Deadline(); ok {
		secs = max(1, int(time.Until(dl).Seconds()))
	}
	args = append([]string{action, "-D", c.dataDir, "-l", c.logFile(), "-w", "-t", strconv.Itoa(secs)}, args...)
	if err := run(ctx, c.bin, c.as, "pg_ctl", args...); err != nil {
		return fmt.Errorf("%w\n%s", err, c.logTail())
	}
	return nil
}

var settingName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_.]*$`)

// writeConfig writes our settings to pglocal.conf, included from
// postgresql.conf. Rewriting a separate file on every Start keeps re-Starts
// of a persistent cluster idempotent and lets the port change between runs.
func (c *Cluster) writeConfig(opts Options) error {
	listen, fsync := "", "off"
	if c.tcp {
		listen = "127.0.0.1"
	}
	if opts.Fsync {
		fsync = "on"
	}
	// Autovacuum visits every 10 s instead of every minute: the outbox's
	// hot tables churn at the instruction rate and stay small only if
	// vacuumed often (docs/operations.md).
	set := map[string]string{"max_connections": "300", "autovacuum_naptime": "10s"}
	maps.Copy(set, opts.Settings)
	set["listen_addresses"], set["port"], set["unix_socket_directories"] = listen, strconv.Itoa(c.port), c.socketDir
	set["fsync"], set["full_page_writes"], set["synchronous_commit"] = fsync, fsync, "on"
	var b strings.Builder
	b.WriteString("# Written by pglocal on every start; use Options.Settings instead of editing.\n")
	for _, k := range slices.Sorted(maps.Keys(set)) {
		fmt.Fprintf(&b, "%s = '%s'\n", k, strings.NewReplacer(`\`, `\\`, `'`, `''`).Replace(set[k]))
	}
	if err := c.as.writeFile(filepath.Join(c.dataDir, confFile), b.String()); err != nil {
		return err
	}
	main := filepath.Join(c.dataDir, "postgresql.conf")
	old, err := os.ReadFile(main)
	if err != nil {
		return fmt.Errorf("pglocal: %w", err)
	}
	include := "include_if_exists = '" + confFile + "'"
	if bytes.Contains(old, []byte(include)) {
		return nil
	}
	f, err := os.OpenFile(main, os.O_APPEND|os.O_WRONLY, 0)
	if err == nil {
		_, err = fmt.Fprintf(f, "\n%s\n", include)
		err = errors.Join(err, f.Close())
	}
	if err != nil {
		return fmt.Errorf("pglocal: %w", err)
	}
	return nil
}

func (c *Cluster) logFile() string { return filepath.Join(c.dataDir, logName) }

// logTail returns the end of the server log, for error messages.
func (c *Cluster) logTail() string {
	b, err := os.ReadFile(c.logFile())
	if err != nil {
		return fmt.Sprintf("(no server log: %v)", err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return "server log " + c.logFile() + " (tail):\n" + strings.Join(lines[max(0, len(lines)-20):], "\n")
}

// run runs a server binary as `as` (nil: ourselves). The working directory
// is / because the server user may not be allowed into ours (e.g. /root).
// PG* variables are dropped: PGDATA, PGPORT and friends would silently
// override what we pass.
func run(ctx context.Context, bin string, as *account, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, filepath.Join(bin, name), args...)
	cmd.Dir = "/"
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PG") && (as == nil || !strings.HasPrefix(kv, "HOME=")) {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	if as != nil {
		cmd.Env = append(cmd.Env, "HOME="+as.homeDir)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: as.cred}
	}
	cmd.WaitDelay = 5 * time.Second // don't hang if a daemon keeps our pipe
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("pglocal: %s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

func withDefaultTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, defaultTimeout)
}

// freePort asks the kernel for a free TCP port. It is used even for
// socket-only clusters so that concurrent clusters get distinct socket names.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pglocal: pick a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// lockDir takes an exclusive flock on dir until the returned func is called,
// so that processes starting a cluster on one data dir at the same time do
// not both run initdb or start two servers: the later one attaches.
func lockDir(ctx context.Context, dir string) (func(), error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("pglocal: lock data dir: %w", err)
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil // closing releases the lock
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("pglocal: lock data dir: %w", err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("pglocal: waiting for another Start on %s: %w", dir, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// postmasterPID returns the pid of the server running on dataDir, or 0.
// A crashed server leaves postmaster.pid behind and its pid may have been
// reused, even by another cluster's postgres; signalling that would be bad,
// so the process must also have the data dir as its working directory (the
// postmaster chdirs there).
func postmasterPID(dataDir string) int {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil || !processAlive(pid) {
		return 0
	}
	if real, err := filepath.EvalSymlinks(dataDir); err == nil {
		dataDir = real
	}
	if cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid)); err != nil || cwd != dataDir {
		return 0
	}
	return pid
}

// processAlive reports whether pid exists and is not a zombie; zombies
// matter because a container's init may never reap an orphaned postmaster.
func processAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	i := bytes.LastIndexByte(stat, ')')
	return err != nil || i < 0 || i+2 >= len(stat) || stat[i+2] != 'Z'
}

// StartReplica starts a hot standby of c that streams from it: a base
// backup of c (pg_basebackup -R, as the server account, over c's socket)
// in a fresh ephemeral directory, started with opts (its DataDir and
// Ephemeral are set here; Stop removes it). c must allow replication
// connections from its server account, as initdb's trust setup does.
func (c *Cluster) StartReplica(ctx context.Context, opts Options) (*Cluster, error) {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	scratch, err := c.as.makeScratch()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(scratch, "data")
	if err := run(ctx, c.bin, c.as, "pg_basebackup", "-D", dir, "-R", "-X", "stream", "-c", "fast",
		"-h", c.socketDir, "-p", strconv.Itoa(c.port), "-U", "postgres"); err != nil {
		os.RemoveAll(scratch)
		return nil, err
	}
	opts.DataDir, opts.Ephemeral = dir, true
	if opts.BinDir == "" {
		opts.BinDir = c.bin
	}
	r, err := Start(ctx, opts)
	if err != nil {
		os.RemoveAll(scratch)
		return nil, err
	}
	r.remove = append(r.remove, scratch)
	return r, nil
}
