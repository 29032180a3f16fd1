package migrations_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/migrations"
)

// A deploy step (or a program at start-up) migrates the outbox schema
// before producers and relayers use it. Any number of processes may
// migrate at once: they serialize on an advisory lock and all end at the
// latest version. Migrate with a direct database URL, not through a
// transaction-pooling proxy.
func ExampleMigrateWith() {
	ctx := context.Background()
	pool := testdb.ForExample() // the program's *pgxpool.Pool, as the schema's owner

	// A schema of its own ("" is the default, "outbox").
	const schema = "payments_outbox"
	// Ready is what a relayer checks at Start: a schema that is not
	// migrated, or behind this build, is a *SchemaError.
	before, err := migrations.Ready(ctx, pool, schema)
	var behind *migrations.SchemaError
	fmt.Println("before: refused", errors.As(err, &behind), "at version", before.Current)
	if err := migrations.MigrateWith(ctx, pool, migrations.Options{Schema: schema, LockTimeout: 30 * time.Second}); err != nil {
		var held *migrations.LockTimeoutError
		if errors.As(err, &held) {
			fmt.Println("another session holds the migration lock:", held.Holders)
		}
		panic(err)
	}
	st, err := migrations.Ready(ctx, pool, schema)
	fmt.Println("after: ready", err == nil, "at the latest version", st.Current == migrations.Latest())
	// Output:
	// before: refused true at version 0
	// after: ready true at the latest version true
}

// Per-participant ordering is switched with the relayers stopped, with
// what the program already has: a *pgxpool.Pool or a *pgx.Conn (any
// [migrations.TxBeginner]).
func ExampleSetOrdered() {
	ctx := context.Background()
	pool := testdb.ForExample() // the program's *pgxpool.Pool, as the schema's owner

	const schema = "unordered_outbox"
	if err := migrations.MigrateWith(ctx, pool, migrations.Options{Schema: schema}); err != nil {
		panic(err)
	}
	var db migrations.TxBeginner = pool
	if err := migrations.SetOrdered(ctx, db, schema, false); err != nil {
		panic(err) // in flight instructions: stop the relayers first
	}
	on, err := migrations.Ordered(ctx, pool, schema)
	fmt.Println("ordered:", on, err)
	// Output:
	// ordered: false <nil>
}
