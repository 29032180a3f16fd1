package reaper

import (
	"errors"
	"net/url"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/internal/retry"
	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/migrations"
)

// TestStartRefusesAnOlderSchema: a reaper refuses to start, as a relayer
// does, on a schema that is not migrated or is older than this build (its
// statement needs migration 032's columns): a *migrations.SchemaError, a
// permanent error, and nothing runs. Before, it started, and every pass
// failed and wrote nothing, with nothing at start to say why.
func TestStartRefusesAnOlderSchema(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if err := migrations.MigrateWith(b.ctx, b.pool, migrations.Options{Schema: "behind", TargetVersion: 31}); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		schema  string
		current int32
	}{{"behind", 31}, {"never_migrated", 0}} {
		r, err := New(b.pool, Config{Schema: tt.schema})
		if err != nil {
			t.Fatal(err)
		}
		err = r.Start(b.ctx)
		var se *migrations.SchemaError
		if !errors.As(err, &se) || se.Current != tt.current || se.Latest != migrations.Latest() || !retry.Permanent(err) {
			_ = r.Stop(b.ctx)
			t.Errorf("Start on schema %s (version %d) = %v, want a permanent *migrations.SchemaError", tt.schema, tt.current, err)
			continue
		}
		if r.lc.Running() || r.Stats().Passes+r.Stats().Errors != 0 {
			t.Errorf("schema %s: running, or passes made, after a refused Start: %+v", tt.schema, r.Stats())
		}
	}
}

// TestStartWhileDatabaseUnreachable: an unreachable database is no reason
// to refuse (as for a relayer): the reaper starts, and its passes retry.
func TestStartWhileDatabaseUnreachable(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(testdb.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	u.Host = "127.0.0.1:1" // nothing listens there
	pool, err := pgxpool.New(t.Context(), u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	r, err := New(pool, Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(t.Context()); err != nil {
		t.Fatalf("Start with the database unreachable: %v", err)
	}
	if err := r.Stop(t.Context()); err != nil {
		t.Error(err)
	}
}

// TestRunOnceRefusesAnOlderSchema: one pass by hand (`outbox reap`) refuses
// a schema not migrated or older than this build as Start does, with a
// permanent *migrations.SchemaError, and does nothing. Before, it ran its
// statements on it and failed with whatever SQL error they met.
func TestRunOnceRefusesAnOlderSchema(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if err := migrations.MigrateWith(b.ctx, b.pool, migrations.Options{Schema: "behind_once", TargetVersion: 31}); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		schema  string
		current int32
	}{{"behind_once", 31}, {"never_migrated_once", 0}} {
		r, err := New(b.pool, Config{Schema: tt.schema})
		if err != nil {
			t.Fatal(err)
		}
		requeued, err := r.RunOnce(b.ctx)
		var se *migrations.SchemaError
		if !errors.As(err, &se) || se.Current != tt.current || !retry.Permanent(err) || len(requeued) != 0 {
			t.Errorf("RunOnce on schema %s (version %d) = %v, %v; want a permanent *migrations.SchemaError", tt.schema, tt.current, requeued, err)
		}
		if st := r.Stats(); st.Errors != 1 {
			t.Errorf("schema %s: %+v, want the refused pass counted as an error", tt.schema, st)
		}
	}
	// On this build's schema it passes.
	r, err := New(b.pool, Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.RunOnce(b.ctx); err != nil {
		t.Errorf("RunOnce on a migrated schema: %v", err)
	}
}
