package migrations_test

import (
	"context"
	"errors"
	"fmt"
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

// operatorMessages returns the archived messages of the operators'
// actions (REPLAYED, ACKNOWLEDGED, CANCELLED) of the instruction with key,
// oldest first, read as db.
func operatorMessages(t *testing.T, ctx context.Context, db *pgxpool.Pool, schema, key string) []string {
	t.Helper()
	var msgs []string
	if err := db.QueryRow(ctx, fmt.Sprintf(`SELECT coalesce(array_agg(state || ': ' || error_message ORDER BY created_at), '{}')
		FROM %s.attempts WHERE idempotency_key = $1 AND state IN ('REPLAYED', 'ACKNOWLEDGED', 'CANCELLED')`, schema), key).Scan(&msgs); err != nil {
		t.Fatal(err)
	}
	return msgs
}

// pauseRoles returns the database role of each pause event, newest first
// ("" for none), read through the store as db.
func pauseRoles(t *testing.T, ctx context.Context, st *store.Store, db *pgxpool.Pool) []string {
	t.Helper()
	events, err := st.RailPauseEvents(ctx, db, 100)
	if err != nil {
		t.Fatal(err)
	}
	roles := make([]string, len(events))
	for i, e := range events {
		if e.DatabaseRole != nil {
			roles[i] = *e.DatabaseRole
		}
	}
	return roles
}

// TestOperatorActionsRecordTheDatabaseRole: every operator function
// (replay, acknowledge, cancel, pause, resume), run as the operator role
// through its SECURITY DEFINER functions and as the owner, archives the
// role that logged in (session_user) beside the operator's free-text
// name, and the archive verifies. A name that could pass for the role's
// text is refused, by the store and by the database.
func TestOperatorActionsRecordTheDatabaseRole(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	producer := b.as(t, migrations.RoleProducer, "")
	relayer := b.as(t, migrations.RoleRelayer, "")
	operator := b.as(t, migrations.RoleOperator, "*")
	var owner string
	if err := b.admin.QueryRow(b.ctx, `SELECT format('%I', session_user)`).Scan(&owner); err != nil {
		t.Fatal(err)
	}
	ids := map[string]uuid.UUID{}
	for _, k := range []string{"replayed", "acknowledged"} {
		r, err := b.enqueue(t, producer, "", k)
		if err != nil {
			t.Fatal(err)
		}
		ids[k] = r.OutboxID
	}
	b.settle(t, relayer, store.Failed)
	for _, k := range []string{"cancelled", "cancelled-by-owner"} {
		r, err := b.enqueue(t, producer, "", k)
		if err != nil {
			t.Fatal(err)
		}
		ids[k] = r.OutboxID
	}

	act := func(what string, ok bool, err error) {
		t.Helper()
		if err != nil || !ok {
			t.Fatalf("%s: %v, %v", what, ok, err)
		}
	}
	ok, err := b.st.Replay(b.ctx, operator, ids["replayed"], "alice", "account reopened")
	act("replay as operator", ok, err)
	ok, err = b.st.Acknowledge(b.ctx, operator, ids["acknowledged"], "alice", "refunded by hand")
	act("acknowledge as operator", ok, err)
	ok, err = b.st.Cancel(b.ctx, operator, ids["cancelled"], "alice", "customer recalled it")
	act("cancel as operator", ok, err)
	ok, err = b.st.PauseRail(b.ctx, operator, "sandbox", "alice", "maintenance")
	act("pause as operator", ok, err)
	ok, err = b.st.ResumeRail(b.ctx, operator, "sandbox", "alice", "maintenance over")
	act("resume as operator", ok, err)
	ok, err = b.st.Cancel(b.ctx, b.admin, ids["cancelled-by-owner"], "alice", "duplicate")
	act("cancel as the owner", ok, err)

	want := map[string]string{
		"replayed":           "REPLAYED: replayed by alice (database role outbox_operator; it had failed with RAIL_REJECTED): account reopened",
		"acknowledged":       "ACKNOWLEDGED: acknowledged by alice (database role outbox_operator): refunded by hand",
		"cancelled":          "CANCELLED: cancelled by alice (database role outbox_operator): customer recalled it",
		"cancelled-by-owner": "CANCELLED: cancelled by alice (database role " + owner + "): duplicate",
	}
	for k, w := range want {
		if got := operatorMessages(t, b.ctx, b.admin, "outbox", k); len(got) != 1 || got[0] != w {
			t.Errorf("%s: archived %q, want %q", k, got, w)
		}
	}
	if got := pauseRoles(t, b.ctx, b.st, operator); len(got) != 2 || got[0] != migrations.RoleOperator || got[1] != migrations.RoleOperator {
		t.Errorf("pause events' roles %q, want the operator role twice", got)
	}
	r, err := b.st.Verify(b.ctx, b.admin, store.VerifyOptions{Ordered: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range r.Violations {
		t.Errorf("invariant violated: %s", v)
	}

	// A name that could pass for the role is refused, typed here and by
	// the database for a caller that skips the store; nothing is done.
	spoof := "mallory (database role outbox_owner)"
	if _, err := b.st.PauseRail(b.ctx, operator, "sandbox", spoof, "x"); !errors.Is(err, store.ErrOperatorAction) {
		t.Errorf("pause by %q: %v, want ErrOperatorAction", spoof, err)
	}
	var pgErr *pgconn.PgError
	if _, err := operator.Exec(b.ctx, `SELECT outbox.pause_rail('sandbox', $1, 'x')`, spoof); !errors.As(err, &pgErr) || pgErr.Code != "22023" {
		t.Errorf("pause_rail by %q: %v, want 22023", spoof, err)
	}
	if paused, err := b.st.RailPauses(b.ctx, operator); err != nil || len(paused) != 0 {
		t.Errorf("after the refused pauses: %v paused, %v", paused, err)
	}
}

// TestOperatorRoleAcrossTheUpgrade: the operators' actions archived
// before migration 035 (no role) and after it (with the role) verify
// together, and the pause events before it read with no role.
func TestOperatorRoleAcrossTheUpgrade(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const schema = "oprole"
	if err := migrations.MigrateWith(b.ctx, b.pool, migrations.Options{Schema: schema, TargetVersion: 34}); err != nil {
		t.Fatal(err)
	}
	st, err := store.New(schema)
	if err != nil {
		t.Fatal(err)
	}
	producer, err := pending.NewProducer(pending.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	var role string
	if err := b.pool.QueryRow(b.ctx, `SELECT format('%I', session_user)`).Scan(&role); err != nil {
		t.Fatal(err)
	}
	enqueue := func(key string) uuid.UUID {
		t.Helper()
		r, err := producer.Enqueue(b.ctx, b.pool, pending.Instruction{
			InstructionID: "ins-" + key, ParticipantID: "p-" + key, IdempotencyKey: key,
			RailType: "sandbox", AmountMinor: 100, Currency: "USD", Destination: "acct-1",
		})
		if err != nil {
			t.Fatal(err)
		}
		return r.OutboxID
	}
	ids := map[string]uuid.UUID{}
	for _, k := range []string{"old-replay", "old-ack", "new-replay", "new-ack"} {
		ids[k] = enqueue(k)
	}
	claimed, err := st.Claim(b.ctx, b.pool, store.ClaimParams{RelayerID: "r1", Limit: 10, Leases: map[string]time.Duration{"sandbox": time.Hour}})
	if err != nil || len(claimed) != 4 {
		t.Fatalf("claim: %d, %v", len(claimed), err)
	}
	var outcomes []store.Outcome
	for _, c := range claimed {
		id, _ := uuid.NewV7()
		outcomes = append(outcomes, store.Outcome{Identity: c.Identity, AttemptID: id, ClaimAttemptID: c.AttemptID, AttemptNo: c.AttemptNo,
			RelayerID: "r1", ClaimedAt: c.ClaimedAt, State: store.Failed, ErrorCode: "RAIL_REJECTED", CountAttempt: true})
	}
	// This build's outcome statement names pending.retry_at (migration
	// 039), which a schema at 034 lacks: the column is lent for the write,
	// as the build of that time wrote these dead letters without it.
	lend := func(sql string) {
		t.Helper()
		if _, err := b.pool.Exec(b.ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	lend(`ALTER TABLE ` + schema + `.pending ADD COLUMN retry_at timestamptz`)
	if _, _, err := st.Record(b.ctx, b.pool, outcomes, store.HandoffParams{}); err != nil {
		t.Fatal(err)
	}
	lend(`ALTER TABLE ` + schema + `.pending DROP COLUMN retry_at`)
	acts := func(era string) {
		t.Helper()
		for _, step := range []struct {
			what string
			do   func() (bool, error)
		}{
			{"replay", func() (bool, error) { return st.Replay(b.ctx, b.pool, ids[era+"-replay"], "olga", era) }},
			{"acknowledge", func() (bool, error) { return st.Acknowledge(b.ctx, b.pool, ids[era+"-ack"], "olga", era) }},
			{"cancel", func() (bool, error) { return st.Cancel(b.ctx, b.pool, enqueue(era+"-cancel"), "olga", era) }},
			{"pause", func() (bool, error) { return st.PauseRail(b.ctx, b.pool, "sandbox", "olga", era) }},
			{"resume", func() (bool, error) { return st.ResumeRail(b.ctx, b.pool, "sandbox", "olga", era) }},
		} {
			if ok, err := step.do(); err != nil || !ok {
				t.Fatalf("%s %s: %v, %v", era, step.what, ok, err)
			}
		}
	}
	acts("old")
	if err := migrations.MigrateWith(b.ctx, b.pool, migrations.Options{Schema: schema, TargetVersion: 35}); err != nil {
		t.Fatal(err)
	}
	acts("new")

	for _, k := range []string{"old-replay", "old-ack", "old-cancel"} {
		if got := operatorMessages(t, b.ctx, b.pool, schema, k); len(got) != 1 || strings.Contains(got[0], "database role") {
			t.Errorf("%s: archived %q, want one message without a role", k, got)
		}
	}
	for _, k := range []string{"new-replay", "new-ack", "new-cancel"} {
		if got := operatorMessages(t, b.ctx, b.pool, schema, k); len(got) != 1 || !strings.Contains(got[0], "by olga (database role "+role) {
			t.Errorf("%s: archived %q, want one message naming olga and the role %s", k, got, role)
		}
	}
	if got := pauseRoles(t, b.ctx, st, b.pool); len(got) != 4 || got[0] != role || got[1] != role || got[2] != "" || got[3] != "" {
		t.Errorf("pause events' roles, newest first: %q, want %s twice then none twice", got, role)
	}
	r, err := st.Verify(b.ctx, b.pool, store.VerifyOptions{Ordered: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range r.Violations {
		t.Errorf("invariant violated: %s", v)
	}
	if r.Cancelled != 2 {
		t.Errorf("verify counted %d cancelled, want 2", r.Cancelled)
	}
}
