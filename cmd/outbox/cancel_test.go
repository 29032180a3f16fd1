package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"

	"github.com/ledgerline/outbox/internal/store"
)

// TestCancelCommand: cancel prints a line per outbox id and needs a
// reason; an id that is not pending says "done": false and makes the exit
// status 1 without undoing the others; the participant's next instruction
// becomes due, and audit verify counts the cancelled one.
func TestCancelCommand(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	r := b.cli(t, inputJSON("p1", "k1", "100")+"\n"+inputJSON("p1", "k2", "200"), "enqueue")
	requireExit(t, r, 0)
	lines := stdoutLines(t, r.stdout)
	first, second := decodeEnqueueLine(t, lines[0]).outboxID, decodeEnqueueLine(t, lines[1]).outboxID
	unknown := uuidV7(t).String()

	requireExit(t, b.cli(t, "", "cancel", first), 2) // no reason
	requireExit(t, b.cli(t, "", "cancel", "--reason", "x", "not-an-id"), 2)
	r = b.cli(t, "", "cancel", "--operator", "alice", "--reason", "customer recalled it", first, unknown)
	requireExit(t, r, 1)
	if lines := stdoutLines(t, r.stdout); len(lines) != 2 || !strings.Contains(lines[0], `"done":true`) ||
		!strings.Contains(lines[1], `"done":false`) || !strings.Contains(lines[1], "not pending") {
		t.Fatalf("cancel of a pending and an unknown id:\n%s", r)
	}
	var due bool
	if err := b.pool.QueryRow(b.ctx, `SELECT next_attempt_at <= now() FROM outbox.pending WHERE outbox_id = $1`, second).Scan(&due); err != nil || !due {
		t.Fatalf("the participant's next instruction is due: %v, %v", due, err)
	}
	r = b.cli(t, "", "audit", "verify")
	requireExit(t, r, 0)
	if !strings.Contains(r.stdout, `"cancelled":1`) {
		t.Fatalf("audit verify:\n%s", r)
	}
	r = b.cli(t, "", "audit", "trail", first)
	if requireExit(t, r, 0); !strings.Contains(r.stdout, `"state":"CANCELLED"`) || !strings.Contains(r.stdout, "cancelled by alice (database role "+b.sessionRole(t)+"): customer recalled it") {
		t.Fatalf("trail:\n%s", r)
	}
}

// sessionRole is the database role the CLI's connections log in as: the
// operators' functions archive it beside --operator (migration 035).
func (b *cliBundle) sessionRole(t *testing.T) string {
	t.Helper()
	var role string
	if err := b.pool.QueryRow(b.ctx, `SELECT format('%I', session_user)`).Scan(&role); err != nil {
		t.Fatal(err)
	}
	return role
}

// TestCancelRefusedWhileTheRailMayStillAct: outbox cancel of an
// instruction whose rail call a relayer's stop cut off is refused until
// its claim's lease ends: its line says "done": false, error
// RAIL_MAY_STILL_ACT and retry_after (the time the relayer recorded), the
// exit status is 3, the other ids are still cancelled, and the refused
// instruction stays pending with nothing archived.
func TestCancelRefusedWhileTheRailMayStillAct(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	r := b.cli(t, inputJSON("p1", "k1", "100")+"\n"+inputJSON("p2", "k2", "200"), "enqueue")
	requireExit(t, r, 0)
	lines := stdoutLines(t, r.stdout)
	cut, other := decodeEnqueueLine(t, lines[0]).outboxID, decodeEnqueueLine(t, lines[1]).outboxID

	st, err := store.New("")
	if err != nil {
		t.Fatal(err)
	}
	claimed, err := st.Claim(b.ctx, b.pool, store.ClaimParams{RelayerID: "r1", Limit: 1, Leases: map[string]time.Duration{"sandbox": time.Hour}})
	if err != nil || len(claimed) != 1 || claimed[0].OutboxID.String() != cut {
		t.Fatalf("claim: %v, %v (want %s)", claimed, err, cut)
	}
	c := claimed[0]
	id, _ := uuid.NewV7()
	if _, _, err := st.Record(b.ctx, b.pool, []store.Outcome{{Identity: c.Identity, AttemptID: id, ClaimAttemptID: c.AttemptID,
		AttemptNo: c.AttemptNo, RelayerID: "r1", ClaimedAt: c.ClaimedAt, State: store.Retryable, ErrorCode: "CUT_OFF_AT_STOP",
		OutcomeUnknown: true, RetryDelay: time.Hour}}, store.HandoffParams{}); err != nil {
		t.Fatal(err)
	}
	var until time.Time
	if err := b.pool.QueryRow(b.ctx, `SELECT next_attempt_at FROM outbox.attempts WHERE attempt_id = $1`, id).Scan(&until); err != nil {
		t.Fatal(err)
	}

	r = b.cli(t, "", "cancel", "--operator", "alice", "--reason", "customer recalled it", cut, other)
	requireExit(t, r, 3)
	lines = stdoutLines(t, r.stdout)
	var refused struct {
		OutboxID   string `json:"outbox_id"`
		Done       bool   `json:"done"`
		Error      string `json:"error"`
		RetryAfter string `json:"retry_after"`
	}
	if len(lines) != 2 || json.Unmarshal([]byte(lines[0]), &refused) != nil || refused.OutboxID != cut || refused.Done ||
		refused.Error != "RAIL_MAY_STILL_ACT" || refused.RetryAfter != until.UTC().Format(time.RFC3339Nano) ||
		!strings.Contains(lines[1], `"done":true`) {
		t.Fatalf("cancel of a cut-off and a pending instruction (want the first refused until %s):\n%s", until.UTC().Format(time.RFC3339Nano), r)
	}
	var pending, cancelled int
	if err := b.pool.QueryRow(b.ctx, `SELECT (SELECT count(*) FROM outbox.pending WHERE outbox_id = $1),
		(SELECT count(*) FROM outbox.attempts WHERE outbox_id = $1 AND state = 'CANCELLED')`, cut).Scan(&pending, &cancelled); err != nil ||
		pending != 1 || cancelled != 0 {
		t.Fatalf("after the refusal: %d pending, %d cancelled (%v), want 1 and 0", pending, cancelled, err)
	}
}

// TestCancelOfAnInstructionInFlight: outbox cancel of an instruction a
// relayer has claimed refuses it (its rail call may be under way): its
// line says "done": false and error IN_FLIGHT, the exit status is 1 as for
// one not pending, the other ids are still cancelled, and the claimed
// instruction stays in flight with nothing archived. It once stopped at
// that id with the database's answer, the later ids left undone.
func TestCancelOfAnInstructionInFlight(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	r := b.cli(t, inputJSON("p1", "k1", "100")+"\n"+inputJSON("p2", "k2", "200"), "enqueue")
	requireExit(t, r, 0)
	lines := stdoutLines(t, r.stdout)
	held, other := decodeEnqueueLine(t, lines[0]).outboxID, decodeEnqueueLine(t, lines[1]).outboxID
	st, err := store.New("")
	if err != nil {
		t.Fatal(err)
	}
	claimed, err := st.Claim(b.ctx, b.pool, store.ClaimParams{RelayerID: "r1", Limit: 1, Leases: map[string]time.Duration{"sandbox": time.Hour}})
	if err != nil || len(claimed) != 1 || claimed[0].OutboxID.String() != held {
		t.Fatalf("claim: %v, %v (want %s)", claimed, err, held)
	}

	r = b.cli(t, "", "cancel", "--operator", "alice", "--reason", "customer recalled it", held, other)
	requireExit(t, r, 1)
	lines = stdoutLines(t, r.stdout)
	var refused struct {
		OutboxID string `json:"outbox_id"`
		Done     bool   `json:"done"`
		Error    string `json:"error"`
		Note     string `json:"note"`
	}
	if len(lines) != 2 || json.Unmarshal([]byte(lines[0]), &refused) != nil || refused.OutboxID != held || refused.Done ||
		refused.Error != "IN_FLIGHT" || !strings.Contains(refused.Note, "in flight") || !strings.Contains(lines[1], `"done":true`) {
		t.Fatalf("cancel of an instruction in flight and a pending one:\n%s", r)
	}
	var inflight, cancelled int
	if err := b.pool.QueryRow(b.ctx, `SELECT (SELECT count(*) FROM outbox.inflight WHERE outbox_id = $1),
		(SELECT count(*) FROM outbox.attempts WHERE outbox_id = $1 AND state = 'CANCELLED')`, held).Scan(&inflight, &cancelled); err != nil ||
		inflight != 1 || cancelled != 0 {
		t.Fatalf("after the refusal: %d in flight, %d cancelled (%v), want 1 and 0", inflight, cancelled, err)
	}
	requireExit(t, b.cli(t, "", "audit", "verify"), 0)
}
