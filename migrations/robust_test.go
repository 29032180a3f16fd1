package migrations_test

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/migrations"
)

// TestNilDatabaseIsAnError: every function that takes a pool or a
// connection answers a nil one with ErrNoDB instead of panicking inside
// pgx (a pool a program failed to open, say).
func TestNilDatabaseIsAnError(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	var pool *pgxpool.Pool
	var conn *pgx.Conn
	for name, call := range map[string]func() error{
		"Migrate":         func() error { return migrations.Migrate(ctx, pool) },
		"MigrateWith":     func() error { return migrations.MigrateWith(ctx, pool, migrations.Options{}) },
		"CreateRoles":     func() error { return migrations.CreateRoles(ctx, pool, "") },
		"GetStatus":       func() error { _, err := migrations.GetStatus(ctx, pool, ""); return err },
		"GetStatus conn":  func() error { _, err := migrations.GetStatus(ctx, conn, ""); return err },
		"GetStatus nil":   func() error { _, err := migrations.GetStatus(ctx, nil, ""); return err },
		"Ready":           func() error { _, err := migrations.Ready(ctx, pool, ""); return err },
		"SetNotify":       func() error { return migrations.SetNotify(ctx, pool, "", true) },
		"NotifyEnabled":   func() error { _, err := migrations.NotifyEnabled(ctx, pool, ""); return err },
		"SetOrdered":      func() error { return migrations.SetOrdered(ctx, pool, "", true) },
		"SetOrdered conn": func() error { return migrations.SetOrdered(ctx, conn, "", true) },
		"Ordered":         func() error { _, err := migrations.Ordered(ctx, pool, ""); return err },
	} {
		func() {
			defer func() {
				if p := recover(); p != nil {
					t.Errorf("%s with a nil database panicked: %v", name, p)
				}
			}()
			if err := call(); !errors.Is(err, migrations.ErrNoDB) {
				t.Errorf("%s with a nil database = %v, want an error wrapping ErrNoDB", name, err)
			}
		}()
	}
}

// TestCreateRolesLockTimeoutNamesTheHolder: CreateRoles serializes with
// migrators on the migration lock; a session that keeps it makes
// CreateRolesWith fail after the bound with the *LockTimeoutError
// MigrateWith gives, instead of waiting for as long as the session lives.
// Nothing is changed, and the pool's sessions keep their lock_timeout.
func TestCreateRolesLockTimeoutNamesTheHolder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	holdMigrationLock(t, b, "stuck-roles")

	ctx, cancel := context.WithTimeout(b.ctx, 20*time.Second)
	defer cancel()
	err := migrations.CreateRolesWith(ctx, b.pool, migrations.RolesOptions{LockTimeout: 200 * time.Millisecond})
	var lt *migrations.LockTimeoutError
	if !errors.As(err, &lt) {
		t.Fatalf("CreateRolesWith with the lock held: %v, want a *LockTimeoutError", err)
	}
	if len(lt.Holders) != 1 || lt.Holders[0].ApplicationName != "stuck-roles" {
		t.Errorf("holders %+v, want the stuck-roles session", lt.Holders)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "55P03" || !strings.Contains(err.Error(), "pg_terminate_backend") {
		t.Errorf("the error does not wrap the database's lock timeout or say what to do: %v", err)
	}
	// It said "migrate" whatever waited.
	if !strings.HasPrefix(err.Error(), "create roles outbox: ") || strings.Contains(err.Error(), "migrate") {
		t.Errorf("the error does not name what waited, creating the roles: %v", err)
	}
	var lockTimeout string
	if err := b.pool.QueryRow(b.ctx, "SHOW lock_timeout").Scan(&lockTimeout); err != nil || lockTimeout != "0" {
		t.Errorf("the pool's sessions kept lock_timeout %q (%v)", lockTimeout, err)
	}
}

// TestPublicSignaturesUseNoInternalType: every exported function takes
// and returns types a caller outside the module can name. SetOrdered took
// the internal store.TxBeginner: a pool or a connection still fitted it,
// but a program could not name the parameter's type (to wrap it, or to
// hold one in a field of its own).
func TestPublicSignaturesUseNoInternalType(t *testing.T) {
	t.Parallel()
	for name, fn := range map[string]any{
		"Ready": migrations.Ready, "ValidateSchema": migrations.ValidateSchema, "Migrate": migrations.Migrate,
		"MigrateWith": migrations.MigrateWith, "Latest": migrations.Latest, "GetStatus": migrations.GetStatus,
		"Hash": migrations.Hash, "SetNotify": migrations.SetNotify, "NotifyEnabled": migrations.NotifyEnabled,
		"SetOrdered": migrations.SetOrdered, "Ordered": migrations.Ordered, "RolesSQL": migrations.RolesSQL,
		"CreateRoles": migrations.CreateRoles, "CreateRolesWith": migrations.CreateRolesWith,
	} {
		ft := reflect.TypeOf(fn)
		var types []reflect.Type
		for i := range ft.NumIn() {
			types = append(types, ft.In(i))
		}
		for i := range ft.NumOut() {
			types = append(types, ft.Out(i))
		}
		for _, typ := range types {
			for typ.Kind() == reflect.Pointer || typ.Kind() == reflect.Slice {
				typ = typ.Elem()
			}
			if strings.Contains(typ.PkgPath(), "/internal/") {
				t.Errorf("%s uses %s.%s, which a caller cannot name", name, typ.PkgPath(), typ.Name())
			}
		}
	}
	// What callers have already fits the public interface.
	var _ migrations.TxBeginner = (*pgxpool.Pool)(nil)
	var _ migrations.TxBeginner = (*pgx.Conn)(nil)
}

// TestSwitchReadersOnASchemaBehindAreTyped: Ordered and NotifyEnabled
// read the switches, and a program asks them of a schema it names: on one
// never migrated, or (Ordered) before the setting existed (005), they
// failed with the database's "relation does not exist" or pgx's "no rows
// in result set", which say nothing of the schema. They are a
// *SchemaError now.
func TestSwitchReadersOnASchemaBehindAreTyped(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if err := migrations.MigrateWith(b.ctx, b.pool, migrations.Options{Schema: "readers4", TargetVersion: 4}); err != nil {
		t.Fatal(err)
	}
	var behind *migrations.SchemaError
	for _, schema := range []string{"readers_never", "readers4"} {
		if _, err := migrations.Ordered(b.ctx, b.pool, schema); !errors.As(err, &behind) {
			t.Errorf("Ordered on %s: %v, want a *migrations.SchemaError", schema, err)
		}
	}
	if _, err := migrations.NotifyEnabled(b.ctx, b.pool, "readers_never"); !errors.As(err, &behind) {
		t.Errorf("NotifyEnabled on a schema never migrated: %v, want a *migrations.SchemaError", err)
	}
	if on, err := migrations.NotifyEnabled(b.ctx, b.pool, "readers4"); err != nil || !on {
		t.Errorf("NotifyEnabled on a schema at 4: %v, %v; want on", on, err)
	}
}
