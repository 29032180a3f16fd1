package migrations_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ledgerline/outbox/migrations"
)

// prebuiltIndexes is a migration that builds indexes an upgrader may build
// beforehand with CREATE INDEX CONCURRENTLY (045/046, 049): one built that
// way and valid is kept, one a failed concurrent build left invalid is
// built again, and one of that name defined otherwise stops the migration,
// changing nothing, with the statement to build it in its hint.
type prebuiltIndexes struct {
	before        int32  // the last migration before the builds
	schema, other string // the scene's schema; the one where an index is defined otherwise
	// kept is the index built beforehand and valid; keptSQL builds it
	// concurrently, its schema written %[1]s.
	kept, keptSQL string
	// failed is the index whose concurrent build fails, on table, with
	// columns as CREATE INDEX takes them ("(a, b)").
	failed, table, columns string
}

// check plays the scene: kept built beforehand, failed's concurrent build
// cut off by its lock_timeout behind a writer of table, then the latest
// migration; and in other, failed defined on table's first column alone.
func (p prebuiltIndexes) check(t *testing.T) {
	b := setup(t)
	if err := migrations.MigrateWith(b.ctx, b.pool, migrations.Options{Schema: p.schema, TargetVersion: p.before}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(b.ctx, fmt.Sprintf(p.keptSQL, p.schema)); err != nil {
		t.Fatal(err)
	}
	var prebuilt uint32
	if err := b.pool.QueryRow(b.ctx, `SELECT to_regclass($1)::oid`, p.schema+"."+p.kept).Scan(&prebuilt); err != nil {
		t.Fatal(err)
	}
	writer, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Rollback(context.Background())
	if _, err := writer.Exec(b.ctx, fmt.Sprintf("LOCK TABLE %s.%s IN ROW EXCLUSIVE MODE", p.schema, p.table)); err != nil {
		t.Fatal(err)
	}
	builder, err := b.pool.Acquire(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := builder.Exec(b.ctx, "SET lock_timeout = '200ms'"); err != nil {
		t.Fatal(err)
	}
	_, err = builder.Exec(b.ctx, fmt.Sprintf("CREATE INDEX CONCURRENTLY %s ON %s.%s %s", p.failed, p.schema, p.table, p.columns))
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
		if err := b.pool.QueryRow(b.ctx, `SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1)`, p.schema+"."+name).Scan(&v); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return v
	}
	if valid(p.failed) {
		t.Fatal("the failed concurrent build left a valid index")
	}

	if err := migrations.MigrateWith(b.ctx, b.pool, migrations.Options{Schema: p.schema}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{p.failed, p.kept} {
		if !valid(name) {
			t.Errorf("%s is invalid after the migrations", name)
		}
	}
	var kept uint32
	if err := b.pool.QueryRow(b.ctx, `SELECT to_regclass($1)::oid`, p.schema+"."+p.kept).Scan(&kept); err != nil || kept != prebuilt {
		t.Errorf("the index built beforehand was replaced (%d, was %d; %v)", kept, prebuilt, err)
	}

	// One of that name defined otherwise stops the migration.
	if err := migrations.MigrateWith(b.ctx, b.pool, migrations.Options{Schema: p.other, TargetVersion: p.before}); err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(strings.Trim(p.columns, "()"), ",")
	if _, err := b.pool.Exec(b.ctx, fmt.Sprintf("CREATE INDEX %s ON %s.%s (%s)", p.failed, p.other, p.table, first)); err != nil {
		t.Fatal(err)
	}
	err = migrations.MigrateWith(b.ctx, b.pool, migrations.Options{Schema: p.other})
	want := fmt.Sprintf("CREATE INDEX CONCURRENTLY %s ON %s.%s %s;", p.failed, p.other, p.table, p.columns)
	if !errors.As(err, &pgErr) || pgErr.Code != "55000" || !strings.Contains(pgErr.Hint, want) {
		t.Fatalf("migrating with an index of that name defined otherwise: %v, want 55000 with %q in its hint", err, want)
	}
	if st, err := migrations.GetStatus(b.ctx, b.pool, p.other); err != nil || st.Current == st.Latest {
		t.Fatalf("status %+v, %v: want the migration not applied", st, err)
	}
}
