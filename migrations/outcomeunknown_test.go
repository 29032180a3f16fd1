package migrations_test

import (
	"strings"
	"testing"

	"github.com/ledgerline/outbox/migrations"
)

// marksFixture writes the rows of migration 032's and 037's tests into a
// schema, by hand, as older builds left them.
type marksFixture struct {
	t      *testing.T
	b      *testBundle
	schema string
}

func (f marksFixture) exec(sql string, args ...any) {
	f.t.Helper()
	if _, err := f.b.pool.Exec(f.b.ctx, strings.ReplaceAll(sql, "marks.", f.schema+"."), args...); err != nil {
		f.t.Fatal(err)
	}
}

// archive adds one closing row of a claim of instruction key: now, or in
// January 2020 (the month TestOutcomeUnknownMarkedFromTheWholeArchive
// detaches).
func (f marksFixture) archive(month2020 bool, key, state, code, claim string) {
	f.t.Helper()
	f.exec(`INSERT INTO marks.attempts (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
		attempt_no, state, relayer_id, claim_attempt_id, claimed_at, error_code, created_at)
		VALUES (md5($1)::uuid, 'ins-' || $1, 'p-' || $1, 1, $1, 'sandbox', 1, $2, 'r1', nullif($4, '')::uuid, now(), $3,
		        CASE WHEN $5 THEN timestamptz '2020-01-15' ELSE now() END)`, key, state, code, claim, month2020)
}

func (f marksFixture) dead(key string) {
	f.t.Helper()
	f.exec(`INSERT INTO marks.dead_letters (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
		payload, attempt_count, error_code, attempt_id, created_at)
		VALUES (md5($1)::uuid, 'ins-' || $1, 'p-' || $1, 1, $1, 'sandbox', '{}', 2, 'RAIL_REJECTED', gen_random_uuid(), now())`, key)
}

func (f marksFixture) pending(key string, history bool, zombie string) {
	f.t.Helper()
	f.exec(`INSERT INTO marks.pending (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
		payload, zombie_attempt_id, chain_head)
		VALUES (md5($1)::uuid, 'ins-' || $1, 'p-' || $1, 1, $1, 'sandbox', '{}', nullif($3, '')::uuid, CASE WHEN $2 THEN '\x00'::bytea END)`, key, history, zombie)
}

func (f marksFixture) inflight(key string) {
	f.t.Helper()
	f.exec(`INSERT INTO marks.inflight (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
		payload, created_at, attempt_id, attempt_no, relayer_id, ordered, claimed_at, lease_until)
		VALUES (md5($1)::uuid, 'ins-' || $1, 'p-' || $1, 1, $1, 'sandbox', '{}', now(),
		        gen_random_uuid(), 2, 'r1', true, now(), now() + interval '1 hour')`, key)
}

// check compares every row's mark with want, after migration version.
func (f marksFixture) check(version int, want map[string]bool) {
	f.t.Helper()
	rows, err := f.b.pool.Query(f.b.ctx, strings.ReplaceAll(`SELECT idempotency_key, outcome_unknown FROM marks.dead_letters
		UNION ALL SELECT idempotency_key, outcome_unknown FROM marks.pending
		UNION ALL SELECT idempotency_key, outcome_unknown FROM marks.inflight`, "marks.", f.schema+"."))
	if err != nil {
		f.t.Fatal(err)
	}
	defer rows.Close()
	seen := 0
	for rows.Next() {
		var (
			key     string
			unknown bool
		)
		if err := rows.Scan(&key, &unknown); err != nil {
			f.t.Fatal(err)
		}
		seen++
		if unknown != want[key] {
			f.t.Errorf("%s: outcome unknown %v after migration %03d, want %v", key, unknown, version, want[key])
		}
	}
	if err := rows.Err(); err != nil {
		f.t.Fatal(err)
	}
	if seen != len(want) {
		f.t.Errorf("%d rows, want %d", seen, len(want))
	}
}

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
	f := marksFixture{t: t, b: b, schema: schema}
	const zombie = "01900000-0000-7000-8000-000000000001"

	f.dead("d-timeout")
	f.archive(false, "d-timeout", "RETRYABLE", "RAIL_TIMEOUT", "")
	f.archive(false, "d-timeout", "FAILED", "RAIL_REJECTED", "")
	f.dead("d-refused")
	f.archive(false, "d-refused", "RETRYABLE", "RAIL_UNAVAILABLE", "")
	f.archive(false, "d-refused", "FAILED", "RAIL_REJECTED", "")
	f.dead("d-zombie")
	f.archive(false, "d-zombie", "ZOMBIE_REQUEUE", "ZOMBIE_REQUEUE", zombie)
	f.archive(false, "d-zombie", "FAILED", "RAIL_REJECTED", "")
	f.pending("p-timeout", true, "")
	f.archive(false, "p-timeout", "RETRYABLE", "RAIL_TIMEOUT", "")
	f.pending("p-refused", true, "")
	f.archive(false, "p-refused", "RETRYABLE", "RAIL_UNAVAILABLE", "")
	f.pending("p-fresh", false, "")
	f.pending("p-copy", true, zombie)
	f.archive(false, "p-copy", "ZOMBIE_REQUEUE", "ZOMBIE_REQUEUE", zombie)
	f.inflight("f-upstream")
	f.archive(false, "f-upstream", "RETRYABLE", "RAIL_UPSTREAM_ERROR", "")

	if err := migrations.MigrateWith(b.ctx, b.pool, migrations.Options{Schema: schema, TargetVersion: 32}); err != nil {
		t.Fatal(err)
	}
	f.check(32, map[string]bool{
		"d-timeout": true, "d-refused": false, "d-zombie": true,
		"p-timeout": true, "p-refused": false, "p-fresh": false, "p-copy": false,
		"f-upstream": true,
	})
}

// TestOutcomeUnknownMarkedFromTheWholeArchive: migration 037 marks what
// 032 missed, an attempt a stop cut off (CUT_OFF_AT_STOP) and an attempt
// in a detached month, with 032's rules otherwise (a refused attempt, a
// copy's own abandoned claim: no mark), and leaves a mark already there.
func TestOutcomeUnknownMarkedFromTheWholeArchive(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const schema = "marks37"
	if err := migrations.MigrateWith(b.ctx, b.pool, migrations.Options{Schema: schema, TargetVersion: 36}); err != nil {
		t.Fatal(err)
	}
	f := marksFixture{t: t, b: b, schema: schema}
	f.exec(`CREATE TABLE marks.attempts_2020_01 PARTITION OF marks.attempts FOR VALUES FROM ('2020-01-01') TO ('2020-02-01')`)
	const zombie = "01900000-0000-7000-8000-000000000002"

	f.dead("d-cutoff")
	f.archive(false, "d-cutoff", "RETRYABLE", "CUT_OFF_AT_STOP", "")
	f.archive(false, "d-cutoff", "FAILED", "RAIL_REJECTED", "")
	f.dead("d-detached")
	f.archive(true, "d-detached", "RETRYABLE", "RAIL_TIMEOUT", "")
	f.archive(false, "d-detached", "FAILED", "RAIL_REJECTED", "")
	f.dead("d-refused")
	f.archive(true, "d-refused", "RETRYABLE", "RAIL_UNAVAILABLE", "")
	f.archive(false, "d-refused", "FAILED", "RAIL_REJECTED", "")
	f.dead("d-marked")
	f.exec(`UPDATE marks.dead_letters SET outcome_unknown = true WHERE idempotency_key = 'd-marked'`)
	f.pending("p-detached", true, "")
	f.archive(true, "p-detached", "RETRYABLE", "RAIL_TRANSPORT_ERROR", "")
	f.pending("p-cutoff", true, "")
	f.archive(false, "p-cutoff", "RETRYABLE", "CUT_OFF_AT_STOP", "")
	f.pending("p-copy", true, zombie)
	f.archive(true, "p-copy", "ZOMBIE_REQUEUE", "ZOMBIE_REQUEUE", zombie)
	f.inflight("f-detached")
	f.archive(true, "f-detached", "RETRYABLE", "UNKNOWN_RAIL_CODE", "")

	// Detached as `outbox archive detach` moves a month.
	f.exec(`ALTER TABLE marks.attempts DETACH PARTITION marks.attempts_2020_01`)
	f.exec(`ALTER TABLE marks.attempts_detached ATTACH PARTITION marks.attempts_2020_01 FOR VALUES FROM ('2020-01-01') TO ('2020-02-01')`)
	if err := migrations.MigrateWith(b.ctx, b.pool, migrations.Options{Schema: schema, TargetVersion: 37}); err != nil {
		t.Fatal(err)
	}
	f.check(37, map[string]bool{
		"d-cutoff": true, "d-detached": true, "d-refused": false, "d-marked": true,
		"p-detached": true, "p-cutoff": true, "p-copy": false,
		"f-detached": true,
	})
}
