package migrations_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ledgerline/outbox/migrations"
)

// TestOneInstructionPerKeyMigration: migration 028 makes (tenant, key) the
// keys' primary key. A schema where two instruction ids already share a
// key stops at 27 with an error that counts them, and nothing changes; an
// index an operator built beforehand is taken as it is, and one a failed
// concurrent build left invalid is built again.
func TestOneInstructionPerKeyMigration(t *testing.T) {
	t.Parallel()
	b := setup(t)

	insertKey := func(schema, instruction, key string) {
		t.Helper()
		if _, err := b.pool.Exec(b.ctx, `INSERT INTO `+schema+`.idempotency_keys
			(tenant_id, instruction_id, idempotency_key, outbox_id, participant_id, sequence_id, payload_hash)
			VALUES ('', $1, $2, gen_random_uuid(), 'p1', 1, '\x00')`, instruction, key); err != nil {
			t.Fatal(err)
		}
	}
	primaryKey := func(schema string) string {
		t.Helper()
		var cols string
		if err := b.pool.QueryRow(b.ctx, `SELECT pg_get_constraintdef(oid) FROM pg_constraint
			WHERE conrelid = ($1 || '.idempotency_keys')::regclass AND conname = 'idempotency_keys_pkey'`, schema).Scan(&cols); err != nil {
			t.Fatal(err)
		}
		return cols
	}
	const before, after = "PRIMARY KEY (tenant_id, instruction_id, idempotency_key)", "PRIMARY KEY (tenant_id, idempotency_key)"
	migrate := func(schema string, version int32) error {
		return migrations.MigrateWith(b.ctx, b.pool, migrations.Options{Schema: schema, TargetVersion: version})
	}

	// Shared keys stop it.
	if err := migrate("shared", 27); err != nil {
		t.Fatal(err)
	}
	insertKey("shared", "ins-1", "k1")
	insertKey("shared", "ins-2", "k1")
	insertKey("shared", "ins-3", "k2")
	insertKey("shared", "ins-4", "k2")
	insertKey("shared", "ins-5", "k3")
	err := migrate("shared", 28)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23505" ||
		!strings.Contains(pgErr.Message, "2 idempotency key(s) of shared are each shared by more than one instruction id") ||
		!strings.Contains(pgErr.Hint, "HAVING count(*) > 1") {
		t.Fatalf("migrating shared keys: %v, want a unique violation counting 2 shared keys with a hint", err)
	}
	if pk := primaryKey("shared"); pk != before {
		t.Fatalf("after the refused migration the primary key is %s, want %s", pk, before)
	}
	var idx bool
	if err := b.pool.QueryRow(b.ctx, `SELECT to_regclass('shared.idempotency_keys_key_idx') IS NOT NULL`).Scan(&idx); err != nil || idx {
		t.Fatalf("the refused migration left an index behind (%v)", err)
	}

	// Built beforehand, concurrently: taken as it is. A build that failed
	// on a shared key left an invalid index: built again.
	for _, valid := range []bool{true, false} {
		schema := map[bool]string{true: "prebuilt", false: "invalid"}[valid]
		if err := migrate(schema, 27); err != nil {
			t.Fatal(err)
		}
		insertKey(schema, "ins-1", "k1")
		if !valid {
			insertKey(schema, "ins-2", "k1")
		}
		_, err := b.pool.Exec(b.ctx, `CREATE UNIQUE INDEX CONCURRENTLY idempotency_keys_key_idx ON `+schema+`.idempotency_keys (tenant_id, idempotency_key)`)
		if valid != (err == nil) {
			t.Fatalf("%s: concurrent build: %v", schema, err)
		}
		if !valid {
			if _, err := b.pool.Exec(b.ctx, `DELETE FROM invalid.idempotency_keys WHERE instruction_id = 'ins-2'`); err != nil {
				t.Fatal(err)
			}
		}
		var oid uint32
		if err := b.pool.QueryRow(b.ctx, `SELECT $1::regclass::oid`, schema+".idempotency_keys_key_idx").Scan(&oid); err != nil {
			t.Fatal(err)
		}
		if err := migrate(schema, 28); err != nil {
			t.Fatalf("%s: %v", schema, err)
		}
		if pk := primaryKey(schema); pk != after {
			t.Fatalf("%s: primary key %s, want %s", schema, pk, after)
		}
		var kept bool
		if err := b.pool.QueryRow(b.ctx, `SELECT EXISTS (SELECT 1 FROM pg_index WHERE indexrelid = $1 AND indisprimary AND indisvalid)`,
			oid).Scan(&kept); err != nil || kept != valid {
			t.Fatalf("%s: the index built beforehand became the primary key: %v (%v), want %v", schema, kept, err, valid)
		}
		if _, err := b.pool.Exec(b.ctx, `INSERT INTO `+schema+`.idempotency_keys
			(instruction_id, idempotency_key, outbox_id, participant_id, payload_hash)
			VALUES ('ins-9', 'k1', gen_random_uuid(), 'p1', '\x00')`); err == nil {
			t.Fatalf("%s: a second instruction id took key k1", schema)
		}
	}
}
