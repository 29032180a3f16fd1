package store_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/pending"
)

func (b *recordBundle) cancel(t *testing.T, id uuid.UUID, want bool) {
	t.Helper()
	got, err := b.st.Cancel(b.ctx, b.pool, id, "olga", "fraud hold "+id.String())
	if err != nil || got != want {
		t.Fatalf("cancel %s: %v, %v (want %v)", id, got, err, want)
	}
}

// due reports whether the pending instruction id is due now.
func (b *recordBundle) due(t *testing.T, id uuid.UUID) bool {
	t.Helper()
	var due bool
	if err := b.pool.QueryRow(b.ctx, `SELECT next_attempt_at <= now() FROM outbox.pending WHERE outbox_id = $1`, id).Scan(&due); err != nil {
		t.Fatalf("%s: %v", id, err)
	}
	return due
}

// TestCancelPending: a cancelled instruction leaves the queue for a
// CANCELLED archive row naming who and why, and is never claimed; with
// ordering on, cancelling a participant's head (due, or waiting for a
// retry) makes its next instruction due, cancelling one queued behind
// leaves the head alone, and one in flight cannot be cancelled
// (ErrCancelInFlight). The
// invariants hold throughout, and the key still answers with its receipt.
func TestCancelPending(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	a1, a2, a3 := b.enqueue(t, "p-a", "a1"), b.enqueue(t, "p-a", "a2"), b.enqueue(t, "p-a", "a3")

	b.cancel(t, a2, true) // queued behind the head
	if !b.due(t, a1) || b.due(t, a3) {
		t.Fatal("cancelling a queued instruction changed who is the head")
	}
	b.verifyOK(t)
	b.cancel(t, a1, true) // the head
	if !b.due(t, a3) {
		t.Fatal("cancelling the head did not make the next instruction due")
	}
	b.verifyOK(t)
	b.cancel(t, a1, false) // already cancelled
	c := b.claimOne(t, "r-1", longLease)
	if c.OutboxID != a3 {
		t.Fatalf("claimed %s, want %s", c.OutboxID, a3)
	}
	if ok, err := b.st.Cancel(b.ctx, b.pool, a3, "olga", "in flight"); ok || !errors.Is(err, store.ErrCancelInFlight) {
		t.Fatalf("cancel of an instruction in flight: %v, %v (want ErrCancelInFlight)", ok, err)
	}
	b.record(t, recordOutcome(t, c, "r-1", store.Dispatched))
	b.cancel(t, a3, false) // dispatched
	b.cancel(t, uuid.Must(uuid.NewV7()), false)

	got, rows := b.trail(t, a1)
	wantTrail(t, got, "CANCELLED#1")
	if len(rows) == 1 && (rows[0].RelayerID == nil || *rows[0].RelayerID != "olga" || rows[0].ErrorMessage == nil ||
		*rows[0].ErrorMessage != "cancelled by olga (database role "+b.sessionRole(t)+"): fraud hold "+a1.String()) {
		t.Fatalf("the CANCELLED row: by %v, %v", rows[0].RelayerID, rows[0].ErrorMessage)
	}
	r := b.verifyOK(t)
	if r.Cancelled != 2 || r.Dispatched != 1 || r.Pending != 0 {
		t.Fatalf("verify: %d cancelled, %d dispatched, %d pending (want 2, 1, 0)", r.Cancelled, r.Dispatched, r.Pending)
	}
	again, err := b.producer.Enqueue(b.ctx, b.pool, pending.Instruction{
		InstructionID: "ins-a1", ParticipantID: "p-a", IdempotencyKey: "a1",
		RailType: "sandbox", AmountMinor: 100, Currency: "USD", Destination: "acct-1",
	})
	if err != nil || !again.Duplicate || again.OutboxID != a1 {
		t.Fatalf("enqueue of the cancelled instruction again: %+v, %v (want its receipt)", again, err)
	}

	// A head waiting for its retry.
	b1, b2 := b.enqueue(t, "p-b", "b1"), b.enqueue(t, "p-b", "b2")
	c = b.claimOne(t, "r-1", longLease)
	retry := recordOutcome(t, c, "r-1", store.Retryable)
	retry.RetryDelay = time.Hour
	b.record(t, retry)
	if b.due(t, b1) || b.due(t, b2) {
		t.Fatal("a retry waits an hour, its successor behind it")
	}
	b.cancel(t, b1, true)
	if !b.due(t, b2) {
		t.Fatal("cancelling a head waiting for its retry did not make the next instruction due")
	}
	got, _ = b.trail(t, b1)
	wantTrail(t, got, "DISPATCHING#1", "RETRYABLE#1", "CANCELLED#2")
	b.verifyOK(t)

	// Queued behind an instruction in flight: the outcome hands nothing on.
	c1, c2 := b.enqueue(t, "p-c", "c1"), b.enqueue(t, "p-c", "c2")
	var held store.Claimed
	for _, cl := range b.claimAll(t) {
		if cl.OutboxID == c1 {
			held = cl
		} else {
			b.record(t, recordOutcome(t, cl, "r-1", store.Dispatched))
		}
	}
	b.cancel(t, c2, true)
	if _, handed, err := b.st.Record(b.ctx, b.pool, []store.Outcome{recordOutcome(t, held, "r-1", store.Dispatched)},
		store.HandoffParams{RelayerID: "r-1", Limit: 5, Leases: bothRails}); err != nil || len(handed) != 0 {
		t.Fatalf("hand-off after the queued one was cancelled: %v, %v", outboxIDs(handed), err)
	}
	b.verifyOK(t)
}

// TestCancelWaitsForAClaim: a cancel of an instruction a claim holds waits
// for the claim, and then finds it in flight: it refuses with
// ErrCancelInFlight (the rail call may be under way) and writes nothing. It
// never removes what a relayer is about to send. Before migration 044 it
// answered false, as for an instruction settled or unknown.
func TestCancelWaitsForAClaim(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	id := b.enqueue(t, "p-a", "a1")
	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(b.ctx) }()
	claimed, err := b.st.Claim(b.ctx, tx, store.ClaimParams{RelayerID: "r-1", Limit: 1, Leases: bothRails})
	if err != nil || len(claimed) != 1 {
		t.Fatalf("claim: %v, %v", claimed, err)
	}
	var cancelled bool
	err = b.waitingOn(t, tx, func(conn *pgxpool.Conn) (err error) {
		cancelled, err = b.st.Cancel(b.ctx, conn, id, "olga", "too late")
		return err
	})
	var inFlight *store.CancelInFlightError
	if cancelled || !errors.Is(err, store.ErrCancelInFlight) || !errors.As(err, &inFlight) || inFlight.OutboxID != id {
		t.Fatalf("cancel after the claim committed: %v, %v (want ErrCancelInFlight naming %s)", cancelled, err, id)
	}
	if w := b.where(t, id); w.inflight == nil {
		t.Fatalf("the claimed instruction is not in flight: %+v", w)
	}
	got, _ := b.trail(t, id)
	wantTrail(t, got, "DISPATCHING#1")
	b.record(t, recordOutcome(t, claimed[0], "r-1", store.Dispatched))
	b.verifyOK(t)
	// Settled, it is no longer in flight: not pending, no error.
	b.cancel(t, id, false)
}

// TestClaimSkipsAnInstructionBeingCancelled: the other order of
// TestCancelWaitsForAClaim. A cancel that holds the pending row (its
// transaction not yet committed) is not waited for by a claim, which skips
// the row (SKIP LOCKED) and takes nothing of that participant; once the
// cancel commits the instruction is gone, never sent, and the
// participant's next instruction is the one a claim takes.
func TestClaimSkipsAnInstructionBeingCancelled(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	first, second := b.enqueue(t, "p1", "k1"), b.enqueue(t, "p1", "k2")
	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(b.ctx) }()
	if ok, err := b.st.Cancel(b.ctx, tx, first, "olga", "recalled by the customer"); err != nil || !ok {
		t.Fatalf("cancel: %v, %v", ok, err)
	}
	if got := b.claimAll(t); len(got) != 0 {
		t.Fatalf("a claim beside the uncommitted cancel took %v, want nothing", outboxIDs(got))
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	got, _ := b.trail(t, first)
	wantTrail(t, got, "CANCELLED#1")
	b.verifyOK(t)
	b.wantHeadThenRest(t, second)
}

// TestCancelWaitsForTheRetryOfItsInstruction guards a cancel of an
// instruction in flight whose retry is being recorded: the outcome write
// holds the participant's lock, and the cancel, which finds the
// participant through the instruction's key, waits for it and then
// cancels the retry under that lock, making the next instruction due.
// Before migration 044 the cancel read the participant from pending only:
// the instruction, in flight, gave none, no lock was taken and it
// answered "not pending" at once; and had the write committed between its
// first statement and the next, it would have cancelled and re-marked
// heads without the lock.
func TestCancelWaitsForTheRetryOfItsInstruction(t *testing.T) {
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
	retry := recordOutcome(t, c, "r1", store.Retryable)
	retry.RetryDelay = time.Hour
	if _, _, err := b.st.Record(b.ctx, tx, []store.Outcome{retry}, store.HandoffParams{}); err != nil {
		t.Fatal(err)
	}
	conn := b.conn(t)
	done := make(chan error, 1)
	var cancelled bool
	go func() {
		var err error
		cancelled, err = b.st.Cancel(b.ctx, conn, first, "olga", "recalled by the customer")
		done <- err
	}()
	b.waitBlockedBy(t, conn.Conn().PgConn().PID(), b.backendOf(t, tx), done)
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil || !cancelled {
		t.Fatalf("cancel after the retry committed: %v, %v (want cancelled)", cancelled, err)
	}
	got, rows := b.trail(t, first)
	wantTrail(t, got, "DISPATCHING#1", "RETRYABLE#1", "CANCELLED#2")
	if last := rows[len(rows)-1]; last.RelayerID == nil || *last.RelayerID != "olga" || last.ErrorMessage == nil ||
		*last.ErrorMessage != "cancelled by olga (database role "+b.sessionRole(t)+"): recalled by the customer" {
		t.Fatalf("the CANCELLED row: by %v, %v", last.RelayerID, last.ErrorMessage)
	}
	if !b.due(t, second) {
		t.Fatal("cancelling the retried head did not make the next instruction due")
	}
	b.verifyOK(t)
	b.wantHeadThenRest(t, second)
}

// backendOf is the backend pid of the connection tx runs on.
func (b *recordBundle) backendOf(t *testing.T, tx pgx.Tx) uint32 {
	t.Helper()
	var pid int32
	if err := tx.QueryRow(b.ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	return uint32(pid)
}

// TestCancelNeedsOperatorAndReason: refused, typed, and by the database.
func TestCancelNeedsOperatorAndReason(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	id := b.enqueue(t, "p-a", "a1")
	for _, c := range [][2]string{{"", "why"}, {"olga", " "}} {
		if _, err := b.st.Cancel(b.ctx, b.pool, id, c[0], c[1]); !errors.Is(err, store.ErrOperatorAction) {
			t.Errorf("cancel by %q for %q: %v", c[0], c[1], err)
		}
	}
	var pgErr *pgconn.PgError
	if _, err := b.pool.Exec(b.ctx, `SELECT outbox.cancel_pending($1, 'olga', '')`, id); !errors.As(err, &pgErr) || pgErr.Code != "22023" {
		t.Errorf("cancel_pending without a reason: %v", err)
	}
	if w := b.where(t, id); !w.pending {
		t.Fatal("a refused cancel removed the instruction")
	}
	if got, _ := b.trail(t, id); len(got) != 0 || strings.Contains(strings.Join(got, ","), "CANCELLED") {
		t.Fatalf("a refused cancel archived %v", got)
	}
}

// TestCancelUnordered: with ordering off every pending instruction is due
// on its own; a cancel removes one and leaves the others as they were.
func TestCancelUnordered(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	if err := b.st.SetOrdered(b.ctx, b.pool, false); err != nil {
		t.Fatal(err)
	}
	first, second := b.enqueue(t, "p-a", "a1"), b.enqueue(t, "p-a", "a2")
	b.cancel(t, second, true)
	if !b.due(t, first) {
		t.Fatal("the other instruction is no longer due")
	}
	claimed := b.claimAll(t)
	if !sameIDs(claimed, first) {
		t.Fatalf("claimed %v, want %s alone", outboxIDs(claimed), first)
	}
	b.record(t, recordOutcome(t, claimed[0], "r-1", store.Dispatched))
	if r := b.verifyOK(t); r.Cancelled != 1 || r.Dispatched != 1 {
		t.Fatalf("verify: %d cancelled, %d dispatched", r.Cancelled, r.Dispatched)
	}
}

// TestCancelReplayedInstructionBehindInFlight guards a cancel of a
// replayed instruction that waits behind its participant's instruction in
// flight: nothing is made due meanwhile, and when the one in flight
// retries it is the head again, due after its backoff.
func TestCancelReplayedInstructionBehindInFlight(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	replayed, third, held := b.replayedBehindInFlight(t, "r1", longLease)
	b.cancel(t, replayed, true)
	if b.due(t, third) {
		t.Fatal("cancelling a waiting instruction made another due while one is in flight")
	}
	b.verifyOK(t)
	retry := recordOutcome(t, held, "r1", store.Retryable)
	retry.RetryDelay = 0
	b.record(t, retry)
	b.verifyOK(t)
	b.wantHeadThenRest(t, held.OutboxID, third)
}

// TestCancelRacingARetryLeavesAHead guards a cancel of a participant's
// head against the retry of its instruction in flight, recorded at the
// same time: the retry makes the replayed instruction the head (due) and
// itself waits; the cancel waits for it (the participant's lock), and
// then removes that head and makes the retried instruction due. A cancel
// that decided from a snapshot without the retry saw the instruction in
// flight, made nothing due, and left the participant stranded.
func TestCancelRacingARetryLeavesAHead(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	replayed, third, held := b.replayedBehindInFlight(t, "r1", longLease)
	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(b.ctx) }()
	retry := recordOutcome(t, held, "r1", store.Retryable)
	retry.RetryDelay = 0
	if _, _, err := b.st.Record(b.ctx, tx, []store.Outcome{retry}, store.HandoffParams{}); err != nil {
		t.Fatal(err)
	}
	b.cancelWaitingOn(t, tx, replayed)
	if !b.due(t, held.OutboxID) || b.due(t, third) {
		t.Fatal("after the cancel: want the retried instruction due, the third waiting")
	}
	b.verifyOK(t)
	b.wantHeadThenRest(t, held.OutboxID, third)
}

// cancelWaitingOn cancels id while tx holds its participant's lock, and
// commits tx once the cancel waits for it.
func (b *recordBundle) cancelWaitingOn(t *testing.T, tx pgx.Tx, id uuid.UUID) {
	t.Helper()
	var cancelled bool
	err := b.waitingOn(t, tx, func(conn *pgxpool.Conn) (err error) {
		cancelled, err = b.st.Cancel(b.ctx, conn, id, "olga", "sent by hand")
		return err
	})
	if err != nil || !cancelled {
		t.Fatalf("cancel: %v, %v", cancelled, err)
	}
}

// TestCancelRacingAReapLeavesAHead guards the same against the reaper:
// its requeue of the instruction in flight makes the replayed instruction
// the head, under the participant's lock, which the cancel waits for.
func TestCancelRacingAReapLeavesAHead(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	replayed, third, held := b.replayedBehindInFlight(t, "dies", shortLease)
	b.waitExpired(t, held)
	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(b.ctx) }()
	if requeued, err := b.st.Reap(b.ctx, tx, 10, "test-reaper", 0); err != nil || len(requeued) != 1 {
		t.Fatalf("reap: %+v, %v", requeued, err)
	}
	b.cancelWaitingOn(t, tx, replayed)
	if !b.due(t, held.OutboxID) || b.due(t, third) {
		t.Fatal("after the cancel: want the requeued instruction due, the third waiting")
	}
	b.verifyOK(t)
	b.wantHeadThenRest(t, held.OutboxID, third)
}

// sessionRole is the database role the bundle's pool logs in as, which
// the operators' functions archive beside the operator's name (migration
// 035).
func (b *recordBundle) sessionRole(t *testing.T) string {
	t.Helper()
	var role string
	if err := b.pool.QueryRow(b.ctx, `SELECT format('%I', session_user)`).Scan(&role); err != nil {
		t.Fatal(err)
	}
	return role
}

// TestCancelUnorderedRacingARetryOfItsClaim guards a cancel, with
// ordering off, against an instruction that leaves pending for a claim and
// comes back with a retry while the cancel decides. With ordering off an
// outcome write takes no participant's lock, so the cancel's look at
// pending (which finds it gone: claimed) and its look in flight (a later
// statement, with a snapshot of its own) can straddle the retry's commit.
// Before migration 048 it then answered "not pending" (false, no error),
// as for an instruction settled or unknown, while the instruction was
// pending and due: an operator told so stops looking, and it is sent.
// The claim and the retry commit together here so that the retry's commit
// falls between the cancel's two statements every time (the cancel waits
// for the claim's row lock, and wakes to both); apart, they leave the
// same rows to the cancel when the retry commits first.
func TestCancelUnorderedRacingARetryOfItsClaim(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	if err := b.st.SetOrdered(b.ctx, b.pool, false); err != nil {
		t.Fatal(err)
	}
	id := b.enqueue(t, "p-a", "a1")
	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(b.ctx) }()
	claimed, err := b.st.Claim(b.ctx, tx, store.ClaimParams{RelayerID: "r-1", Limit: 1, Leases: bothRails})
	if err != nil || len(claimed) != 1 || claimed[0].OutboxID != id {
		t.Fatalf("claim: %v, %v", outboxIDs(claimed), err)
	}
	retry := recordOutcome(t, claimed[0], "r-1", store.Retryable)
	retry.RetryDelay = 0
	if _, _, err := b.st.Record(b.ctx, tx, []store.Outcome{retry}, store.HandoffParams{}); err != nil {
		t.Fatal(err)
	}
	var cancelled bool
	err = b.waitingOn(t, tx, func(conn *pgxpool.Conn) (err error) {
		cancelled, err = b.st.Cancel(b.ctx, conn, id, "olga", "recalled by the customer")
		return err
	})
	if err != nil || !cancelled {
		t.Fatalf("cancel of an instruction back in pending: %v, %v (want cancelled); it is now %+v", cancelled, err, b.where(t, id))
	}
	if w := b.where(t, id); w.pending || w.inflight != nil || w.dead {
		t.Fatalf("after the cancel the instruction is %+v, want gone", w)
	}
	got, _ := b.trail(t, id)
	wantTrail(t, got, "DISPATCHING#1", "RETRYABLE#1", "CANCELLED#2")
	b.verifyOK(t)
}
