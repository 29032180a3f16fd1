package store_test

import (
	"strings"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/internal/store"
)

// replayedBehindInFlight enqueues three instructions of participant p1,
// fails the first (a dead letter), claims the second for relayer with
// lease, and replays the first while the second is in flight: the
// replayed instruction waits, since its participant has something in
// flight.
func (b *recordBundle) replayedBehindInFlight(t *testing.T, relayer string, lease time.Duration) (replayed, third uuid.UUID, held store.Claimed) {
	t.Helper()
	first := b.enqueue(t, "p1", "k1")
	second := b.enqueue(t, "p1", "k2")
	third = b.enqueue(t, "p1", "k3")
	c := b.claimOne(t, "r1", longLease)
	if c.OutboxID != first {
		t.Fatalf("claimed %s, want %s", c.OutboxID, first)
	}
	b.record(t, recordOutcome(t, c, "r1", store.Failed))
	held = b.claimOne(t, relayer, lease)
	if held.OutboxID != second {
		t.Fatalf("claimed %s, want %s", held.OutboxID, second)
	}
	b.replay(t, first)
	if b.due(t, first) {
		t.Fatal("replayed instruction is due while its participant has one in flight")
	}
	b.verifyOK(t)
	return first, third, held
}

func (b *recordBundle) replay(t *testing.T, id uuid.UUID) {
	t.Helper()
	if ok, err := b.st.Replay(b.ctx, b.pool, id, "alice", "rail fixed"); err != nil || !ok {
		t.Fatalf("replay %s: %v, %v", id, ok, err)
	}
}

// wantHeadThenRest claims the participant's instructions one at a time,
// dispatching each, and checks they come in the order given.
func (b *recordBundle) wantHeadThenRest(t *testing.T, order ...uuid.UUID) {
	t.Helper()
	for _, want := range order {
		c := b.claimOne(t, "r2", longLease)
		if c.OutboxID != want {
			t.Fatalf("claimed %s, want %s", c.OutboxID, want)
		}
		b.record(t, recordOutcome(t, c, "r2", store.Dispatched))
		b.verifyOK(t)
	}
}

// TestReplayBehindARetryBecomesTheHead guards a replay made while a later
// instruction of the participant is in flight, whose attempt then ends
// RETRYABLE (no terminal outcome, so no hand-off): the retry goes back
// waiting and the replayed instruction, now the lowest pending sequence,
// is due at once. It once stayed waiting forever, with the retry due
// behind it and never claimable: the participant stranded.
func TestReplayBehindARetryBecomesTheHead(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	replayed, third, held := b.replayedBehindInFlight(t, "r1", longLease)
	retry := recordOutcome(t, held, "r1", store.Retryable)
	retry.RetryDelay = 0
	b.record(t, retry)
	if !b.due(t, replayed) || b.due(t, held.OutboxID) || b.due(t, third) {
		t.Fatal("after the retry: want the replayed instruction due, the retried one and the third waiting")
	}
	b.verifyOK(t)
	b.wantHeadThenRest(t, replayed, held.OutboxID, third)
}

// TestReplayBehindAReapedClaimBecomesTheHead guards the same with the
// in-flight instruction's relayer dead: the reaper's requeued copy waits
// and the replayed instruction is due at once.
func TestReplayBehindAReapedClaimBecomesTheHead(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	replayed, third, held := b.replayedBehindInFlight(t, "dies", shortLease)
	b.reap(t, held)
	if !b.due(t, replayed) || b.due(t, held.OutboxID) || b.due(t, third) {
		t.Fatal("after the reap: want the replayed instruction due, the requeued one and the third waiting")
	}
	b.verifyOK(t)
	b.wantHeadThenRest(t, replayed, held.OutboxID, third)
}

// TestReplayWaitsForARacingClaim guards the replay's decision that the
// replayed instruction is its participant's head against a claim of the
// current head that has not committed yet: the replay waits for it and
// then sees it in flight, so the replayed instruction waits too. It once
// decided from a snapshot without the claim, made the replayed
// instruction due beside the one in flight, and the database then
// refused every claim that reached it (ErrOrderingConflict), whatever
// else the claim would have taken.
func TestReplayWaitsForARacingClaim(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	first := b.enqueue(t, "p1", "k1")
	second := b.enqueue(t, "p1", "k2")
	c1 := b.claimOne(t, "r1", longLease)
	b.record(t, recordOutcome(t, c1, "r1", store.Failed)) // the second is due

	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(b.ctx) }()
	claimed, err := b.st.Claim(b.ctx, tx, store.ClaimParams{RelayerID: "r1", Limit: 1, Leases: map[string]time.Duration{"sandbox": longLease}})
	if err != nil || len(claimed) != 1 || claimed[0].OutboxID != second {
		t.Fatalf("claim in a transaction: %v, %v", outboxIDs(claimed), err)
	}
	if err := b.waitingOn(t, tx, func(conn *pgxpool.Conn) error {
		_, err := b.st.Replay(b.ctx, conn, first, "alice", "rail fixed")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if b.due(t, first) {
		t.Fatal("the replayed instruction is due beside the one in flight")
	}
	b.verifyOK(t)
	// Another participant's claim is not refused.
	other := b.enqueue(t, "p2", "other")
	if got := b.claimAll(t); !sameIDs(got, other) {
		t.Fatalf("claimed %v, want %s alone", outboxIDs(got), other)
	}
	b.record(t, recordOutcome(t, claimed[0], "r1", store.Dispatched))
	b.wantHeadThenRest(t, first)
}

// waitingOn runs op on a connection of its own while tx holds locks op
// needs: it waits until op waits for a lock (or has finished without
// waiting), commits tx, and returns op's error.
func (b *recordBundle) waitingOn(t *testing.T, tx pgx.Tx, op func(*pgxpool.Conn) error) error {
	t.Helper()
	conn := b.conn(t)
	done := make(chan error, 1)
	go func() { done <- op(conn) }()
	b.waitForLock(t, conn.Conn().PgConn().PID(), done)
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	return <-done
}

// waitForLock waits (bounded) until the backend pid waits for a lock, or
// done has an answer (which it puts back): the statement it runs did not
// need to wait.
func (b *recordBundle) waitForLock(t *testing.T, pid uint32, done chan error) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		var waiting bool
		if err := b.pool.QueryRow(b.ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock')`,
			int64(pid)).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			return
		}
		select {
		case err := <-done:
			done <- err
			return
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting for the statement to wait for a lock")
		}
	}
}

// TestReplayWaitsForTheFailureOfItsInstruction guards a replay of an
// instruction whose failure is being recorded: the outcome write holds the
// participant's lock, and the replay, which finds the participant through
// the instruction's key, waits for it and then replays the dead letter
// under that lock (the head decided beside the successor the failure made
// due). Before migration 044 the replay read the participant from the dead
// letters only: the instruction, still in flight, gave none, no lock was
// taken and it answered "no dead letter" at once; and had the write
// committed between its first statement and the others, it would have
// replayed and re-marked heads without the lock.
func TestReplayWaitsForTheFailureOfItsInstruction(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	first, second := b.enqueue(t, "p1", "k1"), b.enqueue(t, "p1", "k2")
	c := b.claimOne(t, "r1", longLease)
	if c.OutboxID != first {
		t.Fatalf("claimed %s, want %s", c.OutboxID, first)
	}
	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(b.ctx) }()
	if _, _, err := b.st.Record(b.ctx, tx, []store.Outcome{recordOutcome(t, c, "r1", store.Failed)}, store.HandoffParams{}); err != nil {
		t.Fatal(err)
	}
	conn := b.conn(t)
	done := make(chan error, 1)
	var replayed bool
	go func() {
		var err error
		replayed, err = b.st.Replay(b.ctx, conn, first, "alice", "rail fixed")
		done <- err
	}()
	b.waitBlockedBy(t, conn.Conn().PgConn().PID(), b.backendOf(t, tx), done)
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil || !replayed {
		t.Fatalf("replay after the failure committed: %v, %v (want replayed)", replayed, err)
	}
	got, rows := b.trail(t, first)
	wantTrail(t, got, "DISPATCHING#1", "FAILED#1", "REPLAYED#0")
	if last := rows[len(rows)-1]; last.RelayerID == nil || *last.RelayerID != "alice" || last.ErrorMessage == nil ||
		!strings.HasPrefix(*last.ErrorMessage, "replayed by alice (database role "+b.sessionRole(t)+"; it had failed with ") ||
		!strings.HasSuffix(*last.ErrorMessage, "): rail fixed") {
		t.Fatalf("the REPLAYED row: by %v, %v", last.RelayerID, last.ErrorMessage)
	}
	if !b.due(t, first) || b.due(t, second) {
		t.Fatal("after the replay: want the replayed instruction due, the second waiting behind it")
	}
	b.verifyOK(t)
	b.wantHeadThenRest(t, first, second)
}

// TestReplayByTwoOperatorsAtOnceSendsOnce: two operators replay the same
// dead letter at once. The second waits for the first's participant lock
// and then finds no dead letter (false): the instruction is pending once,
// claimed once, archived with one REPLAYED row, the first operator's.
func TestReplayByTwoOperatorsAtOnceSendsOnce(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	id := b.enqueue(t, "p1", "k1")
	b.record(t, recordOutcome(t, b.claimOne(t, "r1", longLease), "r1", store.Failed))
	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(b.ctx) }()
	if ok, err := b.st.Replay(b.ctx, tx, id, "alice", "rail fixed"); err != nil || !ok {
		t.Fatalf("alice's replay: %v, %v", ok, err)
	}
	conn := b.conn(t)
	done := make(chan error, 1)
	var again bool
	go func() {
		var err error
		again, err = b.st.Replay(b.ctx, conn, id, "bob", "rail fixed too")
		done <- err
	}()
	b.waitBlockedBy(t, conn.Conn().PgConn().PID(), b.backendOf(t, tx), done)
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil || again {
		t.Fatalf("bob's replay after alice's: %v, %v (want false: no dead letter)", again, err)
	}
	claimed := b.claimAll(t)
	if !sameIDs(claimed, id) {
		t.Fatalf("claimed %v, want %s once", outboxIDs(claimed), id)
	}
	b.record(t, recordOutcome(t, claimed[0], "r2", store.Dispatched))
	got, rows := b.trail(t, id)
	wantTrail(t, got, "DISPATCHING#1", "FAILED#1", "REPLAYED#0", "DISPATCHING#1", "DISPATCHED#1")
	if r := rows[2]; r.RelayerID == nil || *r.RelayerID != "alice" {
		t.Fatalf("the REPLAYED row is by %v, want alice", r.RelayerID)
	}
	if r := b.verifyOK(t); r.Dispatched != 1 {
		t.Fatalf("verify: %d dispatched, want 1", r.Dispatched)
	}
}

// TestNotADeadLetterRacingItsFailure guards a replay, and the read an
// operator's replay or acknowledgement makes first, against an
// instruction in flight whose failure commits between the look that found
// no dead letter and the look in flight (ordering on and off: neither
// look holds a lock the outcome write takes). Neither found it, and they
// answered "not a dead letter, not in flight" for an instruction that was
// one or the other at every moment: the read now finds the dead letter,
// and the replay replays it.
func TestNotADeadLetterRacingItsFailure(t *testing.T) {
	t.Parallel()
	for _, ordered := range []bool{true, false} {
		b := setupRecord(t)
		if err := b.st.SetOrdered(b.ctx, b.pool, ordered); err != nil {
			t.Fatal(err)
		}
		fail := func(id uuid.UUID) *store.Store {
			c := b.claimOne(t, "r1", longLease)
			if c.OutboxID != id {
				t.Fatalf("claimed %s, want %s", c.OutboxID, id)
			}
			return store.WithNotThere(b.st, func() { b.record(t, recordOutcome(t, c, "r1", store.Failed)) })
		}
		read := b.enqueue(t, "p1", "read")
		dl, inFlight, err := fail(read).DeadLetterOrInFlight(b.ctx, b.pool, read)
		if err != nil || dl == nil || dl.OutboxID != read {
			t.Fatalf("ordered %v: the read of an instruction whose failure committed between its looks: %+v, in flight %v, %v (want the dead letter)",
				ordered, dl, inFlight, err)
		}
		replayed := b.enqueue(t, "p2", "replayed")
		if ok, err := fail(replayed).Replay(b.ctx, b.pool, replayed, "olga", "rail fixed"); err != nil || !ok {
			t.Fatalf("ordered %v: replay of an instruction whose failure committed between its looks: %v, %v (want replayed)", ordered, ok, err)
		}
		if w := b.where(t, replayed); !w.pending {
			t.Fatalf("ordered %v: after the replay the instruction is %+v, want pending", ordered, w)
		}
		b.verifyOK(t)
	}
}

// twoDeadLettersBeforeAThird enqueues three instructions of participant
// p1 and dead-letters the first two (claimed and FAILED by r1, in order):
// the third is then p1's head.
func (b *recordBundle) twoDeadLettersBeforeAThird(t *testing.T) (first, second, third uuid.UUID) {
	t.Helper()
	first, second, third = b.enqueue(t, "p1", "k1"), b.enqueue(t, "p1", "k2"), b.enqueue(t, "p1", "k3")
	for _, want := range []uuid.UUID{first, second} {
		c := b.claimOne(t, "r1", longLease)
		if c.OutboxID != want {
			t.Fatalf("claimed %s, want %s", c.OutboxID, want)
		}
		b.record(t, recordOutcome(t, c, "r1", store.Failed))
	}
	return first, second, third
}

// TestTwoReplaysBehindARetryComeInOrder guards the retry's look for a
// lower pending sequence (behindSQL) with two of them: dead letters 1 and
// 2, both replayed while 3 is in flight, wait; when 3's attempt ends
// RETRYABLE, the lowest of them, 1, is made due, and the participant's
// instructions then go 1, 2, 3. Making the highest lower one due (2)
// dispatched it before 1.
func TestTwoReplaysBehindARetryComeInOrder(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	first, second, third := b.twoDeadLettersBeforeAThird(t)
	held := b.claimOne(t, "r1", longLease)
	if held.OutboxID != third {
		t.Fatalf("claimed %s, want %s", held.OutboxID, third)
	}
	b.replay(t, first)
	b.replay(t, second)
	retry := recordOutcome(t, held, "r1", store.Retryable)
	retry.RetryDelay = 0
	b.record(t, retry)
	if !b.due(t, first) || b.due(t, second) || b.due(t, third) {
		t.Fatalf("after the retry: due %v %v %v, want only the first replayed instruction due",
			b.due(t, first), b.due(t, second), b.due(t, third))
	}
	b.verifyOK(t)
	b.wantHeadThenRest(t, first, second, third)
}

// TestReplaysOfTwoDeadLettersKeepOneHead: with nothing in flight, a
// replayed dead letter is its participant's head only if no lower
// sequence is pending. Dead letters 1 and 2 replayed in that order: 1 is
// the head (3, due until then, waits behind it), and 2 waits behind 1.
// Without the replay's look for a lower pending sequence, 2 was made due
// beside 1: two heads.
func TestReplaysOfTwoDeadLettersKeepOneHead(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	first, second, third := b.twoDeadLettersBeforeAThird(t)
	if !b.due(t, third) {
		t.Fatal("the third instruction is not due after the first two failed")
	}
	b.replay(t, first)
	b.replay(t, second)
	if !b.due(t, first) || b.due(t, second) || b.due(t, third) {
		t.Fatalf("after the replays: due %v %v %v, want only the first due", b.due(t, first), b.due(t, second), b.due(t, third))
	}
	b.verifyOK(t)
	b.wantHeadThenRest(t, first, second, third)
}
