package migrations_test

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"
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

// TestOneKeyPerInstructionMigration: migration 030 makes an instruction id
// take one key per tenant (a unique index on instruction id and tenant,
// in place of 005's index on instruction id). A schema where an
// instruction id already has two keys stops at 29 with an error that
// counts them and whose hint lists them, and nothing changes; an index an
// operator built beforehand is taken as it is, one a failed concurrent
// build left invalid is built again, and one of that name defined
// otherwise stops the migration.
func TestOneKeyPerInstructionMigration(t *testing.T) {
	t.Parallel()
	b := setup(t)

	insertKey := func(schema, tenant, instruction, key string) {
		t.Helper()
		if _, err := b.pool.Exec(b.ctx, `INSERT INTO `+schema+`.idempotency_keys
			(tenant_id, instruction_id, idempotency_key, outbox_id, participant_id, sequence_id, payload_hash)
			VALUES ($1, $2, $3, gen_random_uuid(), 'p1', 1, '\x00')`, tenant, instruction, key); err != nil {
			t.Fatal(err)
		}
	}
	// indexes is the keys table's index definitions, by name.
	indexes := func(schema string) map[string]string {
		t.Helper()
		rows, err := b.pool.Query(b.ctx, `SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = $1 AND tablename = 'idempotency_keys'`, schema)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		var name, def string
		if _, err := pgx.ForEachRow(rows, []any{&name, &def}, func() error { out[name] = def; return nil }); err != nil {
			t.Fatal(err)
		}
		return out
	}
	const unique = "CREATE UNIQUE INDEX idempotency_keys_instruction_key ON %s.idempotency_keys USING btree (instruction_id, ((tenant_id || ''::text)))"
	migrate := func(schema string, version int32) error {
		return migrations.MigrateWith(b.ctx, b.pool, migrations.Options{Schema: schema, TargetVersion: version})
	}

	// Instruction ids with two keys stop it; the same instruction id in
	// two tenants, or one key's row alone, does not count.
	if err := migrate("reused", 29); err != nil {
		t.Fatal(err)
	}
	insertKey("reused", "", "ins-1", "k1")
	insertKey("reused", "", "ins-1", "k2")
	insertKey("reused", "", "ins-2", "k3")
	insertKey("reused", "", "ins-2", "k4")
	insertKey("reused", "", "ins-2", "k5")
	insertKey("reused", "", "ins-3", "k6")
	insertKey("reused", "tenant-b", "ins-3", "k6")
	before := indexes("reused")
	err := migrate("reused", 30)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23505" ||
		!strings.Contains(pgErr.Message, "2 instruction id(s) of reused are each enqueued under more than one idempotency key") ||
		!strings.Contains(pgErr.Hint, "GROUP BY 1, 2 HAVING count(*) > 1") {
		t.Fatalf("migrating reused instruction ids: %v, want a unique violation counting 2 with a hint", err)
	}
	if after := indexes("reused"); !maps.Equal(after, before) {
		t.Fatalf("the refused migration changed the indexes: %v, was %v", after, before)
	}
	// The hint's query lists exactly them.
	query := pgErr.Hint[strings.Index(pgErr.Hint, "SELECT"):strings.Index(pgErr.Hint, "; ")]
	var listed []string
	rows, err := b.pool.Query(b.ctx, query)
	if err != nil {
		t.Fatalf("the hint's query %q: %v", query, err)
	}
	var tenant, instruction string
	var keys []string
	var ids []uuid.UUID
	if _, err := pgx.ForEachRow(rows, []any{&tenant, &instruction, &keys, &ids}, func() error {
		listed = append(listed, fmt.Sprintf("%s/%s:%s", tenant, instruction, strings.Join(keys, ",")))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	slices.Sort(listed)
	if want := []string{"/ins-1:k1,k2", "/ins-2:k3,k4,k5"}; !slices.Equal(listed, want) {
		t.Fatalf("the hint's query lists %v, want %v", listed, want)
	}

	// Built beforehand, concurrently: taken as it is. A build that failed
	// on a reused instruction id left an invalid index: built again.
	for _, valid := range []bool{true, false} {
		schema := map[bool]string{true: "prebuilt", false: "invalid"}[valid]
		if err := migrate(schema, 29); err != nil {
			t.Fatal(err)
		}
		insertKey(schema, "", "ins-1", "k1")
		if !valid {
			insertKey(schema, "", "ins-1", "k2")
		}
		_, err := b.pool.Exec(b.ctx, `CREATE UNIQUE INDEX CONCURRENTLY idempotency_keys_instruction_key ON `+schema+`.idempotency_keys (instruction_id, (tenant_id || ''))`)
		if valid != (err == nil) {
			t.Fatalf("%s: concurrent build: %v", schema, err)
		}
		if !valid {
			if _, err := b.pool.Exec(b.ctx, `DELETE FROM invalid.idempotency_keys WHERE idempotency_key = 'k2'`); err != nil {
				t.Fatal(err)
			}
		}
		var oid uint32
		if err := b.pool.QueryRow(b.ctx, `SELECT $1::regclass::oid`, schema+".idempotency_keys_instruction_key").Scan(&oid); err != nil {
			t.Fatal(err)
		}
		if err := migrate(schema, 30); err != nil {
			t.Fatalf("%s: %v", schema, err)
		}
		got := indexes(schema)
		if got["idempotency_keys_instruction_key"] != fmt.Sprintf(unique, schema) || got["idempotency_keys_instruction_idx"] != "" {
			t.Fatalf("%s: indexes %v, want the unique one on (instruction_id, tenant_id) in place of idempotency_keys_instruction_idx", schema, got)
		}
		var kept bool
		if err := b.pool.QueryRow(b.ctx, `SELECT EXISTS (SELECT 1 FROM pg_index WHERE indexrelid = $1 AND indisunique AND indisvalid)`,
			oid).Scan(&kept); err != nil || kept != valid {
			t.Fatalf("%s: the index built beforehand was kept: %v (%v), want %v", schema, kept, err, valid)
		}
		if _, err := b.pool.Exec(b.ctx, `INSERT INTO `+schema+`.idempotency_keys
			(instruction_id, idempotency_key, outbox_id, participant_id, payload_hash)
			VALUES ('ins-1', 'k9', gen_random_uuid(), 'p1', '\x00')`); err == nil {
			t.Fatalf("%s: instruction id ins-1 took a second key", schema)
		}
		insertKey(schema, "tenant-b", "ins-1", "k9") // another tenant's instruction id of the same name
	}

	// One of that name defined otherwise (not unique; on the tenant
	// column, which the key lookups could take) is not taken for the
	// constraint: the migration stops and changes nothing.
	for i, def := range []string{"INDEX idempotency_keys_instruction_key ON %s.idempotency_keys (instruction_id, (tenant_id || ''))",
		"UNIQUE INDEX idempotency_keys_instruction_key ON %s.idempotency_keys (instruction_id, tenant_id)"} {
		schema := fmt.Sprintf("otherwise%d", i)
		if err := migrate(schema, 29); err != nil {
			t.Fatal(err)
		}
		if _, err := b.pool.Exec(b.ctx, "CREATE "+fmt.Sprintf(def, schema)); err != nil {
			t.Fatal(err)
		}
		before := indexes(schema)
		if err := migrate(schema, 30); !errors.As(err, &pgErr) || pgErr.Code != "55000" || !strings.Contains(pgErr.Hint, "CREATE UNIQUE INDEX CONCURRENTLY") {
			t.Fatalf("migrating with %q: %v, want it refused with a hint", def, err)
		}
		if after := indexes(schema); !maps.Equal(after, before) {
			t.Fatalf("%s: the refused migration changed the indexes: %v, was %v", schema, after, before)
		}
	}
}
