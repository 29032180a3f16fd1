package migrations_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/migrations"
)

// forgedOperatorRows are what a relayer credential would append to pass
// for an operator's action, in schema: an archive row in each operator's
// state, and a dead letter already acknowledged (of an instruction in
// flight: the scene needs one). Each is otherwise a valid row.
func forgedOperatorRows(schema string) []string {
	var rows []string
	for _, state := range []string{"REPLAYED", "ACKNOWLEDGED", "CANCELLED"} {
		rows = append(rows, `INSERT INTO `+schema+`.attempts (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key,
			rail_type, attempt_no, state, relayer_id, claimed_at, completed_at, error_message, created_at)
			VALUES (md5('forged')::uuid, 'ins-forged', 'p-forged', 1, 'forged', 'sandbox', 1, '`+state+`', 'alice', now(), now(),
			        'by alice (database role ops_alice): forged', now())`)
	}
	// The dead letter says what an instruction in flight says, as a
	// relayer's own dead letters must (migration 042).
	return append(rows, `INSERT INTO `+schema+`.dead_letters (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key,
		rail_type, tenant_id, correlation_id, payload, attempt_count, error_code, attempt_id, created_at, acknowledged_at, acknowledged_by, acknowledged_reason)
		SELECT outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type, tenant_id, correlation_id, payload, 1, 'RAIL_REJECTED',
		       gen_random_uuid(), created_at, now(), 'alice', 'forged' FROM `+schema+`.inflight`)
}

// refusedByPolicy checks that each statement, run as db in a transaction
// rolled back, is refused by row-level security (42501), and that the same
// row in a state a relayer writes (control) is not: the refusal is the
// state's, not the row's.
func refusedByPolicy(t *testing.T, b *rolesBundle, db *pgxpool.Pool, statements []string, control func(string) string) {
	t.Helper()
	try := func(q string) error {
		tx, err := db.Begin(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(b.ctx) }()
		_, err = tx.Exec(b.ctx, q)
		return err
	}
	for _, q := range statements {
		var pgErr *pgconn.PgError
		if err := try(q); !errors.As(err, &pgErr) || pgErr.Code != "42501" || !strings.Contains(pgErr.Message, "row-level security") {
			t.Errorf("%s: got %v, want the row-level security refusal", q, err)
		}
		if err := try(control(q)); err != nil {
			t.Errorf("the same row as a relayer writes it: %v", err)
		}
	}
}

// asRelayersWrite turns a forged row of forgedOperatorRows into one a
// relayer may write: a RETRYABLE attempt, an open dead letter.
func asRelayersWrite(q string) string {
	for _, state := range []string{"'REPLAYED'", "'ACKNOWLEDGED'", "'CANCELLED'"} {
		q = strings.Replace(q, state, "'RETRYABLE'", 1)
	}
	return strings.Replace(q, "created_at, now(), 'alice', 'forged' FROM", "created_at, NULL, NULL, NULL FROM", 1)
}

// TestRelayersCannotAppendOperatorRows: a relayer credential cannot
// append an operator's row to the archive (a replay, acknowledgement or
// cancel naming any person and role) nor an acknowledged dead letter
// (migration 040); the operators' functions still write theirs, and the
// archive verifies.
func TestRelayersCannotAppendOperatorRows(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	relayer := b.as(t, migrations.RoleRelayer, "")
	b.queuedAndInFlight(t, "outbox", relayer)
	refusedByPolicy(t, b, relayer, forgedOperatorRows("outbox"), asRelayersWrite)

	producer := b.as(t, migrations.RoleProducer, "")
	operator := b.as(t, migrations.RoleOperator, "")
	acked, err := b.enqueue(t, producer, "", "acked")
	if err != nil {
		t.Fatal(err)
	}
	replayed, err := b.enqueue(t, producer, "", "replayed")
	if err != nil {
		t.Fatal(err)
	}
	b.settle(t, relayer, store.Failed)
	if ok, err := b.st.Acknowledge(b.ctx, operator, acked.OutboxID, "olga", "paid by hand"); err != nil || !ok {
		t.Fatalf("the operator's acknowledgement: %v, %v", ok, err)
	}
	if ok, err := b.st.Replay(b.ctx, operator, replayed.OutboxID, "olga", "rail fixed"); err != nil || !ok {
		t.Fatalf("the operator's replay: %v, %v", ok, err)
	}
	if ok, err := b.st.Cancel(b.ctx, operator, replayed.OutboxID, "olga", "sent by hand"); err != nil || !ok {
		t.Fatalf("the operator's cancel: %v, %v", ok, err)
	}
	rep, err := b.st.Verify(b.ctx, b.admin, store.VerifyOptions{})
	if err != nil || !rep.OK() {
		t.Fatalf("verify: %v, %v", rep.Violations, err)
	}
}

// TestOperatorRowsRefusedAfterAnUpgradeByTheOwner: where the roles were
// set up before migration 040, the migration run by the owner alone puts
// the relayers' restrictions in place.
func TestOperatorRowsRefusedAfterAnUpgradeByTheOwner(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	const schema = "oprows_upgrade"
	if err := migrations.MigrateWith(b.ctx, b.admin, migrations.Options{Schema: schema, TargetVersion: 39}); err != nil {
		t.Fatal(err)
	}
	sql, err := migrations.RolesSQL(schema)
	if err != nil {
		t.Fatal(err)
	}
	var before []string
	for _, line := range strings.Split(rolesBefore042(sql), "\n") {
		if !strings.Contains(line, "outbox_relayer_no_") && !strings.HasPrefix(strings.TrimSpace(line), "WITH CHECK (state NOT IN") &&
			!strings.HasPrefix(strings.TrimSpace(line), "WITH CHECK (acknowledged_at IS NULL") {
			before = append(before, line)
		}
	}
	if _, err := b.admin.Exec(b.ctx, strings.Join(before, "\n")); err != nil {
		t.Fatalf("roles at version 39: %v", err)
	}
	relayer := b.as(t, migrations.RoleRelayer, "")
	b.queuedAndInFlight(t, schema, relayer)
	for _, q := range forgedOperatorRows(schema) {
		if err := func() error {
			tx, err := relayer.Begin(b.ctx)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback(b.ctx) }()
			_, err = tx.Exec(b.ctx, q)
			return err
		}(); err != nil {
			t.Fatalf("before 040 a relayer could write it; now: %v", err)
		}
	}
	if err := migrations.MigrateWith(b.ctx, b.as(t, migrations.RoleOwner, ""), migrations.Options{Schema: schema}); err != nil {
		t.Fatalf("upgrade as the owner: %v", err)
	}
	refusedByPolicy(t, b, relayer, forgedOperatorRows(schema), asRelayersWrite)
}
