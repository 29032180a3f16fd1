package migrations

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The roles [CreateRoles] sets up (docs/audit.md says which process uses
// which).
const (
	// RoleOwner owns the schema and runs migrations; nothing else.
	RoleOwner = "outbox_owner"
	// RoleProducer enqueues and reads its own receipts.
	RoleProducer = "outbox_producer"
	// RoleRelayer claims, dispatches, records, reaps, checkpoints and keeps
	// the partitions ahead; no DDL, no UPDATE, DELETE or TRUNCATE on the
	// archive.
	RoleRelayer = "outbox_relayer"
	// RoleAuditor reads everything and writes nothing.
	RoleAuditor = "outbox_auditor"
	// RoleOperator reads what an auditor reads, and replays and
	// acknowledges dead letters through the functions that record who did.
	RoleOperator = "outbox_operator"
)

// TenantSetting is the session setting that scopes producer, auditor and
// operator sessions to one tenant under row-level security: "" (or unset)
// means the rows without a tenant, "*" every tenant. Set it per
// transaction with SELECT set_config('outbox.tenant', $1, true).
const TenantSetting = "outbox.tenant"

//go:embed roles/roles.sql
var rolesSQL string

// RolesSQL returns the statements [CreateRoles] runs for schema: what an
// administrator who manages roles by hand reviews and runs.
func RolesSQL(schema string) (string, error) {
	if err := ValidateSchema(schema); err != nil {
		return "", err
	}
	return strings.ReplaceAll(rolesSQL, "{{schema}}", orDefault(schema)), nil
}

// RolesOptions tune [CreateRolesWith].
type RolesOptions struct {
	// Schema whose roles to set up; "" means DefaultSchema.
	Schema string
	// LockTimeout bounds the wait for the migration lock (a migrator, or
	// a session that still holds it), which fails with a
	// [*LockTimeoutError], and the tries at the tables' locks (LockTry);
	// 0 means DefaultLockTimeout. Either way nothing is changed.
	LockTimeout time.Duration
	// LockTry bounds one try of the script at the tables' locks, as
	// Options.LockTry a migration's; 0 means DefaultLockTry. Not taken
	// within LockTimeout, they fail with a [*MigrationLockError], and
	// nothing is changed.
	LockTry time.Duration
}

// CreateRoles is [CreateRolesWith] with only a schema (and so
// DefaultLockTimeout).
func CreateRoles(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	return CreateRolesWith(ctx, pool, RolesOptions{Schema: schema})
}

// CreateRolesWith creates the five outbox roles (if missing), makes
// outbox_owner the owner of the schema and everything in it, grants each
// role what it needs and nothing more, and turns on row-level security by
// tenant. It is idempotent; run it after migrating (a migration may add a
// table) as a superuser. Concurrent runs, and migrations, serialize on the
// migration lock.
func CreateRolesWith(ctx context.Context, pool *pgxpool.Pool, opts RolesOptions) error {
	if noDB(pool) {
		return fmt.Errorf("create roles: %w", ErrNoDB)
	}
	sql, err := RolesSQL(opts.Schema)
	if err != nil {
		return err
	}
	schema := orDefault(opts.Schema)
	timeout, _ := lockTimeoutSetting(opts.LockTimeout)
	try, _ := lockTimeoutSetting(min(lockTry(opts.LockTry), timeout))
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("create roles: %w", err)
	}
	defer conn.Release()
	// The script takes the exclusive lock of every table (owner, row-level
	// security, policies), each held to its commit: waiting for one in a
	// single go held up every enqueue and claim queued behind it for the
	// whole lock timeout. It waits in tries, as a migration does.
	return lockTries(ctx, conn.Conn(), "create roles", schema, "the roles script", timeout, try, func() error {
		return createRolesOnce(ctx, conn, sql, schema, timeout, try)
	})
}

// createRolesOnce runs the roles script once, in a transaction of its own
// on conn, waiting at most timeout for the migration lock and try for each
// table's lock.
func createRolesOnce(ctx context.Context, conn *pgxpool.Conn, sql, schema string, timeout, try time.Duration) error {
	_, timeoutMS := lockTimeoutSetting(timeout)
	_, tryMS := lockTimeoutSetting(try)
	// One transaction: a failure leaves the privileges as they were. The
	// lock and the lock_timeout are the transaction's own, so the pooled
	// session goes back with neither, whatever happens.
	tx, err := conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("create roles: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, "SELECT set_config('lock_timeout', $1, true)", timeoutMS); err != nil {
		return fmt.Errorf("create roles: set lock_timeout: %w", err)
	}
	// A transaction-level lock conflicts with MigrateWith's session-level
	// one on the same key.
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext($1))", lockName(schema)); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55P03" {
			_ = tx.Rollback(ctx)
			return lockTimeout(ctx, conn.Conn(), "create roles", schema, timeout, err)
		}
		return fmt.Errorf("create roles: take advisory lock: %w", err)
	}
	if _, err := tx.Exec(ctx, "SELECT set_config('lock_timeout', $1, true)", tryMS); err != nil {
		return fmt.Errorf("create roles: set lock_timeout: %w", err)
	}
	if _, err := tx.Exec(ctx, sql); err != nil {
		return fmt.Errorf("create roles: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("create roles: %w", err)
	}
	return nil
}
