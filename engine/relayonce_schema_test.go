package engine

import (
	"errors"
	"testing"

	"github.com/ledgerline/outbox/migrations"
	"github.com/ledgerline/outbox/rails"
)

// TestRelayOnceRefusesASchemaBehind: RelayOnce needs this build's schema,
// as Start does. On a schema an upgrade has not reached (a test database
// from an older template, a tool run before `outbox migrate`) its claim
// failed with the server's "does not exist" for a function or column, or,
// worse, claimed and then failed its outcome write; it is a
// *migrations.SchemaError now, before anything is claimed.
func TestRelayOnceRefusesASchemaBehind(t *testing.T) {
	t.Parallel()
	b := setup(t, rails.SandboxOptions{})
	if err := migrations.MigrateWith(b.ctx, b.pool, migrations.Options{Schema: "behind", TargetVersion: migrations.Latest() - 3}); err != nil {
		t.Fatal(err)
	}
	cfg := b.config("once-behind")
	cfg.Schema = "behind"
	r, err := New(nil, cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, err = r.RelayOnce(b.ctx, b.pool)
	if se := (*migrations.SchemaError)(nil); !errors.As(err, &se) {
		t.Fatalf("relay once on a schema behind: %v, want a *migrations.SchemaError", err)
	}
	// Migrated, the same relayer relays.
	if err := migrations.MigrateWith(b.ctx, b.pool, migrations.Options{Schema: "behind"}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.RelayOnce(b.ctx, b.pool); err != nil {
		t.Fatalf("relay once after the migration: %v", err)
	}
}
