package migrations_test

import (
	"testing"

	"github.com/ledgerline/outbox/migrations"
)

// TestOutcomeUnknownMigrationMarksWhatIsThere: migration 032 marks, from
// their trails, the dead letters, in-flight and pending rows of which an
// earlier attempt may have reached the rail (a timeout, a reaped claim),
// and no others: a dead letter whose attempts were all refused, a first
// enqueue, and a copy the reaper requeued whose only such attempt is its
// own abandoned claim (that claim's next claim marks it; a late FAILED of
// it withdraws the copy as settled).
func TestOutcomeUnknownMigrationMarksWhatIsThere(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const schema = "marks"
	if err := migrations.MigrateWith(b.ctx, b.pool, migrations.Options{Schema: schema, TargetVersion: 31}); err != nil {
		t.Fatal(err)
	}
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := b.pool.Exec(b.ctx, sql, args...); err != nil {
			t.Fatal(err)
		}
	}
	// archive adds one closing row of a claim of instruction key.
	archive := func(key, state, code, claim string) {
		t.Helper()
		exec(`INSERT INTO marks.attempts (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
			attempt_no, state, relayer_id, claim_attempt_id, claimed_at, error_code)
			VALUES (md5($1)::uuid, 'ins-' || $1, 'p-' || $1, 1, $1, 'sandbox', 1, $2, 'r1', nullif($4, '')::uuid, now(), $3)`, key, state, code, claim)
	}
	dead := func(key string) {
		t.Helper()
		exec(`INSERT INTO marks.dead_letters (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
			payload, attempt_count, error_code, attempt_id, created_at)
			VALUES (md5($1)::uuid, 'ins-' || $1, 'p-' || $1, 1, $1, 'sandbox', '{}', 2, 'RAIL_REJECTED', gen_random_uuid(), now())`, key)
	}
	pendingRow := func(key string, history bool, zombie string) {
		t.Helper()
		exec(`INSERT INTO marks.pending (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
			payload, zombie_attempt_id, chain_head)
			VALUES (md5($1)::uuid, 'ins-' || $1, 'p-' || $1, 1, $1, 'sandbox', '{}', nullif($3, '')::uuid, CASE WHEN $2 THEN '\x00'::bytea END)`, key, history, zombie)
	}
	const zombie = "01900000-0000-7000-8000-000000000001"

	dead("d-timeout")
	archive("d-timeout", "RETRYABLE", "RAIL_TIMEOUT", "")
	archive("d-timeout", "FAILED", "RAIL_REJECTED", "")
	dead("d-refused")
	archive("d-refused", "RETRYABLE", "RAIL_UNAVAILABLE", "")
	archive("d-refused", "FAILED", "RAIL_REJECTED", "")
	dead("d-zombie")
	archive("d-zombie", "ZOMBIE_REQUEUE", "ZOMBIE_REQUEUE", zombie)
	archive("d-zombie", "FAILED", "RAIL_REJECTED", "")
	pendingRow("p-timeout", true, "")
	archive("p-timeout", "RETRYABLE", "RAIL_TIMEOUT", "")
	pendingRow("p-refused", true, "")
	archive("p-refused", "RETRYABLE", "RAIL_UNAVAILABLE", "")
	pendingRow("p-fresh", false, "")
	pendingRow("p-copy", true, zombie)
	archive("p-copy", "ZOMBIE_REQUEUE", "ZOMBIE_REQUEUE", zombie)
	exec(`INSERT INTO marks.inflight (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
		payload, created_at, attempt_id, attempt_no, relayer_id, ordered, claimed_at, lease_until)
		VALUES (md5('f-upstream')::uuid, 'ins-f-upstream', 'p-f-upstream', 1, 'f-upstream', 'sandbox', '{}', now(),
		        gen_random_uuid(), 2, 'r1', true, now(), now() + interval '1 hour')`)
	archive("f-upstream", "RETRYABLE", "RAIL_UPSTREAM_ERROR", "")

	if err := migrations.MigrateWith(b.ctx, b.pool, migrations.Options{Schema: schema, TargetVersion: 32}); err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{
		"d-timeout": true, "d-refused": false, "d-zombie": true,
		"p-timeout": true, "p-refused": false, "p-fresh": false, "p-copy": false,
		"f-upstream": true,
	}
	rows, err := b.pool.Query(b.ctx, `SELECT idempotency_key, outcome_unknown FROM marks.dead_letters
		UNION ALL SELECT idempotency_key, outcome_unknown FROM marks.pending
		UNION ALL SELECT idempotency_key, outcome_unknown FROM marks.inflight`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	seen := 0
	for rows.Next() {
		var (
			key     string
			unknown bool
		)
		if err := rows.Scan(&key, &unknown); err != nil {
			t.Fatal(err)
		}
		seen++
		if unknown != want[key] {
			t.Errorf("%s: outcome unknown %v after migration 032, want %v", key, unknown, want[key])
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if seen != len(want) {
		t.Errorf("%d rows, want %d", seen, len(want))
	}
}
