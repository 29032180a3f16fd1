package migrations_test

import (
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/migrations"
	"github.com/ledgerline/outbox/pending"
)

// rolesBefore047 is the roles script as the builds before migration 047
// had it: without resume_rail_shown's lines.
func rolesBefore047(sql string) string {
	var lines []string
	for _, line := range strings.Split(rolesBefore052(sql), "\n") {
		if !strings.Contains(line, "resume_rail_shown") && !strings.Contains(line, "migration 047") {
			lines = append(lines, line)
		}
	}
	return strings.Join(lines, "\n")
}

// rolesBefore042 is the roles script sql as builds before migration 042
// had it: relayers may update every column of pending and inflight, and
// insert any row into them and into dead_letters.
func rolesBefore042(sql string) string {
	sql = rolesBefore047(sql)
	sql = regexp.MustCompile(`(?s)DROP POLICY IF EXISTS outbox_relayer_from_inflight.*?\n-- Who may act`).ReplaceAllString(sql, "-- Who may act")
	var lines []string
	for _, line := range strings.Split(sql, "\n") {
		if strings.Contains(line, "UPDATE (next_attempt_at, retry_at)") || strings.Contains(line, "UPDATE (lease_until)") {
			continue
		}
		lines = append(lines, strings.Replace(line, "GRANT SELECT, INSERT, DELETE ON", "GRANT SELECT, INSERT, UPDATE, DELETE ON", 1))
	}
	return strings.Join(lines, "\n")
}

// changedInstructions are what a relayer credential would do to change
// what an instruction queued in schema says (here: where its money goes),
// each otherwise a statement a relayer's grants allowed: in place, and by
// moving the row to another of the queue's tables with the change (in
// one statement that deletes the row it moves, as the relayers' own
// statements do).
func changedInstructions(schema string) []string {
	const moved = `outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type, tenant_id, correlation_id`
	const changed = `jsonb_set(payload, '{destination}', '"acct-thief"')`
	return []string{
		`UPDATE ` + schema + `.pending SET payload = ` + changed,
		`UPDATE ` + schema + `.inflight SET payload = ` + changed,
		`WITH m AS (DELETE FROM ` + schema + `.pending RETURNING *)
		 INSERT INTO ` + schema + `.pending (` + moved + `, payload, created_at) SELECT ` + moved + `, ` + changed + `, created_at FROM m`,
		`WITH m AS (DELETE FROM ` + schema + `.pending RETURNING *)
		 INSERT INTO ` + schema + `.inflight (` + moved + `, payload, created_at, attempt_id, attempt_no, relayer_id, ordered, claimed_at, lease_until)
		 SELECT ` + moved + `, ` + changed + `, created_at, gen_random_uuid(), 1, 'r-thief', false, now(), now() + interval '1 hour' FROM m`,
		`WITH m AS (DELETE FROM ` + schema + `.inflight RETURNING *)
		 INSERT INTO ` + schema + `.pending (` + moved + `, payload, created_at) SELECT ` + moved + `, ` + changed + `, created_at FROM m`,
		`WITH m AS (DELETE FROM ` + schema + `.inflight RETURNING *)
		 INSERT INTO ` + schema + `.dead_letters (` + moved + `, payload, attempt_count, error_code, attempt_id, created_at)
		 SELECT ` + moved + `, ` + changed + `, 1, 'RAIL_REJECTED', attempt_id, created_at FROM m`,
		`INSERT INTO ` + schema + `.pending (` + moved + `, payload, created_at)
		 SELECT gen_random_uuid(), instruction_id, participant_id, sequence_id + 1000, idempotency_key || '-forged', rail_type, tenant_id, correlation_id, ` + changed + `, created_at
		 FROM ` + schema + `.pending`,
	}
}

// refusedChanges runs each of changedInstructions as db, in a transaction
// rolled back, with an instruction pending and one in flight, and returns
// what each did: "refused" (42501: a missing grant or a policy) or
// "done" (it changed rows).
func refusedChanges(t *testing.T, b *rolesBundle, db *pgxpool.Pool, schema string) []string {
	t.Helper()
	var out []string
	for _, q := range changedInstructions(schema) {
		tag, err := func() (pgconn.CommandTag, error) {
			tx, err := db.Begin(b.ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(b.ctx) }()
			return tx.Exec(b.ctx, q)
		}()
		var pgErr *pgconn.PgError
		switch {
		case errors.As(err, &pgErr) && pgErr.Code == "42501":
			out = append(out, "refused")
		case err != nil:
			t.Fatalf("%s: %v", q, err)
		case tag.RowsAffected() == 0:
			t.Fatalf("%s: changed nothing: the scene has no row for it", q)
		default:
			out = append(out, "done")
		}
	}
	return out
}

// queuedAndInFlight enqueues two instructions in schema and claims one as
// relayer: one pending, one in flight (returned).
func (b *rolesBundle) queuedAndInFlight(t *testing.T, schema string, relayer *pgxpool.Pool) store.Claimed {
	t.Helper()
	producer, err := pending.NewProducer(pending.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.New(schema)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"k-1", "k-2"} {
		if _, err := producer.Enqueue(b.ctx, b.as(t, migrations.RoleProducer, ""), pending.Instruction{
			InstructionID: "ins-" + key, ParticipantID: "p-1", IdempotencyKey: key,
			RailType: "sandbox", AmountMinor: 100, Currency: "USD", Destination: "acct-1",
		}); err != nil {
			t.Fatal(err)
		}
	}
	claimed, err := st.Claim(b.ctx, relayer, store.ClaimParams{RelayerID: "r1", Limit: 10,
		Leases: map[string]time.Duration{"sandbox": time.Hour}})
	if err != nil || len(claimed) != 1 {
		t.Fatalf("claim: %d, %v", len(claimed), err)
	}
	return claimed[0]
}

// TestRelayersMoveInstructionsUnchanged: a relayer credential cannot
// change what a queued instruction says, neither in place nor by moving
// it between pending, inflight and the dead letters with the change
// (migration 042); every move the relayers and the reaper make still
// works as outbox_relayer (a claim, a hand-off, a retry, a failure, a
// requeue, a poison instruction's dead letter, a late failure's
// withdrawal), and the archive verifies.
func TestRelayersMoveInstructionsUnchanged(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	relayer := b.as(t, migrations.RoleRelayer, "")
	first := b.queuedAndInFlight(t, "outbox", relayer)
	for i, got := range refusedChanges(t, b, relayer, "outbox") {
		if got != "refused" {
			t.Errorf("%s\nas a relayer: %s, want refused", changedInstructions("outbox")[i], got)
		}
	}

	leases := func(d time.Duration) map[string]time.Duration { return map[string]time.Duration{"sandbox": d} }
	claim := func(key string, lease time.Duration) store.Claimed {
		t.Helper()
		claimed, err := b.st.Claim(b.ctx, relayer, store.ClaimParams{RelayerID: "r1", Limit: 1, Leases: leases(lease)})
		if err != nil || len(claimed) != 1 || claimed[0].IdempotencyKey != key {
			t.Fatalf("claim of %s: %+v, %v", key, claimed, err)
		}
		return claimed[0]
	}
	outcome := func(c store.Claimed, state store.State) store.Outcome {
		o := store.Outcome{Identity: c.Identity, AttemptID: uuid.Must(uuid.NewV7()), ClaimAttemptID: c.AttemptID, AttemptNo: c.AttemptNo,
			RelayerID: "r1", ClaimedAt: c.ClaimedAt, State: state, CountAttempt: true}
		switch state {
		case store.Retryable:
			o.ErrorCode = "RAIL_UNAVAILABLE"
		case store.Failed:
			o.ErrorCode = "RAIL_REJECTED"
		}
		return o
	}
	record := func(h store.HandoffParams, outcomes ...store.Outcome) []store.Claimed {
		t.Helper()
		rec, handed, err := b.st.Record(b.ctx, relayer, outcomes, h)
		if err != nil || len(rec) != len(outcomes) {
			t.Fatalf("record as relayer: %d of %d, %v", len(rec), len(outcomes), err)
		}
		return handed
	}
	reap := func(zombieLimit int) []store.Requeued {
		t.Helper()
		time.Sleep(20 * time.Millisecond) // past the 1 ms leases below
		r, err := b.st.Reap(b.ctx, relayer, 10, "reaper-1", zombieLimit)
		if err != nil || len(r) != 1 {
			t.Fatalf("reap as relayer: %+v, %v", r, err)
		}
		return r
	}
	// The scene's in-flight k-1, dispatched, hands k-2 (same participant)
	// on to the relayer: inflight from pending.
	handed := record(store.HandoffParams{RelayerID: "r1", Limit: 10, Leases: leases(time.Hour)}, outcome(first, store.Dispatched))
	if len(handed) != 1 || handed[0].IdempotencyKey != "k-2" {
		t.Fatalf("hand-off as relayer: %+v, want k-2", handed)
	}
	// k-2 retried (pending from inflight), then failed (a dead letter from
	// inflight).
	record(store.HandoffParams{}, outcome(handed[0], store.Retryable))
	record(store.HandoffParams{}, outcome(claim("k-2", time.Hour), store.Failed))
	// k-3 reaped (pending from inflight), then its late failure withdraws
	// the copy into the dead letters (from pending).
	if _, err := b.enqueue(t, b.as(t, migrations.RoleProducer, ""), "", "k-3"); err != nil {
		t.Fatal(err)
	}
	lost := claim("k-3", time.Millisecond)
	reap(3)
	record(store.HandoffParams{}, outcome(lost, store.Failed))
	// k-4 reaped until poisoned: a dead letter from inflight, by the reaper.
	if _, err := b.enqueue(t, b.as(t, migrations.RoleProducer, ""), "", "k-4"); err != nil {
		t.Fatal(err)
	}
	claim("k-4", time.Millisecond)
	reap(3)
	claim("k-4", time.Millisecond)
	if r := reap(1); !r[0].DeadLettered {
		t.Fatalf("k-4 reaped again past the zombie limit: %+v, want a poison dead letter", r)
	}
	var dead int
	if err := b.admin.QueryRow(b.ctx, `SELECT count(*) FROM outbox.dead_letters`).Scan(&dead); err != nil || dead != 3 {
		t.Fatalf("dead letters: %d, %v; want k-2, k-3 and k-4", dead, err)
	}
	rep, err := b.st.Verify(b.ctx, b.admin, store.VerifyOptions{Ordered: true})
	if err != nil || !rep.OK() {
		t.Fatalf("verify: %v, %v", rep.Violations, err)
	}
}

// TestRelayerMovesRefusedAfterAnUpgradeByTheOwner: where the roles were
// set up before migration 042, a relayer could change a queued
// instruction; the migration run by the owner alone takes that away.
func TestRelayerMovesRefusedAfterAnUpgradeByTheOwner(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	const schema = "moves_upgrade"
	if err := migrations.MigrateWith(b.ctx, b.admin, migrations.Options{Schema: schema, TargetVersion: 41}); err != nil {
		t.Fatal(err)
	}
	sql, err := migrations.RolesSQL(schema)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.admin.Exec(b.ctx, rolesBefore042(sql)); err != nil {
		t.Fatalf("roles at version 41: %v", err)
	}
	relayer := b.as(t, migrations.RoleRelayer, "")
	b.queuedAndInFlight(t, schema, relayer)
	for i, got := range refusedChanges(t, b, relayer, schema) {
		if got != "done" {
			t.Fatalf("%s\nas a relayer before 042: %s, want done (the scene shows nothing)", changedInstructions(schema)[i], got)
		}
	}
	if err := migrations.MigrateWith(b.ctx, b.as(t, migrations.RoleOwner, ""), migrations.Options{Schema: schema}); err != nil {
		t.Fatalf("upgrade as the owner: %v", err)
	}
	for i, got := range refusedChanges(t, b, relayer, schema) {
		if got != "refused" {
			t.Errorf("%s\nas a relayer after 042: %s, want refused", changedInstructions(schema)[i], got)
		}
	}
}
