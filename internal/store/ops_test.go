package store_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"

	"github.com/ledgerline/outbox/internal/store"
)

// TestDeadLetterReplayAndAcknowledge: a dead letter replayed by an operator
// goes back to pending with a fresh budget and is dispatched; another is
// acknowledged and leaves the DLQ count but not the table; the invariants
// hold throughout.
func TestDeadLetterReplayAndAcknowledge(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	first := b.enqueue(t, "p1", "k1")
	second := b.enqueue(t, "p2", "k2")
	for range 2 {
		c := b.claimOne(t, "r1", longLease)
		b.record(t, recordOutcome(t, c, "r1", store.Failed))
	}
	snap, err := b.st.Snapshot(b.ctx, b.pool)
	if err != nil || snap.DeadLetters != 2 || snap.Pending != 0 {
		t.Fatalf("snapshot %+v, %v: want 2 dead letters", snap, err)
	}
	dls, err := b.st.DeadLetters(b.ctx, b.pool, false, 10)
	if err != nil || len(dls) != 2 || dls[0].ErrorCode != "RAIL_REJECTED" || dls[0].AttemptCount != 1 {
		t.Fatalf("dead letters %+v, %v", dls, err)
	}

	// Who and why are required, and nothing happens without them.
	for _, who := range [][2]string{{"", "rail fixed"}, {"alice", " "}} {
		if _, err := b.st.Replay(b.ctx, b.pool, first, who[0], who[1]); !errors.Is(err, store.ErrOperatorAction) {
			t.Fatalf("replay by %q for %q: %v, want ErrOperatorAction", who[0], who[1], err)
		}
		if _, err := b.st.Acknowledge(b.ctx, b.pool, second, who[0], who[1]); !errors.Is(err, store.ErrOperatorAction) {
			t.Fatalf("acknowledge by %q for %q: %v, want ErrOperatorAction", who[0], who[1], err)
		}
	}
	// The database refuses them too, to a caller that skips this package.
	if _, err := b.pool.Exec(b.ctx, `SELECT outbox.replay_dead_letter($1, 'alice', '')`, first); err == nil ||
		!strings.Contains(err.Error(), "needs a reason") {
		t.Fatalf("replay without a reason in SQL: %v", err)
	}
	if ok, err := b.st.Replay(b.ctx, b.pool, first, "alice", "account reopened"); err != nil || !ok {
		t.Fatalf("replay: %v, %v", ok, err)
	}
	if ok, err := b.st.Replay(b.ctx, b.pool, first, "alice", "test"); err != nil || ok {
		t.Fatalf("second replay of the same dead letter: %v, %v; want nothing to replay", ok, err)
	}
	if ok, err := b.st.Acknowledge(b.ctx, b.pool, second, "bob", "refunded by hand, ticket 42"); err != nil || !ok {
		t.Fatalf("acknowledge: %v, %v", ok, err)
	}
	got, rows := b.trail(t, second)
	wantTrail(t, got, "DISPATCHING#1", "FAILED#1", "ACKNOWLEDGED#1")
	if ack := rows[2]; ack.RelayerID == nil || *ack.RelayerID != "bob" || ack.ErrorMessage == nil ||
		!strings.Contains(*ack.ErrorMessage, "refunded by hand, ticket 42") {
		t.Fatalf("acknowledgement archived as %+v, want bob and his reason", ack)
	}
	if ok, _ := b.st.Acknowledge(b.ctx, b.pool, second, "bob", "test"); ok {
		t.Fatal("acknowledged twice")
	}
	if open, _ := b.st.DeadLetters(b.ctx, b.pool, false, 10); len(open) != 0 {
		t.Fatalf("open dead letters %+v, want none", open)
	}
	if all, _ := b.st.DeadLetters(b.ctx, b.pool, true, 10); len(all) != 1 || all[0].AcknowledgedBy == nil || *all[0].AcknowledgedBy != "bob" {
		t.Fatalf("all dead letters %+v, want the acknowledged one", all)
	}
	b.verifyOK(t)

	// The replayed instruction is claimed as attempt 1 of a new budget and
	// dispatched.
	c := b.claimOne(t, "r2", longLease)
	if c.OutboxID != first || c.AttemptNo != 1 {
		t.Fatalf("claimed %s attempt %d, want the replayed %s as attempt 1", c.OutboxID, c.AttemptNo, first)
	}
	b.record(t, recordOutcome(t, c, "r2", store.Dispatched))
	got, rows = b.trail(t, first)
	wantTrail(t, got, "DISPATCHING#1", "FAILED#1", "REPLAYED#0", "DISPATCHING#1", "DISPATCHED#1")
	if replay := rows[2]; replay.RelayerID == nil || *replay.RelayerID != "alice" || replay.ErrorMessage == nil ||
		!strings.Contains(*replay.ErrorMessage, "account reopened") {
		t.Fatalf("replay archived as %+v, want alice and her reason", replay)
	}
	if r := b.verifyOK(t); r.Dispatched != 1 || r.DeadLetters != 1 {
		t.Fatalf("report %+v", r)
	}
	snap, err = b.st.Snapshot(b.ctx, b.pool)
	if err != nil || snap.DeadLetters != 0 || snap.Pending != 0 || snap.InFlight != 0 {
		t.Fatalf("snapshot %+v, %v", snap, err)
	}
}

// TestReplayReadsByKey: a replay finds the participant's waiting
// instructions by key, on a drained queue's statistics too (pending
// vacuumed empty, then a backlog), with the custom plans of a session's
// first calls and the generic plan that follows. It once walked the whole
// (participant, sequence) index of pending, joined to the replayed dead
// letter: 80 ms per replay at 218,000 pending instructions.
func TestReplayReadsByKey(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	statisticsOfEmpty(t, b.pool, "pending")
	const n = 8 // more than the calls after which a session's plan is generic
	heads, successors := make([]uuid.UUID, n), make([]uuid.UUID, n)
	for i := range n {
		heads[i] = b.enqueue(t, fmt.Sprintf("p%d", i), fmt.Sprintf("head-%d", i))
	}
	for i := range n {
		successors[i] = b.enqueue(t, fmt.Sprintf("p%d", i), fmt.Sprintf("next-%d", i))
		c := b.claimOne(t, "r1", longLease)
		b.record(t, recordOutcome(t, c, "r1", store.Failed))
	}
	// The rest of the backlog: due instructions and waiting ones.
	if _, err := b.pool.Exec(b.ctx, otherBacklogSQL); err != nil {
		t.Fatal(err)
	}
	wantStatisticsOfEmpty(t, b.pool, "pending")

	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(b.ctx)
	before := readsOf(t, tx, "outbox.pending")
	for _, id := range heads {
		if ok, err := b.st.Replay(b.ctx, tx, id, "alice", "rail fixed"); err != nil || !ok {
			t.Fatalf("replay %s: %v %v", id, ok, err)
		}
	}
	after := readsOf(t, tx, "outbox.pending")
	if r := after[0].seqTuples - before[0].seqTuples; r > 0 {
		t.Errorf("sequential scans read %d rows of pending", r)
	}
	// A replay reads its participant's rows by key three times (whether a
	// lower sequence waits, the lock on the lowest pending row that a
	// claim could hold: migration 026, and the demotion of the rest), and
	// each may step over the entries of rows deleted since the last vacuum
	// (the claimed heads), which stay while another transaction's
	// snapshot could see them: 28 entries for the 8 replays alone, 40
	// beside other tests. A scan of the backlog would return thousands.
	if r := after[0].indexEntries - before[0].indexEntries; r > 6*n {
		t.Errorf("pending's indexes returned %d entries for %d replays", r, n)
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	// Each replayed instruction is its participant's head again, and its
	// successor waits for it.
	for i := range n {
		var headDue, nextDue bool
		if err := b.pool.QueryRow(b.ctx, `
SELECT (SELECT next_attempt_at <= now() FROM outbox.pending WHERE outbox_id = $1),
       (SELECT next_attempt_at <= now() FROM outbox.pending WHERE outbox_id = $2)`, heads[i], successors[i]).Scan(&headDue, &nextDue); err != nil {
			t.Fatal(err)
		}
		if !headDue || nextDue {
			t.Errorf("participant p%d: replayed head due %v, successor due %v; want the head due and the successor waiting", i, headDue, nextDue)
		}
	}
}

// TestSnapshotStuckAndOldest: an in-flight row past its lease counts as
// stuck; the oldest due instruction's age is reported.
func TestSnapshotStuckAndOldest(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	b.enqueue(t, "p1", "k1")
	b.enqueue(t, "p2", "k2")
	c := b.claimOne(t, "dead", shortLease)
	deadline := time.Now().Add(20 * time.Second)
	for {
		snap, err := b.st.Snapshot(b.ctx, b.pool)
		if err != nil {
			t.Fatal(err)
		}
		if snap.Stuck == 1 {
			if snap.InFlight != 1 || snap.Pending != 1 || snap.Due != 1 || snap.OldestPendingAge <= 0 {
				t.Fatalf("snapshot %+v", snap)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("claim %s never counted as stuck: %+v", c.OutboxID, snap)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
