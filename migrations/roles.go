package migrations

import (
	"context"
	_ "embed"
	"fmt"
	"strings"

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

// CreateRoles creates the five outbox roles (if missing), makes
// outbox_owner the owner of the schema and everything in it, grants each
// role what it needs and nothing more, and turns on row-level security by
// tenant. It is idempotent; run it after migrating (a migration may add a
// table) as a superuser. Concurrent runs serialize on the migration lock.
func CreateRoles(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	sql, err := RolesSQL(schema)
	if err != nil {
		return err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("create roles: %w", err)
	}
	defer conn.Release()
	name := lockName(orDefault(schema))
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock(hashtext($1))", name); err != nil {
		return fmt.Errorf("create roles: take advisory lock: %w", err)
	}
	defer conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock(hashtext($1))", name)
	// One transaction: a failure leaves the privileges as they were.
	tx, err := conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("create roles: %w", err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, sql); err != nil {
		return fmt.Errorf("create roles: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("create roles: %w", err)
	}
	return nil
}
