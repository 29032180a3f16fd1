package migrations_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ledgerline/outbox/admin"
	"github.com/ledgerline/outbox/engine"
	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/migrations"
	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/pending"
	"github.com/ledgerline/outbox/rails"
	"github.com/ledgerline/outbox/reaper"
	"github.com/ledgerline/outbox/relay"
)

// rolesBundle is a migrated database whose roles were set up by
// CreateRoles, and sessions connected as each role.
type rolesBundle struct {
	ctx      context.Context
	url      string // as the tests' role
	admin    *pgxpool.Pool
	producer *pending.Producer
	st       *store.Store
}

func setupRoles(t *testing.T) *rolesBundle {
	t.Helper()
	url := testdb.URL(t)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	// Roles are created, and ownership handed over, by a superuser.
	admin, err := pgx.ParseConfig(testdb.AdminURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User, cfg.ConnConfig.Password = admin.User, admin.Password
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := migrations.CreateRoles(t.Context(), pool, ""); err != nil {
		t.Fatal(err)
	}
	// Idempotent: a second run changes nothing and fails nothing.
	if err := migrations.CreateRoles(t.Context(), pool, ""); err != nil {
		t.Fatal(err)
	}
	producer, err := pending.NewProducer(pending.Config{})
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.New("")
	if err != nil {
		t.Fatal(err)
	}
	return &rolesBundle{ctx: t.Context(), url: url, admin: pool, producer: producer, st: st}
}

// as connects as role, scoped to tenant ("*" for all tenants, "" for the
// rows without one).
func (b *rolesBundle) as(t *testing.T, role, tenant string) *pgxpool.Pool {
	t.Helper()
	pool := b.connect(t, role, tenant)
	var who string
	if err := pool.QueryRow(b.ctx, "SELECT current_user").Scan(&who); err != nil || who != role {
		t.Fatalf("connected as %q (%v), want %q", who, err, role)
	}
	return pool
}

// connect opens a pool logged in as user, with outbox.tenant set to
// tenant on each connection.
func (b *rolesBundle) connect(t *testing.T, user, tenant string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(b.url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User, cfg.ConnConfig.Password = user, ""
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, "SELECT set_config($1, $2, false)", migrations.TenantSetting, tenant)
		return err
	}
	pool, err := pgxpool.NewWithConfig(b.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func (b *rolesBundle) enqueue(t *testing.T, db *pgxpool.Pool, tenant, key string) (pending.Receipt, error) {
	t.Helper()
	return b.producer.Enqueue(b.ctx, db, pending.Instruction{
		InstructionID: "ins-" + key, ParticipantID: "p-" + key, IdempotencyKey: key, TenantID: tenant,
		RailType: "sandbox", AmountMinor: 100, Currency: "USD", Destination: "acct-1",
	})
}

// settle claims every due instruction as db and records each with state.
func (b *rolesBundle) settle(t *testing.T, db *pgxpool.Pool, state store.State) []store.Claimed {
	t.Helper()
	claimed, err := b.st.Claim(b.ctx, db, store.ClaimParams{RelayerID: "r1", Limit: 100,
		Leases: map[string]time.Duration{"sandbox": time.Hour}})
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	var outcomes []store.Outcome
	for _, c := range claimed {
		id, _ := uuid.NewV7()
		o := store.Outcome{Identity: c.Identity, AttemptID: id, ClaimAttemptID: c.AttemptID, AttemptNo: c.AttemptNo,
			RelayerID: "r1", ClaimedAt: c.ClaimedAt, State: state, CountAttempt: true}
		if state == store.Failed {
			o.ErrorCode = "RAIL_REJECTED"
		}
		outcomes = append(outcomes, o)
	}
	if len(outcomes) > 0 {
		if _, _, err := b.st.Record(b.ctx, db, outcomes, store.HandoffParams{}); err != nil {
			t.Fatalf("record: %v", err)
		}
		// Sent again, as after a lost commit reply: the archive is read
		// (archived_attempt) with db's privileges, and each outcome is
		// known as recorded on time.
		again, _, err := b.st.Record(b.ctx, db, outcomes, store.HandoffParams{})
		if err != nil || len(again) != len(outcomes) {
			t.Fatalf("record again: %d of %d, %v", len(again), len(outcomes), err)
		}
		for _, r := range again {
			if r.Late {
				t.Fatalf("a resent outcome was taken for a late one: %+v", r)
			}
		}
	}
	return claimed
}

// refused fails unless every statement fails as db for lack of privilege
// (SQLSTATE 42501: permission denied, must be owner, or a row-level
// security check).
func refused(t *testing.T, ctx context.Context, db *pgxpool.Pool, statements ...string) {
	t.Helper()
	for _, q := range statements {
		_, err := db.Exec(ctx, q)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
			t.Errorf("%s: got %v, want a 42501 refusal", q, err)
		}
	}
}

// archiveTampering is what an insider would try on the archive.
var archiveTampering = []string{
	`UPDATE outbox.attempts SET rail_reference = 'forged'`,
	`DELETE FROM outbox.attempts`,
	`TRUNCATE outbox.attempts`,
	`ALTER TABLE outbox.attempts DISABLE TRIGGER attempts_append_only`,
	`DROP TABLE outbox.attempts_default`,
	`CREATE TABLE outbox.evil (x int)`,
	`SET session_replication_role = replica`,
	`UPDATE outbox.checkpoints SET row_count = 0`,
	`DELETE FROM outbox.checkpoints`,
}

// TestUpgradeByTheOwnerKeepsProducersEnqueueing: a schema with the roles
// in place, upgraded by outbox_owner alone (no second --create-roles),
// still lets producers enqueue and relayers settle poison dead letters.
// Migration 13 moved the one-instruction enqueue to allocate_sequence:
// created by the owner, it must run as the owner, as allocate_sequences
// does, since producers may not touch sequences; and it must not be open
// to every role. Migration 16's settle_poison_dead_letters likewise, for
// relayers, who may not delete dead letters. Migrations 17 and 22 replace
// the operators' functions, which must keep their standing.
func TestUpgradeByTheOwnerKeepsProducersEnqueueing(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	const schema = "upgraded"
	if err := migrations.MigrateWith(b.ctx, b.admin, migrations.Options{Schema: schema, TargetVersion: 12}); err != nil {
		t.Fatal(err)
	}
	// The roles as the version-12 build set them up: today's statements
	// without those for allocate_sequence, settle_poison_dead_letters and
	// vacuum_horizon, and the rail pauses, which did not exist yet.
	sql, err := migrations.RolesSQL(schema)
	if err != nil {
		t.Fatal(err)
	}
	var v12 []string
	for _, line := range strings.Split(rolesBefore036(sql), "\n") {
		if !strings.Contains(line, "allocate_sequence(text)") && !strings.Contains(line, "settle_poison_dead_letters") &&
			!strings.Contains(line, "vacuum_horizon") && !strings.Contains(line, "rail_pause") && !strings.Contains(line, "pause_rail") && !strings.Contains(line, "resume_rail") &&
			!strings.Contains(line, "cancel_pending") && !strings.Contains(line, "any_tenant") && !strings.Contains(line, "archived_claim") &&
			!strings.Contains(line, "take_checkpoint") && !strings.Contains(line, "enqueue_") && !strings.Contains(line, "FROM outbox_producer") {
			v12 = append(v12, line)
		}
	}
	// Before migration 027 the script granted auditors and operators
	// every table of the schema, the archive's partitions included.
	v12 = append(v12, "GRANT SELECT ON ALL TABLES IN SCHEMA "+schema+" TO outbox_auditor, outbox_operator;")
	// Before migration 031 relayers inserted checkpoints themselves.
	v12 = append(v12, "GRANT INSERT ON "+schema+".checkpoints TO outbox_relayer;")
	// And updated any column of sequences.
	v12 = append(v12, "GRANT UPDATE ON "+schema+".sequences TO outbox_relayer;")
	// Before migration 033 producers inserted pending rows and stamped
	// their keys themselves, allocating through allocate_sequences.
	v12 = append(v12, "GRANT INSERT ON "+schema+".pending TO outbox_producer;",
		"GRANT UPDATE (sequence_id) ON "+schema+".idempotency_keys TO outbox_producer;",
		"GRANT EXECUTE ON FUNCTION "+schema+".allocate_sequences(text[], int[]) TO outbox_producer;")
	if _, err := b.admin.Exec(b.ctx, strings.Join(v12, "\n")); err != nil {
		t.Fatalf("roles at version 12: %v", err)
	}
	if err := migrations.MigrateWith(b.ctx, b.as(t, migrations.RoleOwner, ""), migrations.Options{Schema: schema}); err != nil {
		t.Fatalf("upgrade as the owner: %v", err)
	}
	producer, err := pending.NewProducer(pending.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	r, err := producer.Enqueue(b.ctx, b.as(t, migrations.RoleProducer, ""), pending.Instruction{
		InstructionID: "ins-1", ParticipantID: "p-1", IdempotencyKey: "k-1",
		RailType: "sandbox", AmountMinor: 100, Currency: "USD", Destination: "acct-1",
	})
	if err != nil || r.SequenceID != 1 {
		t.Fatalf("enqueue as producer after the upgrade: %+v, %v", r, err)
	}
	for fn, runner := range map[string]string{
		"upgraded.ensure_attempt_partitions(int)":                        migrations.RoleRelayer,
		"upgraded.allocate_sequence(text)":                               migrations.RoleProducer,
		"upgraded.enqueue_pending(uuid, text, text, text)":               migrations.RoleProducer,
		"upgraded.enqueue_pending_batch(uuid[], text[], text[], text[])": migrations.RoleProducer,
		"upgraded.settle_poison_dead_letters(uuid[])":                    migrations.RoleRelayer,
		"upgraded.archived_claim(uuid, timestamptz)":                     migrations.RoleRelayer,
		"upgraded.replay_dead_letter(uuid, text, text)":                  migrations.RoleOperator,
		"upgraded.pause_rail(text, text, text)":                          migrations.RoleOperator,
		"upgraded.resume_rail(text, text, text)":                         migrations.RoleOperator,
		"upgraded.resume_rail_shown(text, timestamptz, text, text)":      migrations.RoleOperator,
		"upgraded.cancel_pending(uuid, text, text)":                      migrations.RoleOperator,
		"upgraded.acknowledge_dead_letter(uuid, text, text)":             migrations.RoleOperator,
		"upgraded.take_checkpoint(timestamptz, interval, interval)":      migrations.RoleRelayer,
	} {
		var definer, runnerMay, auditorMay bool
		if err := b.admin.QueryRow(b.ctx, `SELECT prosecdef, has_function_privilege($2, oid, 'EXECUTE'), has_function_privilege($3, oid, 'EXECUTE')
			FROM pg_proc WHERE oid = $1::regprocedure`, fn, runner, migrations.RoleAuditor).Scan(&definer, &runnerMay, &auditorMay); err != nil {
			t.Fatal(err)
		}
		if !definer || !runnerMay || auditorMay {
			t.Errorf("%s: security definer %v (want true), executable by %s %v (want true), by the auditor %v (want false)",
				fn, definer, runner, runnerMay, auditorMay)
		}
	}
	// Migration 031: relayers checkpoint through take_checkpoint alone.
	var relayerInserts bool
	if err := b.admin.QueryRow(b.ctx, `SELECT has_table_privilege($1, 'upgraded.checkpoints', 'INSERT')`,
		migrations.RoleRelayer).Scan(&relayerInserts); err != nil || relayerInserts {
		t.Errorf("after the upgrade, the relayer inserts checkpoints itself: %v (%v), want false", relayerInserts, err)
	}
	// Relayers update a participant's queued count, never its next sequence id.
	var nextMay, queuedMay bool
	if err := b.admin.QueryRow(b.ctx, `SELECT has_column_privilege($1, 'upgraded.sequences', 'next_sequence_id', 'UPDATE'),
		has_column_privilege($1, 'upgraded.sequences', 'queued', 'UPDATE')`, migrations.RoleRelayer).Scan(&nextMay, &queuedMay); err != nil || nextMay || !queuedMay {
		t.Errorf("after the upgrade, the relayer updates sequences' next_sequence_id %v (want false), queued %v (want true), %v", nextMay, queuedMay, err)
	}
	if _, err := st0(t, schema).TakeCheckpoint(b.ctx, b.as(t, migrations.RoleRelayer, ""), time.Millisecond, 0); err != nil {
		t.Errorf("checkpoint as relayer after the upgrade: %v", err)
	}
	// Migration 022: the statements behind the operators' functions are the
	// owner's alone; operators run the functions that keep them to their
	// tenant.
	for _, fn := range []string{"replay_dead_letter_any_tenant", "acknowledge_dead_letter_any_tenant", "cancel_pending_any_tenant"} {
		var operatorMay bool
		if err := b.admin.QueryRow(b.ctx, `SELECT has_function_privilege($2, $1::regprocedure, 'EXECUTE')`,
			"upgraded."+fn+"(uuid, text, text)", migrations.RoleOperator).Scan(&operatorMay); err != nil || operatorMay {
			t.Errorf("%s: executable by the operator %v (%v), want false", fn, operatorMay, err)
		}
	}
	// Migration 027: the archive's partitions, granted to auditors and
	// operators by the version-12 script, are the owner's alone, with
	// row-level security, read through their parents.
	var open []string
	if err := b.admin.QueryRow(b.ctx, `SELECT coalesce(array_agg(i.inhrelid::regclass::text ORDER BY 1), '{}')
		FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent IN ('upgraded.attempts'::regclass, 'upgraded.attempts_detached'::regclass)
		  AND (NOT c.relrowsecurity OR has_table_privilege($1, c.oid, 'SELECT') OR has_table_privilege($2, c.oid, 'SELECT'))`,
		migrations.RoleAuditor, migrations.RoleOperator).Scan(&open); err != nil || len(open) > 0 {
		t.Errorf("after the upgrade, partitions readable by auditors or operators or without row-level security: %v (%v)", open, err)
	}
	// vacuum_horizon: for every role that reads the queue, not producers.
	var definer bool
	var may []string
	if err := b.admin.QueryRow(b.ctx, `SELECT prosecdef, array(SELECT r FROM unnest($1::text[]) r WHERE has_function_privilege(r, oid, 'EXECUTE') ORDER BY r)
		FROM pg_proc WHERE oid = 'upgraded.vacuum_horizon()'::regprocedure`,
		[]string{migrations.RoleProducer, migrations.RoleRelayer, migrations.RoleAuditor, migrations.RoleOperator}).Scan(&definer, &may); err != nil {
		t.Fatal(err)
	}
	if want := []string{migrations.RoleAuditor, migrations.RoleOperator, migrations.RoleRelayer}; !definer || !slices.Equal(may, want) {
		t.Errorf("vacuum_horizon(): security definer %v (want true), executable by %v (want %v)", definer, may, want)
	}
	// The rail pauses (migration 019): relayers read them in every claim,
	// which fails without the grant.
	st, err := store.New(schema)
	if err != nil {
		t.Fatal(err)
	}
	operator, relayer := b.as(t, migrations.RoleOperator, ""), b.as(t, migrations.RoleRelayer, "")
	if paused, err := st.PauseRail(b.ctx, operator, "sandbox", "olga", "upgrade test"); err != nil || !paused {
		t.Errorf("pause as operator after the upgrade: %v, %v", paused, err)
	}
	claimed, err := st.Claim(b.ctx, relayer, store.ClaimParams{RelayerID: "r1", Limit: 10, Leases: map[string]time.Duration{"sandbox": time.Hour}})
	if err != nil || len(claimed) != 0 {
		t.Errorf("claim of a paused rail as relayer after the upgrade: %d claimed, %v (want none, no error)", len(claimed), err)
	}
	if resumed, err := st.ResumeRail(b.ctx, operator, "sandbox", "olga", "upgrade test"); err != nil || !resumed {
		t.Errorf("resume as operator after the upgrade: %v, %v", resumed, err)
	}
	if claimed, err = st.Claim(b.ctx, relayer, store.ClaimParams{RelayerID: "r1", Limit: 10, Leases: map[string]time.Duration{"sandbox": time.Hour}}); err != nil || len(claimed) != 1 {
		t.Errorf("claim as relayer after the resume: %d claimed, %v (want 1)", len(claimed), err)
	}
	// The key retirements (migration 023): auditors and operators list the
	// archive's months, which reads them.
	for _, role := range []string{migrations.RoleAuditor, migrations.RoleOperator} {
		if _, err := st.Partitions(b.ctx, b.as(t, role, ""), false); err != nil {
			t.Errorf("archive list as %s after the upgrade: %v", role, err)
		}
	}
	var settled int64
	if err := b.as(t, migrations.RoleRelayer, "").QueryRow(b.ctx, `SELECT upgraded.settle_poison_dead_letters('{}')`).Scan(&settled); err != nil {
		t.Errorf("settle poison dead letters as relayer after the upgrade: %v", err)
	}
	var replayed int64
	if err := b.as(t, migrations.RoleOperator, "*").QueryRow(b.ctx, `SELECT upgraded.replay_dead_letter(gen_random_uuid(), 'olga', 'upgrade test')`).Scan(&replayed); err != nil || replayed != 0 {
		t.Errorf("replay as operator after the upgrade: %d, %v", replayed, err)
	}
	// Migration 033: the previous build's producers insert pending rows
	// and allocate themselves, so an upgrade that only migrated leaves
	// them their privileges (a rolling deploy); this build's roles script
	// takes them back.
	producerMay := func() (may []string) {
		t.Helper()
		if err := b.admin.QueryRow(b.ctx, `SELECT array_remove(ARRAY[
			CASE WHEN has_table_privilege($1, 'upgraded.pending', 'INSERT') THEN 'pending INSERT' END,
			CASE WHEN has_column_privilege($1, 'upgraded.idempotency_keys', 'sequence_id', 'UPDATE') THEN 'keys UPDATE' END,
			CASE WHEN has_function_privilege($1, 'upgraded.allocate_sequence(text)', 'EXECUTE') THEN 'allocate_sequence' END,
			CASE WHEN has_function_privilege($1, 'upgraded.allocate_sequences(text[], int[])', 'EXECUTE') THEN 'allocate_sequences' END], NULL)`,
			migrations.RoleProducer).Scan(&may); err != nil {
			t.Fatal(err)
		}
		return may
	}
	if may := producerMay(); len(may) != 4 {
		t.Errorf("after an upgrade that only migrated, the previous build's producers may %v, want all four", may)
	}
	if err := migrations.CreateRoles(b.ctx, b.admin, schema); err != nil {
		t.Fatal(err)
	}
	if may := producerMay(); len(may) != 0 {
		t.Errorf("after this build's roles script, producers may still %v", may)
	}
	if _, err := producer.Enqueue(b.ctx, b.as(t, migrations.RoleProducer, ""), pending.Instruction{
		InstructionID: "ins-2", ParticipantID: "p-1", IdempotencyKey: "k-2",
		RailType: "sandbox", AmountMinor: 100, Currency: "USD", Destination: "acct-1",
	}); err != nil {
		t.Errorf("enqueue as producer after this build's roles script: %v", err)
	}
}

// TestRolesDoTheirJobAndNothingElse connects as each role: each does its
// work, and every forbidden action fails.
func TestRolesDoTheirJobAndNothingElse(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	producer := b.as(t, migrations.RoleProducer, "")
	relayer := b.as(t, migrations.RoleRelayer, "")
	auditor := b.as(t, migrations.RoleAuditor, "*")
	operator := b.as(t, migrations.RoleOperator, "*")

	// The producer enqueues (a duplicate too) and reads its receipt.
	r1, err := b.enqueue(t, producer, "", "k1")
	if err != nil {
		t.Fatalf("enqueue as producer: %v", err)
	}
	if dup, err := b.enqueue(t, producer, "", "k1"); err != nil || !dup.Duplicate || dup.OutboxID != r1.OutboxID {
		t.Fatalf("duplicate as producer: %+v %v", dup, err)
	}
	if _, err := b.enqueue(t, producer, "", "k2"); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := producer.QueryRow(b.ctx, `SELECT count(*) FROM outbox.idempotency_keys`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("producer reads %d receipts (%v), want 2", n, err)
	}
	refused(t, b.ctx, producer, append([]string{
		`SELECT * FROM outbox.pending`,
		`DELETE FROM outbox.pending`,
		`UPDATE outbox.pending SET next_attempt_at = now()`,
		`SELECT * FROM outbox.attempts`,
		`INSERT INTO outbox.attempts (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
		   attempt_no, state, claimed_at) VALUES (gen_random_uuid(), 'i', 'p', 1, 'k', 'sandbox', 1, 'DISPATCHED', now())`,
		`UPDATE outbox.sequences SET next_sequence_id = 1`,
		`SELECT * FROM outbox.sequences`,
		`DELETE FROM outbox.idempotency_keys`,
		`SELECT * FROM outbox.dead_letters`,
		`SELECT outbox.replay_dead_letter(gen_random_uuid(), 'me', 'why')`,
		`SELECT outbox.ensure_attempt_partitions(3)`,
		`SELECT outbox.pause_rail('sandbox', 'me', 'why')`,
		`SELECT * FROM outbox.rail_pauses`,
		`SELECT outbox.cancel_pending(gen_random_uuid(), 'me', 'why')`,
	}, archiveTampering...)...)

	// The relayer claims, records (one dispatched, one failed), reaps,
	// registers idle, keeps partitions and checkpoints.
	b.settle(t, relayer, store.Dispatched)
	if _, err := b.enqueue(t, producer, "", "k3"); err != nil {
		t.Fatal(err)
	}
	failed := b.settle(t, relayer, store.Failed)
	if _, err := b.st.Reap(b.ctx, relayer, 10, "reaper-1", 3); err != nil {
		t.Errorf("reap as relayer: %v", err)
	}
	if err := b.st.EnsurePartitions(b.ctx, relayer, 4); err != nil {
		t.Errorf("partition upkeep as relayer: %v", err)
	}
	if err := b.st.RegisterIdle(b.ctx, relayer, "r1"); err != nil {
		t.Errorf("register idle as relayer: %v", err)
	}
	time.Sleep(2 * time.Millisecond)
	if cp, err := b.st.TakeCheckpoint(b.ctx, relayer, time.Millisecond, 0); err != nil || cp == nil {
		t.Errorf("checkpoint as relayer: %v %v", cp, err)
	}
	refused(t, b.ctx, relayer, append([]string{
		`SELECT * FROM outbox.idempotency_keys`,
		`DELETE FROM outbox.dead_letters`,
		`UPDATE outbox.dead_letters SET acknowledged_by = 'me'`,
		`SELECT outbox.replay_dead_letter(gen_random_uuid(), 'me', 'why')`,
		`ALTER TABLE outbox.pending ADD COLUMN x int`,
		`SELECT outbox.pause_rail('sandbox', 'me', 'why')`,
		`SELECT outbox.resume_rail('sandbox', 'me', 'why')`,
		`SELECT outbox.cancel_pending(gen_random_uuid(), 'me', 'why')`,
		`INSERT INTO outbox.rail_pauses (rail_type, paused_by, reason) VALUES ('sandbox', 'me', 'why')`,
		`DELETE FROM outbox.rail_pauses`,
		`UPDATE outbox.sequences SET next_sequence_id = 1`,
	}, archiveTampering...)...)

	// The operator replays and pauses a rail through the functions
	// (recorded with its name), and can do nothing else that writes.
	if ok, err := b.st.Replay(b.ctx, operator, failed[0].OutboxID, "alice", "test"); err != nil || !ok {
		t.Fatalf("replay as operator: %v %v", ok, err)
	}
	if ok, err := b.st.PauseRail(b.ctx, operator, "sandbox", "alice", "maintenance"); err != nil || !ok {
		t.Fatalf("pause as operator: %v %v", ok, err)
	}
	if ok, err := b.st.ResumeRail(b.ctx, operator, "sandbox", "alice", "maintenance over"); err != nil || !ok {
		t.Fatalf("resume as operator: %v %v", ok, err)
	}
	recalled, err := b.enqueue(t, producer, "", "k-recalled")
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := b.st.Cancel(b.ctx, operator, recalled.OutboxID, "alice", "recalled"); err != nil || !ok {
		t.Fatalf("cancel as operator: %v %v", ok, err)
	}
	refused(t, b.ctx, operator, append([]string{
		`INSERT INTO outbox.pending (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type, payload)
		   VALUES (gen_random_uuid(), 'i', 'p', 1, 'k', 'sandbox', '{}')`,
		`DELETE FROM outbox.dead_letters`,
		`UPDATE outbox.dead_letters SET acknowledged_by = 'me'`,
		`DELETE FROM outbox.pending`,
		`UPDATE outbox.sequences SET queued = 0`,
		`INSERT INTO outbox.rail_pauses (rail_type, paused_by, reason) VALUES ('sandbox', 'me', 'why')`,
		`DELETE FROM outbox.rail_pause_events`,
		`UPDATE outbox.rail_pause_events SET operator = 'mallory'`,
	}, archiveTampering...)...)

	// The auditor reads everything and verifies; it writes nothing.
	b.settle(t, relayer, store.Dispatched)
	rep, err := b.st.Verify(b.ctx, auditor, store.VerifyOptions{Ordered: true})
	if err != nil {
		t.Fatalf("verify as auditor: %v", err)
	}
	if !rep.OK() || rep.Dispatched != 3 || rep.Chained == 0 || rep.Checkpoints != 1 {
		t.Fatalf("verify as auditor: %+v", rep)
	}
	refused(t, b.ctx, auditor, append([]string{
		`INSERT INTO outbox.checkpoints (period_start, period_end, row_count, digest, hash) VALUES (now(), now() + interval '1s', 0, '\x', '\x')`,
		`SELECT outbox.replay_dead_letter(gen_random_uuid(), 'me', 'why')`,
		`SELECT outbox.acknowledge_dead_letter(gen_random_uuid(), 'me', 'why')`,
		`SELECT outbox.pause_rail('sandbox', 'me', 'why')`,
		`SELECT outbox.cancel_pending(gen_random_uuid(), 'me', 'why')`,
		`DELETE FROM outbox.idempotency_keys`,
		`UPDATE outbox.pending SET next_attempt_at = now()`,
	}, archiveTampering...)...)
}

// TestTenantIsolation: producers and auditors scoped to one tenant can
// neither read nor write another's rows, in both directions; the relayer
// works across tenants.
func TestTenantIsolation(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	producerA := b.as(t, migrations.RoleProducer, "tenant-a")
	producerB := b.as(t, migrations.RoleProducer, "tenant-b")
	relayer := b.as(t, migrations.RoleRelayer, "")

	for _, c := range []struct {
		db      *pgxpool.Pool
		own     string
		foreign string
	}{{producerA, "tenant-a", "tenant-b"}, {producerB, "tenant-b", "tenant-a"}} {
		if _, err := b.enqueue(t, c.db, c.own, c.own+"-k1"); err != nil {
			t.Fatalf("%s enqueues its own: %v", c.own, err)
		}
		_, err := b.enqueue(t, c.db, c.foreign, c.own+"-k2")
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
			t.Fatalf("%s enqueues for %s: %v, want a row-level security refusal", c.own, c.foreign, err)
		}
	}
	// The relayer dispatches both tenants' instructions.
	if claimed := b.settle(t, relayer, store.Dispatched); len(claimed) != 2 {
		t.Fatalf("relayer dispatched %d instructions, want both tenants' 2", len(claimed))
	}

	auditorA := b.as(t, migrations.RoleAuditor, "tenant-a")
	auditorB := b.as(t, migrations.RoleAuditor, "tenant-b")
	auditorAll := b.as(t, migrations.RoleAuditor, "*")
	for _, c := range []struct {
		name    string
		db      *pgxpool.Pool
		tenants []string
	}{
		{"producer A", producerA, []string{"tenant-a"}},
		{"producer B", producerB, []string{"tenant-b"}},
		{"auditor A", auditorA, []string{"tenant-a"}},
		{"auditor B", auditorB, []string{"tenant-b"}},
		{"auditor *", auditorAll, []string{"tenant-a", "tenant-b"}},
	} {
		rows, err := c.db.Query(b.ctx, `SELECT DISTINCT tenant_id FROM outbox.idempotency_keys ORDER BY 1`)
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(c.tenants) || got[0] != c.tenants[0] {
			t.Errorf("%s sees keys of %v, want %v", c.name, got, c.tenants)
		}
		if c.db == producerA || c.db == producerB {
			continue
		}
		var attemptTenants []string
		if err := c.db.QueryRow(b.ctx, `SELECT coalesce(array_agg(DISTINCT tenant_id ORDER BY tenant_id), '{}') FROM outbox.attempts`).
			Scan(&attemptTenants); err != nil {
			t.Fatal(err)
		}
		if len(attemptTenants) != len(c.tenants) || attemptTenants[0] != c.tenants[0] {
			t.Errorf("%s sees attempts of %v, want %v", c.name, attemptTenants, c.tenants)
		}
	}
	// Scoped to A, an auditor cannot read B's archive rows by their id.
	var n int
	if err := auditorA.QueryRow(b.ctx, `SELECT count(*) FROM outbox.attempts WHERE tenant_id = 'tenant-b'`).Scan(&n); err != nil || n != 0 {
		t.Errorf("auditor A counts %d of B's attempts (%v)", n, err)
	}
}

// TestOperatorsActWithinTheirTenant: the operators' functions run as the
// owner, whom row-level security does not filter; an operator scoped to
// one tenant still cannot replay, acknowledge or cancel another's
// instruction by its id (migration 022), while one scoped to every tenant,
// and the owner, can.
func TestOperatorsActWithinTheirTenant(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	relayer := b.as(t, migrations.RoleRelayer, "")
	operatorA := b.as(t, migrations.RoleOperator, "tenant-a")
	operatorAll := b.as(t, migrations.RoleOperator, "*")
	owner := b.as(t, migrations.RoleOwner, "")

	type instructions struct{ replay, ack, cancel, cancelByOwner pending.Receipt }
	producers := map[string]*pgxpool.Pool{}
	enqueue := func(tenant, key string) pending.Receipt {
		t.Helper()
		if producers[tenant] == nil {
			producers[tenant] = b.as(t, migrations.RoleProducer, tenant)
		}
		r, err := b.enqueue(t, producers[tenant], tenant, tenant+"-"+key)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	byTenant := map[string]*instructions{}
	for _, tenant := range []string{"tenant-a", "tenant-b"} {
		byTenant[tenant] = &instructions{replay: enqueue(tenant, "replay"), ack: enqueue(tenant, "ack")}
	}
	if failed := b.settle(t, relayer, store.Failed); len(failed) != 4 {
		t.Fatalf("%d dead letters, want 4", len(failed))
	}
	for tenant, ins := range byTenant {
		ins.cancel, ins.cancelByOwner = enqueue(tenant, "cancel"), enqueue(tenant, "cancel-by-owner")
	}
	act := func(who string, db *pgxpool.Pool, ins *instructions, want bool) {
		t.Helper()
		for _, c := range []struct {
			action string
			do     func() (bool, error)
		}{
			{"replay", func() (bool, error) { return b.st.Replay(b.ctx, db, ins.replay.OutboxID, "olga", "test") }},
			{"acknowledge", func() (bool, error) { return b.st.Acknowledge(b.ctx, db, ins.ack.OutboxID, "olga", "test") }},
			{"cancel", func() (bool, error) { return b.st.Cancel(b.ctx, db, ins.cancel.OutboxID, "olga", "test") }},
		} {
			if got, err := c.do(); err != nil || got != want {
				t.Errorf("%s: %s = %v, %v; want %v", who, c.action, got, err, want)
			}
		}
	}
	// Scoped to A: B's instructions are not there, and stay as they were.
	act("operator of tenant A on B's", operatorA, byTenant["tenant-b"], false)
	var dead, queued int
	if err := b.admin.QueryRow(b.ctx, `SELECT (SELECT count(*) FROM outbox.dead_letters WHERE tenant_id = 'tenant-b' AND acknowledged_at IS NULL),
		(SELECT count(*) FROM outbox.pending WHERE tenant_id = 'tenant-b')`).Scan(&dead, &queued); err != nil {
		t.Fatal(err)
	}
	if dead != 2 || queued != 2 {
		t.Errorf("after operator A's attempts, tenant B has %d unacknowledged dead letters and %d pending, want 2 and 2", dead, queued)
	}
	act("operator of tenant A on A's", operatorA, byTenant["tenant-a"], true)
	act("operator of every tenant on B's", operatorAll, byTenant["tenant-b"], true)
	for tenant, ins := range byTenant {
		if ok, err := b.st.Cancel(b.ctx, owner, ins.cancelByOwner.OutboxID, "olga", "test"); err != nil || !ok {
			t.Errorf("the owner cancels %s's instruction without a tenant setting: %v, %v", tenant, ok, err)
		}
	}
	// The statements behind the functions are the owner's alone.
	refused(t, b.ctx, operatorA, []string{
		`SELECT outbox.replay_dead_letter_any_tenant(gen_random_uuid(), 'me', 'why')`,
		`SELECT outbox.acknowledge_dead_letter_any_tenant(gen_random_uuid(), 'me', 'why')`,
		`SELECT outbox.cancel_pending_any_tenant(gen_random_uuid(), 'me', 'why')`,
	}...)
	rep, err := b.st.Verify(b.ctx, b.admin, store.VerifyOptions{Ordered: true})
	if err != nil || !rep.OK() {
		t.Fatalf("verify: %+v, %v", rep, err)
	}
}

// inFlightInTwoTenants enqueues one instruction each for tenant-a and
// tenant-b, as their producers, and has a relayer claim both (an hour's
// lease): their outbox ids by tenant.
func inFlightInTwoTenants(t *testing.T, b *rolesBundle) map[string]uuid.UUID {
	t.Helper()
	ids := map[string]uuid.UUID{}
	for _, tenant := range []string{"tenant-a", "tenant-b"} {
		r, err := b.enqueue(t, b.as(t, migrations.RoleProducer, tenant), tenant, tenant+"-held")
		if err != nil {
			t.Fatal(err)
		}
		ids[tenant] = r.OutboxID
	}
	claimed, err := b.st.Claim(b.ctx, b.as(t, migrations.RoleRelayer, ""), store.ClaimParams{RelayerID: "r1", Limit: 100,
		Leases: map[string]time.Duration{"sandbox": time.Hour}})
	if err != nil || len(claimed) != 2 {
		t.Fatalf("claim: %d, %v (want both)", len(claimed), err)
	}
	return ids
}

// TestOperatorsCancelInFlightWithinTheirTenant: where the roles are in
// place, an operator's cancel of its own tenant's instruction in flight is
// refused as in flight (store.ErrCancelInFlight, migration 044), and one
// of another tenant's is answered as not there (false, no error): the
// refusal does not tell an operator what another tenant has in flight.
// Nothing is written either way.
func TestOperatorsCancelInFlightWithinTheirTenant(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	operatorA := b.as(t, migrations.RoleOperator, "tenant-a")
	ids := inFlightInTwoTenants(t, b)
	if ok, err := b.st.Cancel(b.ctx, operatorA, ids["tenant-a"], "olga", "test"); ok || !errors.Is(err, store.ErrCancelInFlight) {
		t.Errorf("operator of tenant A cancels A's instruction in flight: %v, %v (want ErrCancelInFlight)", ok, err)
	}
	if ok, err := b.st.Cancel(b.ctx, operatorA, ids["tenant-b"], "olga", "test"); ok || err != nil {
		t.Errorf("operator of tenant A cancels B's instruction in flight: %v, %v (want false, no error)", ok, err)
	}
	var inflight, cancelled int
	if err := b.admin.QueryRow(b.ctx, `SELECT (SELECT count(*) FROM outbox.inflight),
		(SELECT count(*) FROM outbox.attempts WHERE state = 'CANCELLED')`).Scan(&inflight, &cancelled); err != nil ||
		inflight != 2 || cancelled != 0 {
		t.Fatalf("after the refusals: %d in flight, %d cancelled (%v), want 2 and 0", inflight, cancelled, err)
	}
}

// TestOperatorsReplayInFlightWithinTheirTenant: a replay or an
// acknowledgement by an operator scoped to tenant A of A's instruction in
// flight is refused as in flight (ErrDeadLetterInFlight), as its cancel
// is; it answered false, as for an id unknown, at once (the front read the
// tenant from the dead letters, where one in flight is not). Of B's, the
// operator of A is told nothing about it (false, no error), and nothing
// is written either way.
func TestOperatorsReplayInFlightWithinTheirTenant(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	operatorA := b.as(t, migrations.RoleOperator, "tenant-a")
	ids := inFlightInTwoTenants(t, b)
	for name, act := range map[string]func(uuid.UUID) (bool, error){
		"replay": func(id uuid.UUID) (bool, error) { return b.st.Replay(b.ctx, operatorA, id, "olga", "test") },
		"acknowledge": func(id uuid.UUID) (bool, error) {
			return b.st.Acknowledge(b.ctx, operatorA, id, "olga", "test")
		},
	} {
		if ok, err := act(ids["tenant-a"]); ok || !errors.Is(err, store.ErrDeadLetterInFlight) {
			t.Errorf("operator of tenant A: %s of A's instruction in flight: %v, %v (want ErrDeadLetterInFlight)", name, ok, err)
		}
		if ok, err := act(ids["tenant-b"]); ok || err != nil {
			t.Errorf("operator of tenant A: %s of B's instruction in flight: %v, %v (want false, no error)", name, ok, err)
		}
	}
	var inflight, acted int
	if err := b.admin.QueryRow(b.ctx, `SELECT (SELECT count(*) FROM outbox.inflight),
		(SELECT count(*) FROM outbox.attempts WHERE state IN ('REPLAYED', 'ACKNOWLEDGED'))`).Scan(&inflight, &acted); err != nil ||
		inflight != 2 || acted != 0 {
		t.Fatalf("after the refusals: %d in flight, %d operator rows (%v), want 2 and 0", inflight, acted, err)
	}
}

// TestRelayServiceAsRelayerRole: the whole relay service (relayer,
// reaper with partition upkeep, checkpoints and the removal of dead
// relayers' idle registrations, metrics) runs connected as
// outbox_relayer, fed by a producer connected as outbox_producer.
func TestRelayServiceAsRelayerRole(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	producer := b.as(t, migrations.RoleProducer, "")
	relayer := b.as(t, migrations.RoleRelayer, "")
	// A relayer killed two hours ago left its idle registration.
	if _, err := b.admin.Exec(b.ctx, `INSERT INTO outbox.relayer_idle VALUES ('killed', now() - interval '2 hours')`); err != nil {
		t.Fatal(err)
	}
	set, err := rails.NewSet(rails.Options{Type: "sandbox", Profile: payment.Generic{},
		Transport: rails.NewSandbox(rails.SandboxOptions{}), Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := relay.New(relayer, relay.Config{Relayer: engine.Config{Rails: set}, Metrics: prometheus.NewRegistry(),
		Reaper: reaper.Config{Interval: time.Second, CheckpointInterval: time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Start(b.ctx); err != nil {
		t.Fatalf("relay as %s: %v", migrations.RoleRelayer, err)
	}
	defer svc.Stop(context.WithoutCancel(b.ctx))
	const n = 20
	for i := range n {
		if _, err := b.enqueue(t, producer, "", fmt.Sprintf("k%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(30 * time.Second); svc.Relayer().Stats().Dispatched < n; {
		if time.Now().After(deadline) {
			t.Fatalf("dispatched %d of %d", svc.Relayer().Stats().Dispatched, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		var stale bool
		if err := b.admin.QueryRow(b.ctx, `SELECT EXISTS (SELECT FROM outbox.relayer_idle WHERE relayer_id = 'killed')`).Scan(&stale); err != nil {
			t.Fatal(err)
		}
		if !stale {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the reaper, as outbox_relayer, did not remove a dead relayer's idle registration")
		}
		time.Sleep(50 * time.Millisecond)
	}
	for deadline := time.Now().Add(30 * time.Second); svc.Reaper().Stats().Checkpoints == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the reaper took no checkpoint")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := svc.Stop(b.ctx); err != nil {
		t.Fatal(err)
	}
	rep, err := b.st.Verify(b.ctx, b.as(t, migrations.RoleAuditor, "*"), store.VerifyOptions{Ordered: true})
	if err != nil || !rep.OK() || rep.Dispatched != n {
		t.Fatalf("verify: %+v %v", rep, err)
	}
}

// TestAdminAsOperatorRole: the admin address's views and actions work on a
// connection as outbox_operator across tenants (what --admin-database-url
// is for): overview, readiness, listings, the participant view, a trail by
// instruction id, verify, a replay and an acknowledgement, archived with
// the token's name.
func TestAdminAsOperatorRole(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	producer := b.as(t, migrations.RoleProducer, "acme")
	relayer := b.as(t, migrations.RoleRelayer, "")
	operator := b.as(t, migrations.RoleOperator, "*")
	r, err := b.enqueue(t, producer, "acme", "k-op")
	if err != nil {
		t.Fatal(err)
	}
	b.settle(t, relayer, store.Failed)
	r2, err := b.enqueue(t, producer, "acme", "k-op2")
	if err != nil {
		t.Fatal(err)
	}
	b.settle(t, relayer, store.Failed)
	tok, err := admin.NewToken("olga", admin.RoleOperator, "olga-secret-0123456789")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := admin.New(admin.Config{Pool: operator, Tokens: []admin.Token{tok}})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()
	for _, c := range []struct{ method, path, body, want string }{
		{"GET", "/readyz", "", `"status":"ready"`},
		{"GET", "/api/v1/overview", "", `"dead_letters":2`},
		{"GET", "/api/v1/instructions?state=in_flight", "", `"items":[]`},
		{"GET", "/api/v1/participants/p-k-op", "", `"state":"clear"`},
		{"GET", "/api/v1/dead-letters", "", r.OutboxID.String()},
		{"POST", "/api/v1/dead-letters/" + r.OutboxID.String() + "/replay", `{"reason":"fixed"}`, `"done":true`},
		{"GET", "/api/v1/trail?instruction_id=ins-k-op", "", `"REPLAYED"`},
		{"POST", "/api/v1/dead-letters/" + r2.OutboxID.String() + "/acknowledge", `{"reason":"refunded"}`, `"done":true`},
		{"GET", "/api/v1/trail?instruction_id=ins-k-op2", "", `"ACKNOWLEDGED"`},
		{"POST", "/api/v1/verify", "", `"ok":true`},
	} {
		req, _ := http.NewRequestWithContext(b.ctx, c.method, hs.URL+c.path, strings.NewReader(c.body))
		req.Header.Set("Authorization", "Bearer olga-secret-0123456789")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(body), c.want) {
			t.Errorf("%s %s as %s: %d %s (want %s)", c.method, c.path, migrations.RoleOperator, resp.StatusCode, body, c.want)
		}
	}
}

// reapAs reaps as db until n expired leases have been requeued (bounded).
func (b *rolesBundle) reapAs(t *testing.T, db *pgxpool.Pool, n int) {
	t.Helper()
	for reaped, deadline := 0, time.Now().Add(20*time.Second); reaped < n; time.Sleep(10 * time.Millisecond) {
		r, err := b.st.Reap(b.ctx, db, 10, "reaper-1", 3)
		if err != nil {
			t.Fatalf("reap as relayer: %v", err)
		}
		if reaped += len(r); reaped < n && time.Now().After(deadline) {
			t.Fatal("the leases did not run out")
		}
	}
}

// TestLateOutcomesAsRelayerRole: a relayer presumed dead reports its
// outcomes after the reaper requeued them (a late DISPATCHED withdraws the
// copy, a late FAILED makes it a dead letter) with nothing but the
// relayer's privileges.
func TestLateOutcomesAsRelayerRole(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	producer := b.as(t, migrations.RoleProducer, "")
	relayer := b.as(t, migrations.RoleRelayer, "")
	for _, key := range []string{"k1", "k2"} {
		if _, err := b.enqueue(t, producer, "", key); err != nil {
			t.Fatal(err)
		}
	}
	claimed, err := b.st.Claim(b.ctx, relayer, store.ClaimParams{RelayerID: "slow", Limit: 10,
		Leases: map[string]time.Duration{"sandbox": time.Millisecond}})
	if err != nil || len(claimed) != 2 {
		t.Fatalf("claim as relayer: %d claimed, %v", len(claimed), err)
	}
	b.reapAs(t, relayer, len(claimed))
	var outcomes []store.Outcome
	for i, c := range claimed {
		id, _ := uuid.NewV7()
		o := store.Outcome{Identity: c.Identity, AttemptID: id, ClaimAttemptID: c.AttemptID, AttemptNo: c.AttemptNo,
			RelayerID: "slow", ClaimedAt: c.ClaimedAt, State: store.Dispatched, CountAttempt: true}
		if i == 1 {
			o.State, o.ErrorCode = store.Failed, "RAIL_REJECTED"
		}
		outcomes = append(outcomes, o)
	}
	rec, _, err := b.st.Record(b.ctx, relayer, outcomes, store.HandoffParams{})
	if err != nil {
		t.Fatalf("late outcomes as relayer: %v", err)
	}
	for i, r := range rec {
		if !r.Late || !r.Withdrew {
			t.Errorf("late outcome %d recorded %+v, want late and withdrawn", i, r)
		}
	}
}

// TestLateOutcomeOfADetachedClaimAsRelayerRole: a relayer cut off from
// the database across a month's end records a late outcome after an
// operator detached the month of its claim. The late row repeats the
// claim's identity and follows its hash, read from the detached month,
// which the relayer role does not read otherwise (archived_claim runs as
// the owner).
func TestLateOutcomeOfADetachedClaimAsRelayerRole(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	producer := b.as(t, migrations.RoleProducer, "")
	relayer := b.as(t, migrations.RoleRelayer, "")
	if _, err := b.enqueue(t, producer, "", "k1"); err != nil {
		t.Fatal(err)
	}
	claimed, err := b.st.Claim(b.ctx, relayer, store.ClaimParams{RelayerID: "slow", Limit: 1,
		Leases: map[string]time.Duration{"sandbox": time.Millisecond}})
	if err != nil || len(claimed) != 1 {
		t.Fatalf("claim as relayer: %d claimed, %v", len(claimed), err)
	}
	c := claimed[0]
	b.reapAs(t, relayer, 1)
	// Detach the claim's month by hand (outbox archive detach refuses a
	// month that has not ended); the late row goes to the default
	// partition.
	var partition, bound string
	var claimHash []byte
	if err := b.admin.QueryRow(b.ctx, `SELECT a.tableoid::regclass::text, pg_get_expr(c.relpartbound, c.oid), a.hash
		FROM outbox.attempts a JOIN pg_class c ON c.oid = a.tableoid WHERE a.attempt_id = $1`, c.AttemptID).Scan(&partition, &bound, &claimHash); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`ALTER TABLE outbox.attempts DETACH PARTITION ` + partition,
		`ALTER TABLE outbox.attempts_detached ATTACH PARTITION ` + partition + ` ` + bound,
	} {
		if _, err := b.admin.Exec(b.ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	id, _ := uuid.NewV7()
	o := store.Outcome{Identity: store.Identity{OutboxID: c.OutboxID}, AttemptID: id, ClaimAttemptID: c.AttemptID,
		ClaimedAt: c.ClaimedAt, State: store.Retryable, ErrorCode: "RAIL_UNAVAILABLE", CountAttempt: true}
	rec, _, err := b.st.Record(b.ctx, relayer, []store.Outcome{o}, store.HandoffParams{})
	if err != nil || len(rec) != 1 || !rec[0].Late {
		t.Fatalf("late outcome of a detached claim as relayer: %+v, %v", rec, err)
	}
	var instruction, participant, key, relayerID string
	var attemptNo int
	var prev []byte
	if err := b.admin.QueryRow(b.ctx, `SELECT instruction_id, participant_id, idempotency_key, relayer_id, attempt_no, prev_hash
		FROM outbox.attempts WHERE attempt_id = $1 AND late`, id).Scan(&instruction, &participant, &key, &relayerID, &attemptNo, &prev); err != nil {
		t.Fatalf("the late row: %v", err)
	}
	if instruction != c.InstructionID || participant != c.ParticipantID || key != c.IdempotencyKey || relayerID != "slow" ||
		attemptNo != c.AttemptNo || string(prev) != string(claimHash) {
		t.Errorf("late row %s %s %s %s #%d after %x, want the detached claim's %s %s %s slow #%d after %x",
			instruction, participant, key, relayerID, attemptNo, prev, c.InstructionID, c.ParticipantID, c.IdempotencyKey,
			c.AttemptNo, claimHash)
	}
}

// TestBatchEnqueueAsProducerRole: a batch (with a duplicate of an earlier
// instruction and a twin inside the batch) enqueues with nothing but the
// producer's privileges, under its tenant.
func TestBatchEnqueueAsProducerRole(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	producer := b.as(t, migrations.RoleProducer, "acme")
	if _, err := b.enqueue(t, producer, "acme", "k0"); err != nil {
		t.Fatal(err)
	}
	var batch []pending.Instruction
	for _, key := range []string{"k0", "k1", "k2", "k1"} {
		participant := "p-1"
		if key == "k0" {
			participant = "p-k0" // as b.enqueue made it
		}
		batch = append(batch, pending.Instruction{InstructionID: "ins-" + key, ParticipantID: participant, IdempotencyKey: key, TenantID: "acme",
			RailType: "sandbox", AmountMinor: 100, Currency: "USD", Destination: "acct-1"})
	}
	var receipts []pending.Receipt
	err := pgx.BeginFunc(b.ctx, producer, func(tx pgx.Tx) error {
		var err error
		receipts, err = b.producer.EnqueueBatch(b.ctx, tx, batch)
		return err
	})
	if err != nil {
		t.Fatalf("batch enqueue as producer: %v", err)
	}
	var got []string
	for _, r := range receipts {
		got = append(got, fmt.Sprintf("seq %d duplicate %v", r.SequenceID, r.Duplicate))
	}
	// k0 was p-k0's first; k1 and k2 are p-1's first two; the second k1 is
	// the first's twin.
	want := []string{"seq 1 duplicate true", "seq 1 duplicate false", "seq 2 duplicate false", "seq 1 duplicate true"}
	if strings.Join(got, ", ") != strings.Join(want, ", ") {
		t.Fatalf("receipts %v, want %v", got, want)
	}
}

// TestVacuumHorizonAsEachRole: a producer's session keeps a transaction
// open. The relayer, auditor and operator roles cannot see its state or
// start in pg_stat_activity (another role's session), yet the horizon
// names it with both for each of them (vacuum_horizon runs as the owner, a
// member of pg_read_all_stats); the producer may not call it.
func TestVacuumHorizonAsEachRole(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	producer := b.as(t, migrations.RoleProducer, "")
	holder, err := producer.Acquire(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release()
	if _, err := holder.Exec(b.ctx, `BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1`); err != nil {
		t.Fatal(err)
	}
	defer holder.Exec(context.Background(), `ROLLBACK`)
	pid := holder.Conn().PgConn().PID()
	for _, role := range []string{migrations.RoleRelayer, migrations.RoleAuditor, migrations.RoleOperator} {
		pool := b.as(t, role, "*")
		var hidden bool
		if err := pool.QueryRow(b.ctx, `SELECT xact_start IS NULL AND state IS NULL FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&hidden); err != nil {
			t.Fatal(err)
		}
		if !hidden {
			t.Errorf("%s sees another role's session's details in pg_stat_activity: this test shows nothing", role)
		}
		snap, err := b.st.Snapshot(b.ctx, pool)
		if err != nil {
			t.Fatalf("snapshot as %s: %v", role, err)
		}
		h := snap.VacuumHorizon
		if snap.VacuumHorizonPartial || h == nil || h.Kind != "session" || h.ID != fmt.Sprint(pid) || h.Role != migrations.RoleProducer ||
			h.State != "idle in transaction" || h.Since == nil {
			t.Errorf("as %s the horizon is held by %+v (partial %v), want the producer's session %d", role, h, snap.VacuumHorizonPartial, pid)
		}
	}
	refused(t, b.ctx, producer, `SELECT * FROM outbox.vacuum_horizon()`)
}

// TestArchivePartitionsReadThroughTheirParentsOnly: row-level security by
// tenant is on the archive's parents (attempts, attempts_detached), and
// PostgreSQL applies a parent's policies only to queries that name the
// parent. An auditor or operator scoped to one tenant, granted SELECT on a
// partition, read every tenant's rows of that month by naming it. No role
// but the owner may read a partition, and each has row-level security
// without a policy (migration 027, roles.sql): the months the migrations
// created, the default partition, a month a relayer's partition upkeep
// created later (it runs as the owner, whose default privileges here grant
// the readers every new table), a month `outbox archive detach` moved
// into attempts_detached after a grant by hand, and all of them again
// after --create-roles runs once more over grants made by hand. The
// readers still read the archive through the parents and the archive
// view, and `outbox archive export` and `archive list --exact` show a
// reader scoped to a tenant that tenant's rows of the month alone.
func TestArchivePartitionsReadThroughTheirParentsOnly(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	relayer := b.as(t, migrations.RoleRelayer, "")
	for _, tenant := range []string{"tenant-a", "tenant-b"} {
		if _, err := b.enqueue(t, b.as(t, migrations.RoleProducer, tenant), tenant, tenant+"-k1"); err != nil {
			t.Fatal(err)
		}
	}
	if claimed := b.settle(t, relayer, store.Dispatched); len(claimed) != 2 {
		t.Fatalf("dispatched %d, want 2", len(claimed))
	}
	// Copies of the rows (as the superuser; hashes are not checked here)
	// in the default partition (a century on), in a month that partition
	// upkeep creates below (eight months on), and in a month that ended
	// long ago (moved to attempts_detached below).
	copyRows := func(shift string) {
		t.Helper()
		if _, err := b.admin.Exec(b.ctx, `INSERT INTO outbox.attempts
			SELECT (jsonb_populate_record(NULL::outbox.attempts, to_jsonb(a) || jsonb_build_object('created_at', `+shift+`))).*
			FROM outbox.attempts a WHERE a.created_at < now() + interval '1 month'`); err != nil {
			t.Fatalf("copy rows to %s: %v", shift, err)
		}
	}
	copyRows(`a.created_at + interval '100 years'`)
	// Partition upkeep as the relayer (it runs as the owner), with default
	// privileges that grant the readers every table the owner creates.
	if _, err := b.admin.Exec(b.ctx, `ALTER DEFAULT PRIVILEGES FOR ROLE outbox_owner IN SCHEMA outbox
		GRANT SELECT ON TABLES TO outbox_auditor, outbox_operator, PUBLIC`); err != nil {
		t.Fatal(err)
	}
	if err := b.st.EnsurePartitions(b.ctx, relayer, 9); err != nil {
		t.Fatalf("partition upkeep as relayer: %v", err)
	}
	var upkept string
	if err := b.admin.QueryRow(b.ctx, `SELECT c.relname FROM pg_class c WHERE c.oid = to_regclass('outbox.attempts_' ||
		to_char(date_trunc('month', now() AT TIME ZONE 'UTC') + interval '8 months', 'YYYY_MM'))
		AND pg_get_userbyid(c.relowner) = 'outbox_owner'`).Scan(&upkept); err != nil {
		t.Fatalf("the month partition upkeep created: %v", err)
	}
	copyRows(`date_trunc('month', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' + interval '8 months 1 day'`)
	// A month long over, readable by the auditors by hand, detached.
	for _, q := range []string{
		`CREATE TABLE outbox.attempts_2020_01 PARTITION OF outbox.attempts FOR VALUES FROM ('2020-01-01 00:00Z') TO ('2020-02-01 00:00Z')`,
		`GRANT SELECT ON outbox.attempts_2020_01 TO outbox_auditor, outbox_operator`,
	} {
		if _, err := b.admin.Exec(b.ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	copyRows(`timestamptz '2020-01-15 00:00Z'`)
	time.Sleep(2 * time.Millisecond)
	if cp, err := b.st.TakeCheckpoint(b.ctx, relayer, time.Millisecond, 0); err != nil || cp == nil {
		t.Fatalf("checkpoint as relayer: %v %v", cp, err)
	}
	if detached, err := b.st.DetachArchive(b.ctx, b.admin, time.Date(2020, 2, 1, 0, 0, 0, 0, time.UTC), time.Minute); err != nil ||
		!slices.Equal(detached, []string{"attempts_2020_01"}) {
		t.Fatalf("detach: %v, %v", detached, err)
	}

	type partition struct {
		name, parent string
		a, b         int // rows of each tenant
	}
	partitions := func() []partition {
		t.Helper()
		rows, err := b.admin.Query(b.ctx, `WITH archive AS (
			  SELECT tableoid, tenant_id FROM outbox.attempts UNION ALL SELECT tableoid, tenant_id FROM outbox.attempts_detached)
			SELECT c.relname, p.relname,
			(SELECT count(*) FROM archive a WHERE a.tableoid = c.oid AND a.tenant_id = 'tenant-a'),
			(SELECT count(*) FROM archive a WHERE a.tableoid = c.oid AND a.tenant_id = 'tenant-b')
			FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent
			WHERE i.inhparent IN ('outbox.attempts'::regclass, 'outbox.attempts_detached'::regclass) ORDER BY 1`)
		if err != nil {
			t.Fatal(err)
		}
		var out []partition
		for rows.Next() {
			var p partition
			if err := rows.Scan(&p.name, &p.parent, &p.a, &p.b); err != nil {
				t.Fatal(err)
			}
			out = append(out, p)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	// Each kind of partition holds rows of both tenants.
	holding := map[string]bool{}
	for _, p := range partitions() {
		if p.a > 0 && p.b > 0 {
			holding[p.name] = true
		}
	}
	for _, name := range []string{"attempts_default", upkept, "attempts_2020_01"} {
		if !holding[name] {
			t.Fatalf("partition %s holds rows of only one tenant or none: the test shows nothing there", name)
		}
	}

	auditorA, operatorA := b.as(t, migrations.RoleAuditor, "tenant-a"), b.as(t, migrations.RoleOperator, "tenant-a")
	auditorAll := b.as(t, migrations.RoleAuditor, "*")
	sealed := func(when string) {
		t.Helper()
		for _, p := range partitions() {
			var rls bool
			var readers []string
			if err := b.admin.QueryRow(b.ctx, `SELECT c.relrowsecurity,
				array(SELECT r FROM unnest($2::text[]) r WHERE has_table_privilege(r, c.oid, 'SELECT') ORDER BY r)
				FROM pg_class c WHERE c.oid = ('outbox.' || quote_ident($1))::regclass`, p.name,
				[]string{migrations.RoleProducer, migrations.RoleRelayer, migrations.RoleAuditor, migrations.RoleOperator}).
				Scan(&rls, &readers); err != nil {
				t.Fatal(err)
			}
			if !rls || len(readers) > 0 {
				t.Errorf("%s: partition %s (of %s): row-level security %v (want true), readable by %v (want nobody but the owner)",
					when, p.name, p.parent, rls, readers)
			}
			for role, db := range map[string]*pgxpool.Pool{"auditor": auditorA, "operator": operatorA} {
				var n int
				err := db.QueryRow(b.ctx, `SELECT count(*) FROM outbox.`+pgx.Identifier{p.name}.Sanitize()+` WHERE tenant_id = 'tenant-b'`).Scan(&n)
				var pgErr *pgconn.PgError
				if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
					t.Errorf("%s: %s of tenant A reads partition %s directly: %d of tenant B's rows, %v (want a 42501 refusal)",
						when, role, p.name, n, err)
				}
			}
		}
	}
	sealed("after partition upkeep and a detach")

	// The default partition's rows (a century on) moved into a month of
	// their own by the superuser: owned by outbox_owner, sealed like the
	// others, whatever the creator's default privileges.
	moved, err := b.st.MoveDefaultRows(b.ctx, b.admin, time.Minute)
	if err != nil || len(moved) == 0 {
		t.Fatalf("move the default partition's rows: %+v, %v", moved, err)
	}
	for _, m := range moved {
		var owner string
		if err := b.admin.QueryRow(b.ctx, `SELECT pg_get_userbyid(relowner) FROM pg_class WHERE oid = to_regclass('outbox.' || $1)`, m.Partition).Scan(&owner); err != nil || owner != "outbox_owner" {
			t.Errorf("%s moved out of the default partition is owned by %q (%v), want outbox_owner", m.Partition, owner, err)
		}
	}
	sealed("after moving the default partition's rows")

	// Grants by hand, then --create-roles again (as after the next
	// migration): nobody but the owner reads a partition still.
	if _, err := b.admin.Exec(b.ctx, `GRANT SELECT ON outbox.attempts_default, outbox.`+pgx.Identifier{upkept}.Sanitize()+`
		TO outbox_auditor, outbox_operator, PUBLIC`); err != nil {
		t.Fatal(err)
	}
	if err := migrations.CreateRoles(b.ctx, b.admin, ""); err != nil {
		t.Fatal(err)
	}
	sealed("after --create-roles")

	// Through the parents and the archive view, each reader reads its own.
	for name, c := range map[string]struct {
		db   *pgxpool.Pool
		a, b bool
	}{"auditor of tenant A": {auditorA, true, false}, "operator of tenant A": {operatorA, true, false}, "auditor of every tenant": {auditorAll, true, true}} {
		for _, from := range []string{"outbox.attempts", "outbox.attempts_detached", "outbox.archive"} {
			var a, bb int
			if err := c.db.QueryRow(b.ctx, `SELECT count(*) FILTER (WHERE tenant_id = 'tenant-a'), count(*) FILTER (WHERE tenant_id = 'tenant-b') FROM `+from).
				Scan(&a, &bb); err != nil {
				t.Fatalf("%s reads %s: %v", name, from, err)
			}
			if (a > 0) != c.a || (bb > 0) != c.b {
				t.Errorf("%s reads %d of tenant A's and %d of tenant B's rows through %s", name, a, bb, from)
			}
		}
	}
	// archive export and list --exact: a tenant's rows of the month alone,
	// every tenant's for a reader of every tenant.
	export := func(db *pgxpool.Pool, name string) (int64, string) {
		t.Helper()
		conn, err := db.Acquire(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Release()
		var csv strings.Builder
		n, err := b.st.ExportPartition(b.ctx, conn.Conn(), name, &csv)
		if err != nil {
			t.Fatalf("export %s: %v", name, err)
		}
		return n, csv.String()
	}
	listA, err := b.st.Partitions(b.ctx, auditorA, true)
	if err != nil {
		t.Fatalf("archive list --exact as auditor of tenant A: %v", err)
	}
	counted := map[string]int64{}
	for _, p := range listA {
		counted[p.Name] = p.Rows
	}
	for _, p := range partitions() {
		n, csv := export(auditorA, p.name)
		if n != int64(p.a) || strings.Contains(csv, "tenant-b") || counted[p.name] != int64(p.a) {
			t.Errorf("partition %s as auditor of tenant A: export of %d rows (tenant B's in it: %v), list --exact %d; want tenant A's %d",
				p.name, n, strings.Contains(csv, "tenant-b"), counted[p.name], p.a)
		}
		if n, _ := export(auditorAll, p.name); n != int64(p.a+p.b) {
			t.Errorf("partition %s as auditor of every tenant: export of %d rows, want %d", p.name, n, p.a+p.b)
		}
	}
}

// TestCheckpointsOnlyThroughTakeCheckpoint: no role but the owner writes a
// checkpoint row itself. A relayer (or anyone with INSERT on checkpoints)
// could append a checkpoint whose period ends in the future: every later
// take_checkpoint starts from its end and finds no period to close, and
// audit verify reports it once rows arrive in it. Relayers checkpoint
// through take_checkpoint alone, which closes no period past its clock.
func TestCheckpointsOnlyThroughTakeCheckpoint(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	relayer := b.as(t, migrations.RoleRelayer, "")
	forged := `INSERT INTO outbox.checkpoints (period_start, period_end, row_count, digest, hash)
	  VALUES ((SELECT chained_since FROM outbox.settings), now() + interval '1 day', 0, '\x', '\x')`
	refused(t, b.ctx, relayer, forged)
	for _, role := range []string{migrations.RoleProducer, migrations.RoleAuditor, migrations.RoleOperator} {
		refused(t, b.ctx, b.as(t, role, "*"), forged, `SELECT * FROM outbox.take_checkpoint(now())`)
	}
	// Through the function, with an end a day ahead: the period it closes
	// ends at the clock at the latest.
	var end time.Time
	var now time.Time
	err := relayer.QueryRow(b.ctx, `SELECT c.period_end, clock_timestamp()
		FROM outbox.take_checkpoint(clock_timestamp() + interval '1 day', interval '30 seconds', interval '0') c`).Scan(&end, &now)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		t.Fatalf("take_checkpoint as relayer: %v", err)
	}
	if err == nil && end.After(now) {
		t.Errorf("a relayer closed a checkpoint period ending at %v, after the clock (%v)", end, now)
	}
	// The relayer's own checkpointing still works.
	time.Sleep(2 * time.Millisecond)
	if _, err := b.st.TakeCheckpoint(b.ctx, relayer, time.Millisecond, 0); err != nil {
		t.Errorf("checkpoint as relayer: %v", err)
	}
	rep, err := b.st.Verify(b.ctx, b.as(t, migrations.RoleAuditor, "*"), store.VerifyOptions{})
	if err != nil || !rep.OK() {
		t.Fatalf("verify after the relayer's checkpoints: %+v, %v", rep, err)
	}
}

// TestOperatorsActWithinTheirTenantUnderRace: the operators' functions
// check the instruction's tenant, then act. Before migration 031 they did
// so in separate statements, each with a snapshot of its own: an
// instruction of another tenant that committed between the check (which
// did not see it, and took the missing tenant for the rows without one)
// and the act was acted on. The test holds the act back deterministically:
// a transaction that locks the archive (which every act writes) and
// inserts the other tenant's row commits only once the operator's call
// waits on that lock. A cancel, since migration 044, reads the row it
// acts on under a row lock before it writes anything, and answers a row it
// does not see (not pending) at once: it does not wait, and writes nothing
// once the row commits either.
func TestOperatorsActWithinTheirTenantUnderRace(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	producer := b.as(t, migrations.RoleProducer, "")
	relayer := b.as(t, migrations.RoleRelayer, "")
	operator := b.as(t, migrations.RoleOperator, "") // the rows without a tenant
	if _, err := b.enqueue(t, producer, "", "k-dead"); err != nil {
		t.Fatal(err)
	}
	dead := b.settle(t, relayer, store.Failed)[0].OutboxID
	live, err := b.enqueue(t, producer, "", "k-live")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, table, call string
		source            uuid.UUID
		waits             bool
	}{
		{"replay", "dead_letters", `SELECT outbox.replay_dead_letter($1, 'mallory', 'race')`, dead, true},
		{"acknowledge", "dead_letters", `SELECT outbox.acknowledge_dead_letter($1, 'mallory', 'race')`, dead, true},
		{"cancel", "pending", `SELECT outbox.cancel_pending($1, 'mallory', 'race')`, live.OutboxID, false},
	} {
		other, _ := uuid.NewV7()
		conn, err := operator.Acquire(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		var pid int
		if err := conn.QueryRow(b.ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			t.Fatal(err)
		}
		hold, err := b.admin.Begin(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := hold.Exec(b.ctx, `LOCK TABLE outbox.attempts IN ACCESS EXCLUSIVE MODE`); err != nil {
			t.Fatal(err)
		}
		// A copy of the row under another id (and, in pending, sequence id),
		// of tenant B: not yet visible to anyone.
		if _, err := hold.Exec(b.ctx, fmt.Sprintf(`INSERT INTO outbox.%[1]s
			SELECT (jsonb_populate_record(x, jsonb_build_object('outbox_id', $2::uuid, 'tenant_id', 'tenant-b',
			                                                    'sequence_id', x.sequence_id + 1000))).*
			FROM outbox.%[1]s x WHERE x.outbox_id = $1`, c.table), c.source, other); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		var n int64
		go func() { done <- conn.QueryRow(b.ctx, c.call, other).Scan(&n) }()
		if !c.waits {
			err := <-done
			if rerr := hold.Commit(b.ctx); rerr != nil {
				t.Fatal(rerr)
			}
			conn.Release()
			if err != nil || n != 0 {
				t.Errorf("%s: an operator of the rows without a tenant, on tenant B's instruction not yet committed: %d, %v (want 0)", c.name, n, err)
			}
			var archived int
			if err := b.admin.QueryRow(b.ctx, `SELECT count(*) FROM outbox.attempts WHERE outbox_id = $1`, other).Scan(&archived); err != nil || archived != 0 {
				t.Errorf("%s: %d rows archived for tenant B's instruction by the operator (%v), want 0", c.name, archived, err)
			}
			continue
		}
		// The call waits on the archive's lock once it has checked the tenant.
		for waiting := false; !waiting; {
			select {
			case err := <-done:
				t.Fatalf("%s: returned %d, %v before the other tenant's row committed", c.name, n, err)
			case <-time.After(10 * time.Millisecond):
			}
			if err := b.admin.QueryRow(b.ctx, `SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&waiting); err != nil {
				t.Fatal(err)
			}
		}
		if err := hold.Commit(b.ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		conn.Release()
		if n != 0 {
			t.Errorf("%s: an operator of the rows without a tenant acted on tenant B's instruction (%d)", c.name, n)
		}
		var archived int
		if err := b.admin.QueryRow(b.ctx, `SELECT count(*) FROM outbox.attempts WHERE outbox_id = $1`, other).Scan(&archived); err != nil || archived != 0 {
			t.Errorf("%s: %d rows archived for tenant B's instruction by the operator (%v), want 0", c.name, archived, err)
		}
	}
}

// st0 is a store for schema.
func st0(t *testing.T, schema string) *store.Store {
	t.Helper()
	st, err := store.New(schema)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestPartitionUpkeepStaysNearNow: relayers run partition upkeep as the
// owner; they may have it keep a few months ahead, not create a table for
// every month of the years to come.
func TestPartitionUpkeepStaysNearNow(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	relayer := b.as(t, migrations.RoleRelayer, "")
	_, err := relayer.Exec(b.ctx, `SELECT outbox.ensure_attempt_partitions(60)`)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "22023" {
		t.Errorf("partition upkeep 60 months ahead as relayer: %v, want a 22023 refusal", err)
	}
	var far int
	if err := b.admin.QueryRow(b.ctx, `SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = 'outbox.attempts'::regclass
		  AND c.relname ~ '^attempts_[0-9]' AND c.relname > 'attempts_' || to_char(now() + interval '25 months', 'YYYY_MM')`).Scan(&far); err != nil || far != 0 {
		t.Errorf("%d partitions more than 24 months ahead (%v), want none", far, err)
	}
	if err := b.st.EnsurePartitions(b.ctx, relayer, 24); err != nil {
		t.Errorf("partition upkeep 24 months ahead as relayer: %v", err)
	}
}

// TestRolesHoldExactlyTheirPrivileges lists every privilege the outbox
// roles hold on the schema's tables, columns and the functions that run as
// the owner, and compares it with the roles' jobs (docs/audit.md): a grant
// broader than a job fails here before any test has to think of abusing
// it. Functions that run as their caller grant nothing by being callable.
func TestRolesHoldExactlyTheirPrivileges(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	rows, err := b.admin.Query(b.ctx, `
		SELECT r.rolname || ' ' || c.relname || ' ' || a.privilege_type
		FROM pg_class c, aclexplode(c.relacl) a JOIN pg_roles r ON r.oid = a.grantee
		WHERE c.relnamespace = 'outbox'::regnamespace AND r.rolname LIKE 'outbox\_%' AND a.grantee <> c.relowner
		UNION ALL
		SELECT r.rolname || ' ' || c.relname || '(' || string_agg(t.attname, ',' ORDER BY t.attname) || ') ' || a.privilege_type
		FROM pg_class c JOIN pg_attribute t ON t.attrelid = c.oid, aclexplode(t.attacl) a JOIN pg_roles r ON r.oid = a.grantee
		WHERE c.relnamespace = 'outbox'::regnamespace AND r.rolname LIKE 'outbox\_%' AND a.grantee <> c.relowner
		GROUP BY r.rolname, c.relname, a.privilege_type
		UNION ALL
		SELECT r.rolname || ' ' || p.proname || '() EXECUTE'
		FROM pg_proc p, pg_roles r
		WHERE p.pronamespace = 'outbox'::regnamespace AND p.prosecdef AND r.rolname LIKE 'outbox\_%' AND r.oid <> p.proowner
		  AND has_function_privilege(r.oid, p.oid, 'EXECUTE')
		ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	readable := []string{"archive", "attempts", "attempts_detached", "checkpoints", "dead_letters", "idempotency_keys", "inflight",
		"key_retirements", "pending", "rail_pause_events", "rail_pauses", "relayer_idle", "relayer_runs", "retired_keys", "schema_version", "sequences", "settings",
		"tenant_bindings"}
	for _, role := range []string{migrations.RoleAuditor, migrations.RoleOperator} {
		for _, table := range readable {
			want = append(want, role+" "+table+" SELECT")
		}
		want = append(want, role+" vacuum_horizon() EXECUTE")
	}
	// The tenant policies read the session's own bindings (migration 036).
	want = append(want, migrations.RoleProducer+" tenant_bindings SELECT")
	want = append(want,
		"outbox_operator acknowledge_dead_letter() EXECUTE", "outbox_operator cancel_pending() EXECUTE",
		"outbox_operator pause_rail() EXECUTE", "outbox_operator replay_dead_letter() EXECUTE", "outbox_operator resume_rail() EXECUTE",
		"outbox_operator resume_rail_shown() EXECUTE",

		// Pending rows and sequence ids only through enqueue_pending(_batch)
		// (migration 033).
		"outbox_producer enqueue_pending() EXECUTE", "outbox_producer enqueue_pending_batch() EXECUTE",
		"outbox_producer idempotency_keys(idempotency_key,instruction_id,outbox_id,participant_id,payload_hash,tenant_id) INSERT",
		"outbox_producer idempotency_keys SELECT",
		"outbox_producer retired_keys SELECT",
		"outbox_producer schema_version SELECT", "outbox_producer settings SELECT",

		"outbox_relayer archived_attempt() EXECUTE", "outbox_relayer archived_claim() EXECUTE",
		"outbox_relayer attempts INSERT", "outbox_relayer attempts SELECT", "outbox_relayer checkpoints SELECT",
		"outbox_relayer dead_letters INSERT", "outbox_relayer dead_letters SELECT", "outbox_relayer ensure_attempt_partitions() EXECUTE",
		"outbox_relayer inflight DELETE", "outbox_relayer inflight INSERT", "outbox_relayer inflight SELECT", "outbox_relayer inflight(lease_until) UPDATE",
		"outbox_relayer pending DELETE", "outbox_relayer pending INSERT", "outbox_relayer pending SELECT", "outbox_relayer pending(next_attempt_at,retry_at) UPDATE",
		"outbox_relayer rail_pauses SELECT", "outbox_relayer relayer_idle DELETE", "outbox_relayer relayer_idle INSERT",
		"outbox_relayer relayer_idle SELECT", "outbox_relayer relayer_idle UPDATE",
		"outbox_relayer relayer_runs DELETE", "outbox_relayer relayer_runs INSERT", "outbox_relayer relayer_runs SELECT", "outbox_relayer relayer_runs UPDATE",
		"outbox_relayer schema_version SELECT",
		"outbox_relayer sequences SELECT", "outbox_relayer sequences(queued) UPDATE", "outbox_relayer settings SELECT",
		"outbox_relayer settle_poison_dead_letters() EXECUTE", "outbox_relayer take_checkpoint() EXECUTE", "outbox_relayer vacuum_horizon() EXECUTE",
	)
	slices.Sort(want)
	for _, g := range got {
		if !slices.Contains(want, g) {
			t.Errorf("granted beyond the role's job: %s", g)
		}
	}
	for _, w := range want {
		if !slices.Contains(got, w) {
			t.Errorf("not granted, and the role's job needs it: %s", w)
		}
	}
}
