// Package migrations owns the outbox schema: the embedded, append-only SQL
// files and [Migrate], which applies them with tern under an advisory lock so
// that any number of processes can migrate at once.
//
// Every table lives in one schema, "outbox" by default; the statements that
// use the tables are rendered for it by the internal store package.
package migrations

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/tern/v2/migrate"

	"github.com/ledgerline/outbox/internal/store"
)

// DefaultSchema is the schema used when none is configured.
const DefaultSchema = store.DefaultSchema

// NotifyChannel is the channel the pending insert trigger notifies.
const NotifyChannel = "outbox_pending"

//go:embed sql/*.sql
var files embed.FS

// ErrInvalidSchema is returned for schema names that are not plain
// lower-case identifiers, are SQL keywords, or name a system or shared
// schema (public, information_schema, pg_*).
var ErrInvalidSchema = store.ErrInvalidSchema

// ErrNoDB is wrapped by the errors the functions of this package return
// when given a nil pool or connection.
var ErrNoDB = errors.New("migrations: no database (nil pool or connection)")

// ErrTransactionPooler is wrapped by MigrateWith's error when its
// connection goes through a transaction pooler (PgBouncer pool_mode =
// transaction): the server session changes between its statements, so
// the session-level lock it keeps across the migrations would stay on a
// pooled server session.
var ErrTransactionPooler = errors.New("migrations: the connection goes through a transaction pooler")

// ValidateSchema checks a schema name; the empty string means [DefaultSchema].
func ValidateSchema(schema string) error { return store.ValidateSchema(schema) }

// noDB reports whether db is nil, or a nil pointer in an interface (a
// nil *pgxpool.Pool passed as a DB), on which pgx would panic.
func noDB(db any) bool {
	if db == nil {
		return true
	}
	v := reflect.ValueOf(db)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

// orDefault maps "" to DefaultSchema.
func orDefault(schema string) string {
	if schema == "" {
		return DefaultSchema
	}
	return schema
}

// Options tune [MigrateWith].
type Options struct {
	// Schema to migrate; "" means DefaultSchema.
	Schema string
	// TargetVersion to reach; 0 means the latest.
	TargetVersion int32
	// LockTimeout bounds the wait for the migration lock (another migrator,
	// or a session that still holds it), which fails with a
	// [*LockTimeoutError], and each migration's wait for the locks its
	// statements need, which fails with a [*MigrationLockError]; 0 means
	// DefaultLockTimeout. Either way the migration that waited writes
	// nothing.
	LockTimeout time.Duration
	// LockTry bounds one try of a migration at its locks; 0 means
	// DefaultLockTry (never more than LockTimeout). A migration waiting
	// for a table's lock holds up every statement that comes after it on
	// that table (a producer's enqueue, a relayer's claim), so it waits in
	// tries this short: after each it rolls back, lets what queued behind
	// it through for as long again, and tries again, until LockTimeout
	// has passed since its first try.
	LockTry time.Duration
}

// DefaultLockTimeout is Options.LockTimeout's default.
const DefaultLockTimeout = time.Minute

// DefaultLockTry is Options.LockTry's default: well under the lock
// timeout of a producer, a relayer and an operator command (5 s by
// default, poolconfig), so that what queues behind a try waits for it
// instead of failing.
const DefaultLockTry = time.Second

// Migrate brings the default schema up to the latest version.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	return MigrateWith(ctx, pool, Options{})
}

// MigrateWith migrates the schema in opts. It takes a session advisory lock
// (keyed by schema) before anything else, schema creation included, so
// concurrent migrators serialize and all end at the same version; through a
// transaction pooler, which cannot keep that lock, it refuses with
// [ErrTransactionPooler]. Each migration waits for its tables' locks in
// tries of opts.LockTry, so that the traffic queued behind it is held up
// a try at a time, and gives up after opts.LockTimeout with a
// [*MigrationLockError].
func MigrateWith(ctx context.Context, pool *pgxpool.Pool, opts Options) error {
	if noDB(pool) {
		return fmt.Errorf("migrate: %w", ErrNoDB)
	}
	if err := ValidateSchema(opts.Schema); err != nil {
		return err
	}
	schema := orDefault(opts.Schema)
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("migrate: acquire connection: %w", err)
	}
	// The connection goes back to no pool: tern resets every session
	// setting after each migration (RESET ALL), which would hand the
	// caller's pool a connection without the settings its AfterConnect
	// made. It is closed, after the unlock below, with whatever it holds.
	defer func() { _ = conn.Hijack().Close(context.WithoutCancel(ctx)) }()

	if err := ownSession(ctx, pool, conn.Conn(), schema); err != nil {
		return err
	}
	timeout, timeoutMS := lockTimeoutSetting(opts.LockTimeout)
	// Session-level, for the lock wait and the first migration; set again
	// before each migration (OnStart below).
	if _, err := conn.Exec(ctx, "SELECT set_config('lock_timeout', $1, false)", timeoutMS); err != nil {
		return fmt.Errorf("migrate: set lock_timeout: %w", err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock(hashtext($1))", lockName(schema)); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55P03" {
			return lockTimeout(ctx, conn.Conn(), "migrate", schema, timeout, err)
		}
		return fmt.Errorf("migrate: take advisory lock: %w", err)
	}
	defer func() {
		// A fresh context: the unlock must happen even if ctx was cancelled,
		// or the pooled session keeps the lock.
		if _, err := conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock(hashtext($1))", lockName(schema)); err != nil {
			conn.Conn().Close(context.WithoutCancel(ctx))
		}
	}()

	// CREATE SCHEMA IF NOT EXISTS needs the CREATE privilege on the
	// database even when the schema exists, which outbox_owner, who
	// upgrades an installation set up with --create-roles, does not have.
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", schema).Scan(&exists); err != nil {
		return fmt.Errorf("migrate: look up schema %s: %w", schema, err)
	}
	if !exists {
		if _, err := conn.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+schema); err != nil {
			return fmt.Errorf("migrate: create schema %s: %w", schema, err)
		}
	} else if err := becomeOwner(ctx, conn.Conn(), schema); err != nil {
		return err
	}
	m, err := newMigrator(ctx, conn.Conn(), schema)
	if err != nil {
		return err
	}
	// tern's RESET ALL after each migration takes the lock timeout back to
	// the server's default (none, unless the role or the connection's
	// startup set one), so every migration after the first would wait for
	// its locks for as long as their holders keep them. OnStart runs in the
	// migration's transaction before its statements; a failure here aborts
	// that transaction, so the migration fails too.
	try, tryMS := lockTimeoutSetting(min(lockTry(opts.LockTry), timeout))
	var started time.Time // of the migration being tried
	m.OnStart = func(int32, string, string, string) {
		started = time.Now()
		_, _ = conn.Exec(ctx, "SELECT set_config('lock_timeout', $1, false)", tryMS)
	}
	target := opts.TargetVersion
	if target == 0 {
		target = int32(len(m.Migrations))
	}
	var (
		waiting int32     = -1 // the version whose tries are counted
		since   time.Time      // its first try's start
		tries   int
	)
	for {
		started = time.Time{}
		err := m.MigrateTo(ctx, target)
		if err == nil {
			return nil
		}
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "55P03" || ctx.Err() != nil {
			return fmt.Errorf("migrate %s to version %d: %w", schema, target, err)
		}
		current, verr := m.GetCurrentVersion(ctx)
		if verr != nil || current < 0 || current >= int32(len(m.Migrations)) {
			return errors.Join(fmt.Errorf("migrate %s to version %d: %w", schema, target, err), verr)
		}
		if started.IsZero() { // it failed before the migration began (tern's own lock)
			started = time.Now()
		}
		if current+1 != waiting {
			waiting, since, tries = current+1, started, 0
		}
		tries++
		waited := time.Since(since)
		if waited+try > timeout {
			return migrationLockError(ctx, conn.Conn(), "migrate", schema, m.Migrations[current].Sequence, m.Migrations[current].Name, tries, try, waited, err)
		}
		// As long as the try blocked them: what queued behind it runs.
		select {
		case <-ctx.Done():
			return fmt.Errorf("migrate %s to version %d: %w (waiting for locks: %w)", schema, target, ctx.Err(), err)
		case <-time.After(try):
		}
	}
}

// lockTry is a LockTry option with its default applied.
func lockTry(d time.Duration) time.Duration {
	if d <= 0 {
		return DefaultLockTry
	}
	return d
}

func lockName(schema string) string { return "outbox-migrate:" + schema }

// ownSession refuses a connection whose server session is not its own
// from one statement to the next (a transaction pooler), which would keep
// the migration lock on a pooled server session. A direct connection is
// told its server process's id at startup, the one pg_backend_pid()
// answers; a pooler answers its own. Behind one, a second connection
// opened for the purpose begins a transaction, and then conn asks again:
// a transaction pooler hands the server session conn just used to the
// second connection (PgBouncer reuses the most recent first), or conn a
// session other than its first (taken by the transaction). A session
// pooler does neither: each client keeps its server session to the end,
// as a migration needs.
func ownSession(ctx context.Context, pool *pgxpool.Pool, conn *pgx.Conn, schema string) error {
	refuse := func(how string) error {
		return fmt.Errorf("migrate %s: %w (%s): its session-level migration lock would stay held by a pooled server session; run it with a direct database URL",
			schema, ErrTransactionPooler, how)
	}
	var first int
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()", pgx.QueryExecModeSimpleProtocol).Scan(&first); err != nil {
		return fmt.Errorf("migrate: look up the server session: %w", err)
	}
	if uint32(first) == conn.PgConn().PID() {
		return nil // direct: the server process we connected to
	}
	other, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig.Copy())
	if err != nil {
		return fmt.Errorf("migrate: a second connection, to tell a session pooler from a transaction pooler: %w", err)
	}
	defer other.Close(context.WithoutCancel(ctx))
	tx, err := other.Begin(ctx)
	if err != nil {
		return fmt.Errorf("migrate: a second connection, to tell a session pooler from a transaction pooler: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	var taken, again int
	if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()", pgx.QueryExecModeSimpleProtocol).Scan(&taken); err != nil {
		return fmt.Errorf("migrate: look up the server session of a second connection: %w", err)
	}
	if taken == first {
		return refuse(fmt.Sprintf("a second connection got server process %d, which this one had just used", first))
	}
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()", pgx.QueryExecModeSimpleProtocol).Scan(&again); err != nil {
		return fmt.Errorf("migrate: look up the server session: %w", err)
	}
	if again != first {
		return refuse(fmt.Sprintf("its server process changed from %d to %d between two statements", first, again))
	}
	return nil
}

// becomeOwner makes the migrating session act as the schema's owner when
// it is another role it may become (a superuser upgrading a schema that
// --create-roles gave to outbox_owner). What a migration creates belongs to
// the role that runs it: created by a superuser, a new table was one the
// owner's functions could not read (036's tenant_bindings refused every
// producer's enqueue until --create-roles ran again), and a new function
// that runs as its owner ran as a superuser. The session is the migration's
// own and is closed afterwards, so the role goes with it (tern's RESET ALL
// between migrations leaves it).
func becomeOwner(ctx context.Context, conn *pgx.Conn, schema string) error {
	var owner string
	var other, may bool
	err := conn.QueryRow(ctx, `SELECT pg_get_userbyid(nspowner), nspowner <> (SELECT oid FROM pg_roles WHERE rolname = current_user),
		pg_has_role(current_user, nspowner, 'MEMBER') FROM pg_namespace WHERE nspname = $1`, schema).Scan(&owner, &other, &may)
	if err != nil {
		return fmt.Errorf("migrate: owner of schema %s: %w", schema, err)
	}
	if !other || !may {
		return nil // the owner itself, or a role that cannot act as it: as before
	}
	if _, err := conn.Exec(ctx, "SET ROLE "+pgx.Identifier{owner}.Sanitize()); err != nil {
		return fmt.Errorf("migrate: act as %s, the owner of schema %s: %w", owner, schema, err)
	}
	return nil
}

// lockTimeoutSetting is a LockTimeout option with its default applied, and
// as lock_timeout's value: whole milliseconds, rounded up, since 0 would
// mean no timeout at all.
func lockTimeoutSetting(d time.Duration) (time.Duration, string) {
	if d <= 0 {
		d = DefaultLockTimeout
	}
	return d, strconv.FormatInt(max(1, (d+time.Millisecond-1).Milliseconds()), 10)
}

// LockTimeoutError says that the migration lock of a schema could not be
// taken in time, and who holds it.
type LockTimeoutError struct {
	// Op is what waited for the lock: "migrate" or "create roles".
	Op      string
	Schema  string
	Waited  time.Duration
	Holders []LockHolder // empty if the holder ended meanwhile
	err     error
}

// LockHolder is a session holding a schema's migration lock.
type LockHolder struct {
	PID             int
	ApplicationName string
	State           string    // pg_stat_activity.state: "idle" for a session that just sits on it; "" where not shown
	Since           time.Time // when the session's state last changed; zero where the server does not show it
	ClientAddr      string
}

// Error implements error.
func (e *LockTimeoutError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s: the migration lock is still held after %s", e.Op, e.Schema, e.Waited)
	for _, h := range e.Holders {
		if h.Since.IsZero() {
			fmt.Fprintf(&b, "; held by pid %d (application %q, a session of another role)", h.PID, h.ApplicationName)
			continue
		}
		fmt.Fprintf(&b, "; held by pid %d (application %q, %s since %s, client %s)", h.PID, h.ApplicationName, h.State,
			h.Since.Format(time.RFC3339), h.ClientAddr)
	}
	b.WriteString(": if no migration is running, that session keeps the lock by mistake (a migration through a transaction pooler leaves it on a pooled server session): end it with SELECT pg_terminate_backend(pid), and run it again with a direct database URL")
	return b.String()
}

// Unwrap returns the database's lock timeout error.
func (e *LockTimeoutError) Unwrap() error { return e.err }

// lockTimeout builds the LockTimeoutError of a failed lock wait, looking up
// who holds the lock on the same connection.
func lockTimeout(ctx context.Context, conn *pgx.Conn, op, schema string, waited time.Duration, cause error) error {
	e := &LockTimeoutError{Op: op, Schema: schema, Waited: waited, err: cause}
	rows, err := conn.Query(ctx, `
		SELECT a.pid, coalesce(a.application_name, ''), coalesce(a.state, ''), coalesce(a.state_change, a.backend_start),
		       coalesce(host(a.client_addr), 'local')
		FROM pg_locks l JOIN pg_stat_activity a USING (pid)
		WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
		  AND ((l.classid::bigint << 32) | l.objid::bigint) = hashtext($1)::bigint`, lockName(schema))
	if err == nil {
		// A session of another role shows no state or times to a role
		// without pg_read_all_stats: left zero, the pid named all the same.
		e.Holders, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (LockHolder, error) {
			var h LockHolder
			var since *time.Time
			err := row.Scan(&h.PID, &h.ApplicationName, &h.State, &since, &h.ClientAddr)
			if since != nil {
				h.Since = *since
			}
			return h, err
		})
	}
	if err != nil {
		return errors.Join(e, fmt.Errorf("looking up the lock holder: %w", err))
	}
	return e
}

// MigrationLockError says that a migration (or the roles script of
// [CreateRolesWith]) could not get the locks its statements need within
// its LockTimeout, and who held locks on the schema's tables when it gave
// up. The migrations before it are applied; nothing of it is written.
type MigrationLockError struct {
	// Op is what waited: "migrate" or "create roles".
	Op     string
	Schema string
	// Version and Name are the migration's: 39 and
	// "039_retry_time_behind_a_replay.sql"; 0 and "the roles script" for
	// CreateRolesWith.
	Version int32
	Name    string
	// Tries of Try each, the last ending Waited after the first began.
	Tries  int
	Try    time.Duration
	Waited time.Duration
	// Holders are the other sessions holding locks on tables of the
	// schema (indexes left out), the oldest transaction first: the one
	// the migration waited for among them, unless it ended meanwhile.
	Holders []TableLockHolder
	err     error
}

// TableLockHolder is a session holding locks on tables of a schema.
type TableLockHolder struct {
	PID             int
	ApplicationName string    // its backend type where it has none: "autovacuum worker"
	State           string    // pg_stat_activity.state: "idle in transaction" for a transaction left open
	Since           time.Time // when its transaction began; zero where the server does not show it
	ClientAddr      string
	Locks           []string // table and mode: "outbox.pending RowExclusiveLock"
}

// Error implements error.
func (e *MigrationLockError) Error() string {
	var b strings.Builder
	what := e.Name
	if e.Version > 0 {
		what = "migration " + e.Name
	}
	fmt.Fprintf(&b, "%s %s: %s could not take its locks in %s (%d tries of %s, each followed by as long for the statements queued behind it), and wrote nothing",
		e.Op, e.Schema, what, e.Waited.Round(time.Millisecond), e.Tries, e.Try)
	for _, h := range e.Holders {
		who := fmt.Sprintf("%s, in a transaction since %s, client %s", h.State, h.Since.Format(time.RFC3339), h.ClientAddr)
		if h.Since.IsZero() {
			who = "a session of another role"
		}
		fmt.Fprintf(&b, "; pid %d (application %q, %s) holds %s", h.PID, h.ApplicationName, who, strings.Join(h.Locks, ", "))
	}
	b.WriteString(": end or wait out the long transaction, then run it again")
	if e.Version > 0 {
		b.WriteString(" (the migrations before it are applied)")
	}
	return b.String()
}

// Unwrap returns the last try's error (the database's lock timeout).
func (e *MigrationLockError) Unwrap() error { return e.err }

// querier is what looks up the holders of a lock: *pgx.Conn and
// *pgxpool.Pool.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// lockTries runs once until it succeeds or fails otherwise than on a lock
// timeout (55P03), each failed try followed by as long a pause, for at most
// timeout: what waits for a table's lock holds up every statement queued
// behind it on that table (enqueues, claims), so it waits a try at a time.
// Given up, it is a *MigrationLockError naming what (op, name) waited and
// who held the schema's tables, looked up through q (none when nil).
func lockTries(ctx context.Context, q querier, op, schema, name string, timeout, try time.Duration, once func() error) error {
	since := time.Now()
	for tries := 1; ; tries++ {
		err := once()
		var pgErr *pgconn.PgError
		var held *LockTimeoutError
		if err == nil || errors.As(err, &held) || !errors.As(err, &pgErr) || pgErr.Code != "55P03" || ctx.Err() != nil {
			return err
		}
		if waited := time.Since(since); waited+try > timeout {
			return migrationLockError(ctx, q, op, schema, 0, name, tries, try, waited, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s %s: %w (waiting for locks: %w)", op, schema, ctx.Err(), err)
		case <-time.After(try):
		}
	}
}

// lockTryBeginner begins transactions whose lock waits are bounded by a
// try (lock_timeout, local to the transaction).
type lockTryBeginner struct {
	db    TxBeginner
	tryMS string
}

// BeginTx implements TxBeginner.
func (b lockTryBeginner) BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error) {
	tx, err := b.db.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	if _, err := tx.Exec(ctx, "SELECT set_config('lock_timeout', $1, true)", b.tryMS); err != nil {
		_ = tx.Rollback(ctx)
		return nil, err
	}
	return tx, nil
}

// migrationLockError builds the MigrationLockError of a migration that gave
// up, looking up through q who holds locks on the schema's tables.
func migrationLockError(ctx context.Context, q querier, op, schema string, version int32, name string, tries int, try, waited time.Duration, cause error) error {
	e := &MigrationLockError{Op: op, Schema: schema, Version: version, Name: name, Tries: tries, Try: try, Waited: waited, err: cause}
	if q == nil {
		return e
	}
	rows, err := q.Query(ctx, `
		SELECT a.pid, coalesce(nullif(a.application_name, ''), a.backend_type, ''), coalesce(a.state, ''),
		       coalesce(a.xact_start, a.backend_start), coalesce(host(a.client_addr), 'local'),
		       array_agg(l.relation::regclass::text || ' ' || l.mode ORDER BY l.relation::regclass::text, l.mode)
		FROM pg_locks l
		JOIN pg_class c ON c.oid = l.relation
		JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'relation' AND l.granted AND c.relnamespace = $1::regnamespace AND c.relkind IN ('r', 'p')
		  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
		  AND l.pid <> pg_backend_pid()
		GROUP BY 1, 2, 3, 4, 5
		ORDER BY 4, 1
		LIMIT 10`, schema)
	if err == nil {
		// A session of another role (autovacuum's too) shows no state or
		// times to a role without pg_read_all_stats: left zero.
		e.Holders, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (TableLockHolder, error) {
			var h TableLockHolder
			var since *time.Time
			err := row.Scan(&h.PID, &h.ApplicationName, &h.State, &since, &h.ClientAddr, &h.Locks)
			if since != nil {
				h.Since = *since
			}
			return h, err
		})
	}
	if err != nil {
		return errors.Join(e, fmt.Errorf("looking up the lock holders: %w", err))
	}
	return e
}

func newMigrator(ctx context.Context, conn *pgx.Conn, schema string) (*migrate.Migrator, error) {
	m, err := migrate.NewMigrator(ctx, conn, schema+".schema_version")
	if err != nil {
		return nil, fmt.Errorf("migrate: version table: %w", err)
	}
	sub, err := fs.Sub(files, "sql")
	if err != nil {
		return nil, err
	}
	// Templates are rendered while loading, so the data comes first.
	m.Data["schema"] = schema
	if err := m.LoadMigrations(sub); err != nil {
		return nil, fmt.Errorf("migrate: load migrations: %w", err)
	}
	return m, nil
}

// DB is the part of a connection these helpers use; *pgxpool.Pool,
// *pgx.Conn and pgx.Tx all satisfy it.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Status is where a schema stands.
type Status struct {
	Schema  string
	Current int32 // applied version; 0 when the schema is not migrated
	Latest  int32 // the newest version this build knows
}

// Latest returns the number of embedded migrations.
func Latest() int32 {
	names, _ := fs.Glob(files, "sql/*.sql")
	return int32(len(names))
}

// GetStatus reports the applied and latest version of a schema, without
// changing anything.
func GetStatus(ctx context.Context, db DB, schema string) (Status, error) {
	if noDB(db) {
		return Status{}, fmt.Errorf("schema status: %w", ErrNoDB)
	}
	if err := ValidateSchema(schema); err != nil {
		return Status{}, err
	}
	s := Status{Schema: orDefault(schema), Latest: Latest()}
	var exists bool
	err := db.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", s.Schema+".schema_version").Scan(&exists)
	if err != nil || !exists {
		return s, err
	}
	err = db.QueryRow(ctx, "SELECT version FROM "+s.Schema+".schema_version").Scan(&s.Current)
	return s, err
}

// Hash identifies the embedded migrations (for test template caching).
func Hash() string {
	h := sha256.New()
	names, _ := fs.Glob(files, "sql/*.sql")
	for _, n := range names {
		b, _ := files.ReadFile(n)
		h.Write([]byte(n))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// SetNotify switches the adaptive NOTIFY trigger on pending inserts on or
// off. With it off, relayers find work by polling only and producers never
// pay for NOTIFY. It waits for pending's lock in tries of DefaultLockTry
// for up to DefaultLockTimeout, then fails with a [*MigrationLockError];
// given the caller's transaction (a pgx.Tx), each try is a savepoint of
// it. A schema never migrated is a [*SchemaError], nothing changed.
func SetNotify(ctx context.Context, db DB, schema string, enabled bool) error {
	if noDB(db) {
		return fmt.Errorf("set notify: %w", ErrNoDB)
	}
	if err := ValidateSchema(schema); err != nil {
		return err
	}
	// A schema never migrated (a --schema misspelt) has no trigger to
	// switch: say so, not the database's "schema does not exist". Every
	// migrated version has the trigger (001).
	if st, err := GetStatus(ctx, db, schema); err != nil {
		return fmt.Errorf("set notify: %w", err)
	} else if st.Current == 0 {
		return &SchemaError{Status: st}
	}
	verb := "DISABLE"
	if enabled {
		verb = "ENABLE"
	}
	schema = orDefault(schema)
	_, tryMS := lockTimeoutSetting(DefaultLockTry)
	// The trigger's switch takes pending's SHARE ROW EXCLUSIVE lock, which
	// enqueues queue behind while it waits: it waits in tries, as a
	// migration does, with lock_timeout its own (set and put back in one
	// statement: db may be the caller's transaction). The schema is a
	// validated identifier and the try a number of ours.
	stmt := `DO $$ DECLARE was text := current_setting('lock_timeout'); BEGIN
			PERFORM set_config('lock_timeout', '` + tryMS + `', true);
			ALTER TABLE ` + schema + `.pending ` + verb + ` TRIGGER pending_notify;
			PERFORM set_config('lock_timeout', was, true);
			END $$`
	once := func() error {
		_, err := db.Exec(ctx, stmt)
		return err
	}
	if tx, ok := db.(pgx.Tx); ok {
		// A try refused on its lock aborts the transaction it ran in: in
		// the caller's, every later try failed at once (25P02). Each try
		// is a savepoint of it, rolled back alone.
		once = func() error {
			return pgx.BeginFunc(ctx, tx, func(sp pgx.Tx) error {
				_, err := sp.Exec(ctx, stmt)
				return err
			})
		}
	}
	q, _ := db.(querier)
	return lockTries(ctx, q, "notify", schema, "the notify trigger's switch", DefaultLockTimeout, DefaultLockTry, once)
}

// NotifyEnabled reports whether the adaptive NOTIFY trigger is enabled. A
// schema never migrated is a [*SchemaError].
func NotifyEnabled(ctx context.Context, db DB, schema string) (bool, error) {
	if noDB(db) {
		return false, fmt.Errorf("notify: %w", ErrNoDB)
	}
	if err := ValidateSchema(schema); err != nil {
		return false, err
	}
	var enabled bool
	err := db.QueryRow(ctx, `
		SELECT t.tgenabled <> 'D' FROM pg_trigger t
		WHERE t.tgrelid = to_regclass($1) AND t.tgname = 'pending_notify'`,
		orDefault(schema)+".pending").Scan(&enabled)
	if errors.Is(err, pgx.ErrNoRows) {
		// No trigger because no table: a schema never migrated (every
		// migrated version has it, 001), which pgx's "no rows" did not say.
		if st, serr := GetStatus(ctx, db, schema); serr == nil && st.Current == 0 {
			return false, &SchemaError{Status: st}
		}
	}
	return enabled, err
}

// TxBeginner is what [SetOrdered] needs of a connection: a transaction
// of its own (the switch locks the queue's tables, checks that nothing is
// in flight and flips the setting in one transaction). *pgxpool.Pool and
// *pgx.Conn satisfy it. It is declared here, not taken from an internal
// package, so that a program can name it.
type TxBeginner interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// SetOrdered switches per-participant ordering on or off for a schema (see
// docs/architecture.md): on, a participant's instructions are dispatched
// one at a time in sequence order; off, any due instruction may be
// dispatched, concurrently with others of its participant. It refuses
// while instructions are in flight: stop the relayers first. The schema
// must be at this build's version, as for the relayers (it keeps the
// retry times of migration 039): one behind is a [*SchemaError], nothing
// changed. It waits for the tables' locks in tries of DefaultLockTry for
// up to DefaultLockTimeout, then fails with a [*MigrationLockError].
func SetOrdered(ctx context.Context, db TxBeginner, schema string, on bool) error {
	if noDB(db) {
		return fmt.Errorf("set ordering: %w", ErrNoDB)
	}
	st, err := store.New(schema)
	if err != nil {
		return err
	}
	// Checked first, not left to the statements: on a schema before 039
	// they failed with the database's "column does not exist", which
	// says nothing of what to do. Read in a read-only transaction of its
	// own: db only begins them.
	if err := pgx.BeginTxFunc(ctx, db, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		_, err := Ready(ctx, tx, schema)
		return err
	}); err != nil {
		return fmt.Errorf("set ordering: %w", err)
	}
	// The switch locks sequences, pending and inflight, which enqueues and
	// claims queue behind while it waits: it waits in tries, as a
	// migration does.
	_, tryMS := lockTimeoutSetting(DefaultLockTry)
	q, _ := db.(querier)
	return lockTries(ctx, q, "ordering", st.Schema(), "the ordering switch", DefaultLockTimeout, DefaultLockTry, func() error {
		return st.SetOrdered(ctx, lockTryBeginner{db: db, tryMS: tryMS}, on)
	})
}

// Ordered reports whether per-participant ordering is on for a schema.
// A schema before the setting (migration 005), or never migrated, is a
// [*SchemaError].
func Ordered(ctx context.Context, db DB, schema string) (bool, error) {
	if noDB(db) {
		return false, fmt.Errorf("ordering: %w", ErrNoDB)
	}
	st, err := store.New(schema)
	if err != nil {
		return false, err
	}
	// The setting came with migration 005: on a schema before it (or
	// never migrated), say so rather than fail on the missing table,
	// which would also abort db's transaction if it is one.
	var exists bool
	if err := db.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", st.Schema()+".settings").Scan(&exists); err != nil {
		return false, fmt.Errorf("ordering: %w", err)
	}
	if !exists {
		status, err := GetStatus(ctx, db, schema)
		if err != nil {
			return false, fmt.Errorf("ordering: %w", err)
		}
		return false, &SchemaError{Status: status}
	}
	var on bool
	if err := db.QueryRow(ctx, st.Qualify("SELECT ordered FROM {schema}.settings")).Scan(&on); err != nil {
		return false, fmt.Errorf("ordering: %w", err)
	}
	return on, nil
}
