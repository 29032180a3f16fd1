package migrations_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ledgerline/outbox/migrations"
)

// TestDeadLetterIndexesBuiltBeforehand: docs/operations.md tells upgraders
// to build 045's indexes on dead_letters beforehand, concurrently, so that
// outcome writes keep running; the migration then takes them as they are.
// A concurrent build that fails (here on its lock_timeout, behind a
// transaction writing dead letters) leaves an invalid index of that name,
// which 045's CREATE INDEX IF NOT EXISTS took as it was: kept up by every
// write, read by no query. After the latest migration both indexes must be
// valid, one built beforehand and valid must be the same index, and one of
// that name defined otherwise must stop the migration with a hint.
func TestDeadLetterIndexesBuiltBeforehand(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const schema = "dl_prebuilt"
	if err := migrations.MigrateWith(b.ctx, b.pool, migrations.Options{Schema: schema, TargetVersion: 44}); err != nil {
		t.Fatal(err)
	}
	// The open one built beforehand, valid.
	if _, err := b.pool.Exec(b.ctx, `CREATE INDEX CONCURRENTLY dead_letters_participant_open_idx
		ON dl_prebuilt.dead_letters (participant_id, failed_at, outbox_id) WHERE acknowledged_at IS NULL`); err != nil {
		t.Fatal(err)
	}
	var prebuilt uint32
	if err := b.pool.QueryRow(b.ctx, `SELECT 'dl_prebuilt.dead_letters_participant_open_idx'::regclass::oid`).Scan(&prebuilt); err != nil {
		t.Fatal(err)
	}
	// The other one's concurrent build fails behind a writer of dead
	// letters, leaving it invalid.
	writer, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Rollback(context.Background())
	if _, err := writer.Exec(b.ctx, "LOCK TABLE dl_prebuilt.dead_letters IN ROW EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	builder, err := b.pool.Acquire(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := builder.Exec(b.ctx, "SET lock_timeout = '200ms'"); err != nil {
		t.Fatal(err)
	}
	_, err = builder.Exec(b.ctx, `CREATE INDEX CONCURRENTLY dead_letters_participant_idx ON dl_prebuilt.dead_letters (participant_id, failed_at, outbox_id)`)
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
	if valid("dead_letters_participant_idx") {
		t.Fatal("the failed concurrent build left a valid index")
	}

	if err := migrations.MigrateWith(b.ctx, b.pool, migrations.Options{Schema: schema}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"dead_letters_participant_idx", "dead_letters_participant_open_idx"} {
		if !valid(name) {
			t.Errorf("%s is invalid after the migrations", name)
		}
	}
	var open uint32
	if err := b.pool.QueryRow(b.ctx, `SELECT 'dl_prebuilt.dead_letters_participant_open_idx'::regclass::oid`).Scan(&open); err != nil || open != prebuilt {
		t.Errorf("the open index built beforehand was replaced (%d, was %d; %v)", open, prebuilt, err)
	}

	// One of that name defined otherwise stops the migration.
	const other = "dl_otherwise"
	if err := migrations.MigrateWith(b.ctx, b.pool, migrations.Options{Schema: other, TargetVersion: 44}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(b.ctx, `CREATE INDEX dead_letters_participant_idx ON dl_otherwise.dead_letters (participant_id)`); err != nil {
		t.Fatal(err)
	}
	err = migrations.MigrateWith(b.ctx, b.pool, migrations.Options{Schema: other})
	if !errors.As(err, &pgErr) || pgErr.Code != "55000" || !strings.Contains(pgErr.Hint, "CREATE INDEX CONCURRENTLY dead_letters_participant_idx ON dl_otherwise.dead_letters (participant_id, failed_at, outbox_id);") {
		t.Fatalf("migrating with an index of that name defined otherwise: %v, want 55000 with the statement in its hint", err)
	}
	if st, err := migrations.GetStatus(b.ctx, b.pool, other); err != nil || st.Current == st.Latest {
		t.Fatalf("status %+v, %v: want the migration not applied", st, err)
	}
}
