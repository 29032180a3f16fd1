package pending_test

import (
	"errors"
	"testing"

	"github.com/ledgerline/outbox/migrations"
	"github.com/ledgerline/outbox/pending"
)

// TestProducerRefusesAnOlderSchema: a producer deployed before `outbox
// migrate` ran refuses to enqueue into a schema older than its statements
// need (before 033, the functions the enqueue inserts pending rows
// through do not exist; before 030, an instruction id under a second key
// was written: a second payment of one instruction; before 028, a key
// reused under a second instruction id was written and then reported as a
// mismatch), writes nothing, leaves the caller's transaction usable, and enqueues
// once the schema is migrated.
func TestProducerRefusesAnOlderSchema(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if err := migrations.MigrateWith(b.ctx, b.pool, migrations.Options{Schema: "behind", TargetVersion: 32}); err != nil {
		t.Fatal(err)
	}
	p, err := pending.NewProducer(pending.Config{Schema: "behind"})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(b.ctx)
	_, err = p.Enqueue(b.ctx, tx, payout("p1", "k1"))
	var se *pending.SchemaError
	if !errors.Is(err, pending.ErrSchemaBehind) || !errors.As(err, &se) || se.Version != 32 || se.Needed != 33 || se.Schema != "behind" {
		t.Fatalf("enqueue into a schema at 32: %v, want a SchemaError (32, needs 33)", err)
	}
	var keys int
	if err := tx.QueryRow(b.ctx, `SELECT count(*) FROM behind.idempotency_keys`).Scan(&keys); err != nil || keys != 0 {
		t.Fatalf("%d keys (%v): the refused enqueue wrote, or the transaction is unusable", keys, err)
	}
	if err := tx.Rollback(b.ctx); err != nil {
		t.Fatal(err)
	}

	if err := migrations.MigrateWith(b.ctx, b.pool, migrations.Options{Schema: "behind"}); err != nil {
		t.Fatal(err)
	}
	if r, err := p.Enqueue(b.ctx, b.pool, payout("p1", "k1")); err != nil || r.Duplicate || r.SequenceID != 1 {
		t.Fatalf("enqueue once migrated: %+v %v", r, err)
	}
	// Never migrated at all: version 0.
	fresh, err := pending.NewProducer(pending.Config{Schema: "nowhere"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fresh.Enqueue(b.ctx, b.pool, payout("p1", "k1")); !errors.As(err, &se) || se.Version != 0 {
		t.Fatalf("enqueue into a schema never migrated: %v, want a SchemaError at version 0", err)
	}
}
