package main

import (
	"context"
	"fmt"

	"github.com/ledgerline/outbox/migrations"
	"github.com/ledgerline/outbox/poolconfig"
)

func runMigrate(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet(env, "migrate", "migrate [flags] [up|status|notify-on|notify-off|ordering-on|ordering-off]")
	var db dbFlags
	db.register(fs, poolconfig.Migrator())
	logFormat := fs.String("log-format", "text", "log format: text or json")
	createRoles := fs.Bool("create-roles", false, "up: then create the outbox roles, make outbox_owner the owner, grant each role its privileges and turn on row-level security by tenant (as a superuser; docs/audit.md)")
	lockTry := fs.Duration("lock-try", migrations.DefaultLockTry, "up, --create-roles: how long one try waits for a table's lock before it rolls back and lets the enqueues and claims queued behind it through, trying again until --lock-timeout has passed")
	printRoles := fs.Bool("print-roles", false, "print the statements --create-roles runs, for those who manage roles themselves, and exit")
	if _, err := parseFlags(fs, env, args); err != nil {
		return err
	}
	if *printRoles {
		sql, err := migrations.RolesSQL(db.schema)
		if err != nil {
			return fmt.Errorf("%w: %v", errUsage, err)
		}
		fmt.Fprint(env.stdout, sql)
		return nil
	}
	if *lockTry < 0 {
		return fmt.Errorf("%w: --lock-try %s is negative", errUsage, *lockTry)
	}
	action := "up"
	if fs.NArg() > 1 {
		return fmt.Errorf("%w: migrate takes one action", errUsage)
	}
	if fs.NArg() == 1 {
		action = fs.Arg(0)
	}
	log, err := newLogger(env.stderr, *logFormat, "info")
	if err != nil {
		return err
	}
	if db.behindTransactionPooler() && action != "status" {
		return fmt.Errorf("%w: migrate %s takes a session-level lock, which a transaction pooler cannot keep (it would stay held by a pooled server session): run it with a direct database URL, not through the pooler", errUsage, action)
	}
	pool, cleanup, err := db.connect(ctx, log, 2)
	if err != nil {
		return err
	}
	defer cleanup()

	switch action {
	case "up":
		if err := migrations.MigrateWith(ctx, pool, migrations.Options{Schema: db.schema, LockTimeout: db.settings.LockTimeout, LockTry: *lockTry}); err != nil {
			return err
		}
		if *createRoles {
			if err := migrations.CreateRolesWith(ctx, pool, migrations.RolesOptions{Schema: db.schema, LockTimeout: db.settings.LockTimeout, LockTry: *lockTry}); err != nil {
				return err
			}
			// The status line that follows names the schema.
			fmt.Fprintf(env.stdout, "roles %s, %s, %s, %s, %s ready\n", migrations.RoleOwner, migrations.RoleProducer, migrations.RoleRelayer, migrations.RoleAuditor, migrations.RoleOperator)
		}
		fallthrough
	case "status":
		st, err := migrations.GetStatus(ctx, pool, db.schema)
		if err != nil {
			return err
		}
		notify, ordering := "n/a", "n/a"
		if st.Current > 0 {
			on, err := migrations.NotifyEnabled(ctx, pool, db.schema)
			if err != nil {
				return err
			}
			notify = onOff(on)
		}
		if st.Current >= 5 { // the version that added the setting
			on, err := migrations.Ordered(ctx, pool, db.schema)
			if err != nil {
				return err
			}
			ordering = onOff(on)
		}
		fmt.Fprintf(env.stdout, "schema %s: version %d of %d, notify trigger %s, ordering %s\n", st.Schema, st.Current, st.Latest, notify, ordering)
		return nil
	case "ordering-on", "ordering-off":
		on := action == "ordering-on"
		if err := migrations.SetOrdered(ctx, pool, db.schema, on); err != nil {
			return err
		}
		fmt.Fprintf(env.stdout, "schema %s: ordering %s\n", db.schema, onOff(on))
		return nil
	case "notify-on", "notify-off":
		on := action == "notify-on"
		if err := migrations.SetNotify(ctx, pool, db.schema, on); err != nil {
			return err
		}
		fmt.Fprintf(env.stdout, "schema %s: notify trigger %s\n", db.schema, onOff(on))
		return nil
	default:
		return fmt.Errorf("%w: unknown migrate action %q (want up, status, notify-on, notify-off, ordering-on or ordering-off)", errUsage, action)
	}
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}
