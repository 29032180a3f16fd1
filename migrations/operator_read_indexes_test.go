package migrations_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ledgerline/outbox/migrations"
)

// TestOperatorReadIndexesBuiltBeforehand: migration 049's indexes (pending
// by rail and outbox id, the pause events by time) may be built
// beforehand with CREATE INDEX CONCURRENTLY, so that enqueues and claims
// do not wait for the build. One built that way is kept; one a failed
// concurrent build left invalid is built again, not taken as it is (kept
// up by every enqueue and read by no query); one of that name defined
// otherwise stops the migration, changing nothing, with the statement to
// build it in its hint.
func TestOperatorReadIndexesBuiltBeforehand(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const schema = "reads_prebuilt"
	if err := migrations.MigrateWith(b.ctx, b.pool, migrations.Options{Schema: schema, TargetVersion: 48}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(b.ctx, `CREATE INDEX CONCURRENTLY rail_pause_events_at_idx ON reads_prebuilt.rail_pause_events (at, event_id)`); err != nil {
		t.Fatal(err)
	}
	var prebuilt uint32
	if err := b.pool.QueryRow(b.ctx, `SELECT 'reads_prebuilt.rail_pause_events_at_idx'::regclass::oid`).Scan(&prebuilt); err != nil {
		t.Fatal(err)
	}
	// The pending one's concurrent build fails behind a producer's open
	// transaction, leaving it invalid.
	writer, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Rollback(context.Background())
	if _, err := writer.Exec(b.ctx, "LOCK TABLE reads_prebuilt.pending IN ROW EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	builder, err := b.pool.Acquire(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := builder.Exec(b.ctx, "SET lock_timeout = '200ms'"); err != nil {
		t.Fatal(err)
	}
	_, err = builder.Exec(b.ctx, `CREATE INDEX CONCURRENTLY pending_rail_outbox_idx ON reads_prebuilt.pending (rail_type, outbox_id)`)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "55P03" {
		t.Fatalf("the concurrent build behind a writer: %v, want a lock timeout", err)
	}
	builder.Hijack().Close(b.ctx) // with its lock_timeout
	if err := writer.Rollback(b.ctx); err != nil {
		t.Fatal(err)
	}
	valid := func(name string) bool {
		t.Helper()
		var v bool
		if err := b.pool.QueryRow(b.ctx, `SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1)`, schema+"."+name).Scan(&v); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return v
	}
	if valid("pending_rail_outbox_idx") {
		t.Fatal("the failed concurrent build left a valid index")
	}

	if err := migrations.MigrateWith(b.ctx, b.pool, migrations.Options{Schema: schema}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"pending_rail_outbox_idx", "rail_pause_events_at_idx"} {
		if !valid(name) {
			t.Errorf("%s is invalid after the migrations", name)
		}
	}
	var events uint32
	if err := b.pool.QueryRow(b.ctx, `SELECT 'reads_prebuilt.rail_pause_events_at_idx'::regclass::oid`).Scan(&events); err != nil || events != prebuilt {
		t.Errorf("the index built beforehand was replaced (%d, was %d; %v)", events, prebuilt, err)
	}

	// One of that name defined otherwise stops the migration.
	const other = "reads_otherwise"
	if err := migrations.MigrateWith(b.ctx, b.pool, migrations.Options{Schema: other, TargetVersion: 48}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(b.ctx, `CREATE INDEX pending_rail_outbox_idx ON reads_otherwise.pending (rail_type)`); err != nil {
		t.Fatal(err)
	}
	err = migrations.MigrateWith(b.ctx, b.pool, migrations.Options{Schema: other})
	if !errors.As(err, &pgErr) || pgErr.Code != "55000" ||
		!strings.Contains(pgErr.Hint, "CREATE INDEX CONCURRENTLY pending_rail_outbox_idx ON reads_otherwise.pending (rail_type, outbox_id);") {
		t.Fatalf("migrating with an index of that name defined otherwise: %v, want 55000 with the statement in its hint", err)
	}
	if st, err := migrations.GetStatus(b.ctx, b.pool, other); err != nil || st.Current == st.Latest {
		t.Fatalf("status %+v, %v: want the migration not applied", st, err)
	}
}
