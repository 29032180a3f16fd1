package main

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"

	"github.com/ledgerline/outbox/internal/store"
)

// TestDLQListPages: `dlq list` prints dead letters oldest failure first,
// a page at a time: --limit 0 prints every one (here 2.5 pages, with a run
// of equal failure times across a page boundary), a limit prints that
// prefix, and a negative limit is a usage error.
func TestDLQListPages(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	const n = 2500
	// The first 1,500 failed at the same instant (the outbox id orders
	// them), the rest a millisecond apart.
	if _, err := b.pool.Exec(b.ctx, `
INSERT INTO outbox.dead_letters (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
                                 payload, attempt_count, error_code, attempt_id, created_at, failed_at)
SELECT gen_random_uuid(), 'i-' || g, 'p-' || g, 1, 'k-' || g, 'sandbox', '{}', 5, 'MAX_ATTEMPTS_EXCEEDED',
       gen_random_uuid(), now(), timestamptz '2026-11-24 10:00:00+00' + greatest(g - 1500, 0) * interval '1 millisecond'
FROM generate_series(1, $1) AS g`, n); err != nil {
		t.Fatal(err)
	}
	var want []string
	rows, err := b.pool.Query(b.ctx, `SELECT outbox_id::text FROM outbox.dead_letters ORDER BY failed_at, outbox_id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		want = append(want, id)
	}
	if err := rows.Err(); err != nil || len(want) != n {
		t.Fatalf("read %d dead letters back: %v", len(want), err)
	}
	list := func(limit string) []string {
		t.Helper()
		args := []string{"list"}
		if limit != "" {
			args = append([]string{"--limit", limit}, args...)
		}
		r := b.cli(t, "", "dlq", args...)
		requireExit(t, r, 0)
		var ids []string
		for _, line := range stdoutLines(t, r.stdout) {
			var d store.DeadLetter
			if err := json.Unmarshal([]byte(line), &d); err != nil {
				t.Fatalf("%q: %v", line, err)
			}
			ids = append(ids, d.OutboxID.String())
		}
		return ids
	}
	for _, c := range []struct {
		limit string
		n     int
	}{{"0", n}, {"", 100}, {"1200", 1200}, {"1000", 1000}, {"3000", n}} {
		if got := list(c.limit); !slices.Equal(got, want[:c.n]) {
			t.Errorf("dlq list --limit %q: %d dead letters, want the first %d in failure order", c.limit, len(got), c.n)
		}
	}
	requireExit(t, b.cli(t, "", "dlq", "--limit", "-1", "list"), 2)
}

// TestDLQReplayAndAck: replay and ack print a line per outbox id and need a
// reason; an id that is not an open dead letter (already replayed,
// unknown) says "done": false, with a note that it is not an open dead
// letter and where to read why, and makes the exit status 1, without
// undoing the others.
func TestDLQReplayAndAck(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	claimed := b.settle(t, store.Failed, "k1", "k2")
	first, second := claimed[0].OutboxID.String(), claimed[1].OutboxID.String()
	unknown := uuidV7(t).String()

	requireExit(t, b.cli(t, "", "dlq", "replay", first), 2) // no reason
	r := b.cli(t, "", "dlq", "--operator", "alice", "--reason", "rail fixed", "replay", first, unknown)
	requireExit(t, r, 1)
	lines := stdoutLines(t, r.stdout)
	if len(lines) != 2 || !strings.Contains(lines[0], `"done":true`) || !strings.Contains(lines[0], first) ||
		!strings.Contains(lines[1], `"done":false`) || !strings.Contains(lines[1], unknown) ||
		!strings.Contains(lines[1], "not an open dead letter") {
		t.Fatalf("replay of a dead letter and an unknown id:\n%s", r)
	}
	r = b.cli(t, "", "dlq", "--operator", "bob", "--reason", "refunded by hand", "ack", first, second)
	requireExit(t, r, 1) // first is pending again, not a dead letter
	if lines := stdoutLines(t, r.stdout); len(lines) != 2 || !strings.Contains(lines[0], `"done":false`) ||
		!strings.Contains(lines[1], `"done":true`) {
		t.Fatalf("ack of a replayed and an open dead letter:\n%s", r)
	}
	var replayed, acknowledged int
	if err := b.pool.QueryRow(b.ctx, `
SELECT count(*) FILTER (WHERE state = 'REPLAYED' AND relayer_id = 'alice'),
       count(*) FILTER (WHERE state = 'ACKNOWLEDGED' AND relayer_id = 'bob')
FROM outbox.attempts`).Scan(&replayed, &acknowledged); err != nil || replayed != 1 || acknowledged != 1 {
		t.Fatalf("archive: %d replayed by alice, %d acknowledged by bob (%v), want 1 and 1", replayed, acknowledged, err)
	}
	if ids := stdoutLines(t, b.cli(t, "", "dlq", "list").stdout); len(ids) != 0 {
		t.Fatalf("open dead letters left: %v", ids)
	}
}

// TestDLQReplayActsOnTheDeadLetterItRead: `dlq replay` reads each dead
// letter (its line says whether the rail may have acted) and then replays
// it; between the two another operator replayed it and it failed again,
// this time with its outcome unknown. The replay acts only on the failure
// it read: its line says "done": false, error DEAD_LETTER_CHANGED, the exit
// status is 1, and the new failure stays a dead letter, replayed once (by
// the other operator). It once replayed the new failure, under a line
// that said the rail had not acted: a dead letter sent twice. The replay
// is held between its read and its act by the participant's lock, which
// a transaction takes first and in which the other operator's replay,
// its claim and the new failure are then written.
func TestDLQReplayActsOnTheDeadLetterItRead(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	r := b.cli(t, inputJSON("p1", "k1", "100"), "enqueue")
	requireExit(t, r, 0)
	id := decodeEnqueueLine(t, stdoutLines(t, r.stdout)[0]).outboxID
	st, err := store.New("")
	if err != nil {
		t.Fatal(err)
	}
	fail := func(db store.Batcher, errorCode string, unknown bool) {
		t.Helper()
		claimed, err := st.Claim(b.ctx, db, store.ClaimParams{RelayerID: "r1", Limit: 1, Leases: map[string]time.Duration{"sandbox": time.Hour}})
		if err != nil || len(claimed) != 1 || claimed[0].OutboxID.String() != id {
			t.Fatalf("claim: %v, %v (want %s)", claimed, err, id)
		}
		c := claimed[0]
		attempt, _ := uuid.NewV7()
		if _, _, err := st.Record(b.ctx, db, []store.Outcome{{Identity: c.Identity, AttemptID: attempt, ClaimAttemptID: c.AttemptID,
			AttemptNo: c.AttemptNo, RelayerID: "r1", ClaimedAt: c.ClaimedAt, State: store.Failed, ErrorCode: errorCode,
			OutcomeUnknown: unknown, CountAttempt: true}}, store.HandoffParams{}); err != nil {
			t.Fatal(err)
		}
	}
	fail(b.pool, "RAIL_REJECTED", false)

	hold, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = hold.Rollback(b.ctx) }()
	var holder int32
	if err := hold.QueryRow(b.ctx, `SELECT pg_backend_pid() FROM outbox.sequences WHERE participant_id = 'p1' FOR UPDATE`).Scan(&holder); err != nil {
		t.Fatal(err)
	}
	done := make(chan cliResult, 1)
	go func() { done <- b.cli(t, "", "dlq", "replay", "--operator", "bob", "--reason", "rail back", id) }()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		var waiting bool
		if err := b.pool.QueryRow(b.ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE $1::int = ANY (pg_blocking_pids(pid)))`, holder).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		select {
		case r := <-done:
			t.Fatalf("dlq replay finished before it waited for the participant's lock:\n%s", r)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting for dlq replay to wait for the participant's lock")
		}
	}
	if ok, err := st.Replay(b.ctx, hold, uuid.FromStringOrNil(id), "alice", "rail back"); err != nil || !ok {
		t.Fatalf("alice's replay: %v, %v", ok, err)
	}
	fail(hold, "RAIL_TIMEOUT", true)
	if err := hold.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	r = <-done
	requireExit(t, r, 1)
	var line struct {
		Done           bool   `json:"done"`
		Error          string `json:"error"`
		OutcomeUnknown bool   `json:"outcome_unknown"`
	}
	if lines := stdoutLines(t, r.stdout); len(lines) != 1 || json.Unmarshal([]byte(lines[0]), &line) != nil || line.Done || line.Error != "DEAD_LETTER_CHANGED" {
		t.Fatalf("dlq replay of a dead letter that changed since it was read:\n%s", r)
	}
	var dead, replays int
	if err := b.pool.QueryRow(b.ctx, `SELECT (SELECT count(*) FROM outbox.dead_letters WHERE outbox_id = $1 AND outcome_unknown),
		(SELECT count(*) FROM outbox.attempts WHERE outbox_id = $1 AND state = 'REPLAYED')`, id).Scan(&dead, &replays); err != nil || dead != 1 || replays != 1 {
		t.Fatalf("after the replays: %d dead letters marked outcome unknown, %d REPLAYED rows (%v), want 1 and 1", dead, replays, err)
	}
	requireExit(t, b.cli(t, "", "audit", "verify"), 0)
}

// TestDLQReplayOfAnInstructionInFlight: `dlq replay` and `dlq ack` of an
// instruction a relayer has claimed say that it is in flight (error
// IN_FLIGHT, exit 1), as `outbox cancel` does, and do nothing. They used
// to print `"done": false` alone, as for an id unknown: an operator told
// so could think the instruction lost and send the payment another way
// while its rail call was under way. It becomes a dead letter to replay
// only if its outcome is a failure.
func TestDLQReplayOfAnInstructionInFlight(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	id := b.enqueued(t, "p1", "k1")
	st, err := store.New("")
	if err != nil {
		t.Fatal(err)
	}
	if claimed, err := st.Claim(b.ctx, b.pool, store.ClaimParams{RelayerID: "r1", Limit: 1, Leases: map[string]time.Duration{"sandbox": time.Hour}}); err != nil || len(claimed) != 1 {
		t.Fatalf("claim: %v, %v", claimed, err)
	}
	for _, action := range []string{"replay", "ack"} {
		r := b.cli(t, "", "dlq", "--operator", "alice", "--reason", "rail fixed", action, id)
		requireExit(t, r, 1)
		var l struct {
			OutboxID string `json:"outbox_id"`
			Done     bool   `json:"done"`
			Error    string `json:"error"`
			Note     string `json:"note"`
		}
		if lines := stdoutLines(t, r.stdout); len(lines) != 1 || json.Unmarshal([]byte(lines[0]), &l) != nil ||
			l.OutboxID != id || l.Done || l.Error != "IN_FLIGHT" || !strings.Contains(l.Note, "in flight") {
			t.Fatalf("dlq %s of an instruction in flight:\n%s", action, r)
		}
	}
	var n int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox.attempts WHERE outbox_id = $1 AND state IN ('REPLAYED', 'ACKNOWLEDGED')`, id).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d operator rows (%v), want none", n, err)
	}
}
