package store_test

import (
	"testing"

	"github.com/gofrs/uuid/v5"

	"github.com/ledgerline/outbox/internal/store"
)

// reapedTwice enqueues one instruction and lets the reaper requeue two
// claims of it by a slow relayer: the copy pending now is the second
// claim's.
func (b *recordBundle) reapedTwice(t *testing.T) (id uuid.UUID, first, second store.Claimed) {
	t.Helper()
	id = b.enqueue(t, "p1", "k1")
	first = b.claimOne(t, "slow", shortLease)
	b.reap(t, first)
	second = b.claimOne(t, "slow", shortLease)
	b.reap(t, second)
	return id, first, second
}

// TestLateFailuresOfTwoClaimsInOneWrite guards the withdrawal of a
// requeued copy when the late FAILED outcomes of two claims of the same
// instruction come in one write: the copy the second claim left is
// withdrawn into one dead letter, with that claim's failure. The dead
// letter was once written for both outcomes (joined by instruction, not by
// claim), its primary key refused the second, and the copy stayed pending.
func TestLateFailuresOfTwoClaimsInOneWrite(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	id, first, second := b.reapedTwice(t)
	o1, o2 := recordOutcome(t, first, "slow", store.Failed), recordOutcome(t, second, "slow", store.Failed)
	rec := b.record(t, o1, o2)
	for i, r := range rec {
		if !r.Late || r.Withdrew != (r.ClaimAttemptID == second.AttemptID) {
			t.Errorf("outcome %d recorded %+v, want late, and withdrawn only for the second claim", i, r)
		}
	}
	if w := b.where(t, id); w.pending || w.inflight != nil || !w.dead {
		t.Fatalf("after both late FAILED outcomes: %+v, want only a dead letter", w)
	}
	var attemptID uuid.UUID
	if err := b.pool.QueryRow(b.ctx, `SELECT attempt_id FROM outbox.dead_letters WHERE outbox_id = $1`, id).Scan(&attemptID); err != nil {
		t.Fatal(err)
	}
	if attemptID != o2.AttemptID {
		t.Errorf("dead letter names attempt %s, want the second claim's outcome %s", attemptID, o2.AttemptID)
	}
	b.verifyOK(t)
}

// TestLateDispatchedAndFailedOfTwoClaimsInOneWrite guards the same with
// the second claim's late outcome DISPATCHED and the first's FAILED: the
// copy is withdrawn by the DISPATCHED outcome of the claim it came from,
// and the instruction is dispatched. It was once made a dead letter with
// the other claim's failure, though the rail had accepted it.
func TestLateDispatchedAndFailedOfTwoClaimsInOneWrite(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	id, first, second := b.reapedTwice(t)
	b.record(t, recordOutcome(t, first, "slow", store.Failed), recordOutcome(t, second, "slow", store.Dispatched))
	if w := b.where(t, id); w.pending || w.inflight != nil || w.dead {
		t.Fatalf("after the late DISPATCHED of the copy's claim: %+v, want it nowhere in the queue", w)
	}
	got, _ := b.trail(t, id)
	wantTrail(t, got, "DISPATCHING#1", "ZOMBIE_REQUEUE#1", "DISPATCHING#1", "ZOMBIE_REQUEUE#1", "FAILED#1+late", "DISPATCHED#1+late")
	if r := b.verifyOK(t); r.Dispatched != 1 || r.DeadLetters != 0 {
		t.Errorf("report: %d dispatched, %d dead letters (want 1, 0)", r.Dispatched, r.DeadLetters)
	}
}
