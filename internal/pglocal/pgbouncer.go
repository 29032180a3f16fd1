package pglocal

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrNoPgBouncer is returned by StartPgBouncer when the pgbouncer binary is
// not installed (Debian package pgbouncer).
var ErrNoPgBouncer = errors.New("pglocal: pgbouncer is not installed (apt-get install -y pgbouncer)")

// PgBouncerOptions configure StartPgBouncer.
type PgBouncerOptions struct {
	// PoolMode is "transaction" (the default, the usual production setting)
	// or "session".
	PoolMode string
	// Users may connect (any password: auth is trust, as the cluster's is).
	// Default: postgres.
	Users []string
	// PoolSize is the number of server connections per database and user
	// (default 20).
	PoolSize int
}

// PgBouncer is a running PgBouncer in front of a Cluster, on a loopback
// TCP port. Stop it when done; it also dies with the process that started
// it.
type PgBouncer struct {
	port int
	dir  string
	bin  string
	as   *account
	opts PgBouncerOptions
	// mu guards the running process (Restart replaces it) and the
	// backend's port (Retarget changes it).
	mu          sync.Mutex
	backendPort int
	cmd         *exec.Cmd
	done        chan struct{}
	waitErr     error
	stop        sync.Once
}

// StartPgBouncer starts pgbouncer in front of c (which must listen on
// TCP), as the server's OS user when we are root (pgbouncer refuses root),
// and returns once it accepts connections.
func StartPgBouncer(ctx context.Context, c *Cluster, opts PgBouncerOptions) (*PgBouncer, error) {
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		if _, statErr := os.Stat("/usr/sbin/pgbouncer"); statErr != nil {
			return nil, ErrNoPgBouncer
		}
		bin = "/usr/sbin/pgbouncer"
	}
	if !c.tcp {
		return nil, errors.New("pglocal: pgbouncer needs a cluster listening on TCP")
	}
	if opts.PoolMode == "" {
		opts.PoolMode = "transaction"
	}
	if len(opts.Users) == 0 {
		opts.Users = []string{"postgres"}
	}
	if opts.PoolSize <= 0 {
		opts.PoolSize = 20
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	as, err := serverAccount()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "outbox-pgbouncer-")
	if err != nil {
		return nil, fmt.Errorf("pglocal: %w", err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, fmt.Errorf("pglocal: %w", err)
	}
	if err := as.chown(dir); err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	var users strings.Builder
	for _, u := range opts.Users {
		fmt.Fprintf(&users, "%q \"\"\n", u)
	}
	if err := as.writeFile(filepath.Join(dir, "users.txt"), users.String()); err != nil {
		return nil, err
	}
	b := &PgBouncer{port: port, dir: dir, bin: bin, as: as, opts: opts, backendPort: c.port}
	if err := b.writeIni(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := b.launch(ctx); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return b, nil
}

// writeIni writes pgbouncer.ini for the current backend port.
// server_login_retry is 1 s, as the README asks of a PgBouncer in front
// of the outbox: after a failed connection to the server (a crashed
// primary) PgBouncer waits that long before it tries again, also once
// RELOAD has pointed it at the promoted standby, and holds every client's
// statement meanwhile; its default, 15 s, outlasted the relayers' leases
// (test.TestFaultFailoverBehindPgBouncer).
func (b *PgBouncer) writeIni() error {
	ini := fmt.Sprintf(`[databases]
* = host=127.0.0.1 port=%d

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = %s
default_pool_size = %d
max_client_conn = 1000
server_lifetime = 3600
server_login_retry = 1
admin_users = postgres
logfile = %s
pidfile = %s
`, b.backendPort, b.port, filepath.Join(b.dir, "users.txt"), b.opts.PoolMode, b.opts.PoolSize,
		filepath.Join(b.dir, "pgbouncer.log"), filepath.Join(b.dir, "pgbouncer.pid"))
	return b.as.writeFile(filepath.Join(b.dir, "pgbouncer.ini"), ini)
}

// launch starts the pgbouncer process and returns once it accepts
// connections.
func (b *PgBouncer) launch(ctx context.Context) error {
	cmd := exec.Command(b.bin, filepath.Join(b.dir, "pgbouncer.ini"))
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if b.as != nil {
		cmd.SysProcAttr.Credential = b.as.cred
	}
	done := make(chan struct{})
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("pglocal: start pgbouncer: %w", err)
	}
	b.cmd, b.done = cmd, done
	go func() { b.waitErr = cmd.Wait(); close(done) }()
	for {
		conn, err := net.DialTimeout("tcp", b.addr(), time.Second)
		if err == nil {
			conn.Close()
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("pglocal: pgbouncer exited: %v\n%s", b.waitErr, b.logTail())
		case <-ctx.Done():
			_ = cmd.Process.Kill()
			<-done
			return fmt.Errorf("pglocal: pgbouncer not accepting connections: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Retarget points PgBouncer at c, as an HA manager's promotion hook does
// after a failover: it rewrites the backend's address and reloads
// PgBouncer (RELOAD on its admin console, which returns once the new
// configuration is in force). Server connections to the old backend are
// closed as they are released; new ones go to c.
func (b *PgBouncer) Retarget(ctx context.Context, c *Cluster) error {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.backendPort = c.port
	if err := b.writeIni(); err != nil {
		return err
	}
	conn, err := b.admin(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "RELOAD"); err != nil {
		return fmt.Errorf("pglocal: pgbouncer RELOAD: %w", err)
	}
	return nil
}

// Restart kills PgBouncer (SIGKILL: every client and server connection
// breaks at once, whatever it was doing), waits for down, then starts it
// again on the same port with the same configuration.
func (b *PgBouncer) Restart(ctx context.Context, down time.Duration) error {
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	b.mu.Lock()
	defer b.mu.Unlock()
	_ = b.cmd.Process.Kill()
	<-b.done
	select {
	case <-time.After(down):
	case <-ctx.Done():
		return ctx.Err()
	}
	return b.launch(ctx)
}

// admin connects to PgBouncer's admin console.
func (b *PgBouncer) admin(ctx context.Context) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(b.ConnString("postgres", "pgbouncer"))
	if err != nil {
		return nil, err
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol // the admin console speaks only that
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pglocal: pgbouncer admin console: %w", err)
	}
	return conn, nil
}

func (b *PgBouncer) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port)) }

// Port is the loopback TCP port PgBouncer listens on.
func (b *PgBouncer) Port() int { return b.port }

// ConnString returns the URL of database through PgBouncer as user (no
// password: auth is trust).
func (b *PgBouncer) ConnString(user, database string) string {
	return fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable", url.PathEscape(user), b.addr(), url.PathEscape(database))
}

// Rewrite returns dbURL (a URL of the cluster behind b) pointed at b:
// same user, password, database and parameters.
func (b *PgBouncer) Rewrite(dbURL string) (string, error) {
	u, err := url.Parse(dbURL)
	if err != nil {
		return "", fmt.Errorf("pglocal: %w", err)
	}
	u.Host = b.addr()
	return u.String(), nil
}

// Transactions returns how many transactions PgBouncer has passed to
// database so far (SHOW STATS on its admin console): proof that traffic
// went through it.
func (b *PgBouncer) Transactions(ctx context.Context, database string) (int64, error) {
	conn, err := b.admin(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, "SHOW STATS")
	if err != nil {
		return 0, fmt.Errorf("pglocal: SHOW STATS: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		raw := rows.RawValues() // the simple protocol's text
		var db string
		var xacts int64 = -1
		for i, f := range rows.FieldDescriptions() {
			switch f.Name {
			case "database":
				db = string(raw[i])
			case "total_xact_count":
				xacts, _ = strconv.ParseInt(string(raw[i]), 10, 64)
			}
		}
		if db == database {
			return xacts, nil
		}
	}
	return 0, rows.Err()
}

// Stop stops PgBouncer and removes its directory.
func (b *PgBouncer) Stop() {
	b.stop.Do(func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		_ = b.cmd.Process.Signal(syscall.SIGINT) // immediate shutdown
		select {
		case <-b.done:
		case <-time.After(5 * time.Second):
			_ = b.cmd.Process.Kill()
			<-b.done
		}
		os.RemoveAll(b.dir)
	})
}

func (b *PgBouncer) logTail() string {
	data, err := os.ReadFile(filepath.Join(b.dir, "pgbouncer.log"))
	if err != nil {
		return fmt.Sprintf("(no pgbouncer log: %v)", err)
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	return "pgbouncer log (tail):\n" + strings.Join(lines[max(0, len(lines)-20):], "\n")
}
