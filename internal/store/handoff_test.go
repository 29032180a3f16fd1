package store_test

import (
	"testing"
	"time"

	"github.com/ledgerline/outbox/internal/store"
)

// TestLostHandoffsAreTheWritesOwn: LostHandoffs returns exactly the claims
// the hand-off of the write that archived an outcome made, and nothing
// when that write handed off nothing: not the relayer's other claims in
// flight (another transaction's), nor another relayer's.
func TestLostHandoffsAreTheWritesOwn(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	b.enqueue(t, "pa", "ka1")
	b.enqueue(t, "pb", "kb1")
	b.enqueue(t, "pc", "kc1")
	successor := b.enqueue(t, "pa", "ka2")
	b.enqueue(t, "pb", "kb2")
	a := b.claimOne(t, "r1", longLease)
	other := b.claimOne(t, "r1", longLease)
	b.claimOne(t, "r2", longLease)

	leases := map[string]time.Duration{"sandbox": longLease}
	oa := recordOutcome(t, a, "r1", store.Dispatched)
	if _, handed, err := b.st.Record(b.ctx, b.pool, []store.Outcome{oa},
		store.HandoffParams{RelayerID: "r1", Limit: 1, Leases: leases}); err != nil || len(handed) != 1 || handed[0].OutboxID != successor {
		t.Fatalf("hand-off %+v, %v: want %s", handed, err, successor)
	}
	lost, err := b.st.LostHandoffs(b.ctx, b.pool, "r1", oa.AttemptID, oa.ClaimedAt)
	if err != nil {
		t.Fatal(err)
	}
	if len(lost) != 1 || lost[0].OutboxID != successor || lost[0].LeaseUntil.IsZero() || len(lost[0].Payload) == 0 {
		t.Fatalf("lost hand-offs %+v, want the one claim of %s", lost, successor)
	}
	if lost, err := b.st.LostHandoffs(b.ctx, b.pool, "r2", oa.AttemptID, oa.ClaimedAt); err != nil || len(lost) != 0 {
		t.Fatalf("another relayer's lost hand-offs: %+v, %v; want none", lost, err)
	}

	// A write without a hand-off (as the resend after a lost reply is):
	// nothing, though r1 still holds the successor above in flight.
	ob := recordOutcome(t, other, "r1", store.Dispatched)
	if _, handed, err := b.st.Record(b.ctx, b.pool, []store.Outcome{ob}, store.HandoffParams{RelayerID: "r1"}); err != nil || len(handed) != 0 {
		t.Fatalf("hand-off %+v, %v: want none", handed, err)
	}
	if lost, err := b.st.LostHandoffs(b.ctx, b.pool, "r1", ob.AttemptID, ob.ClaimedAt); err != nil || len(lost) != 0 {
		t.Fatalf("lost hand-offs of a write that handed off nothing: %+v, %v; want none", lost, err)
	}
}

// TestHandoffLeavesASuspectForASuspectClaim: a suspect (an instruction
// whose relayer died with it in flight twice) that waits behind a
// replayed lower sequence is not taken by the hand-off of that one's
// outcome, which claims for a relayer with other work in flight: it is
// made due, and only a suspect claim, which a relayer makes with nothing
// else in flight, takes it. The hand-off claimed it as any successor, so
// a poison instruction killed its relayer with a batch beside it, each of
// them a zombie again.
func TestHandoffLeavesASuspectForASuspectClaim(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	dead := b.enqueue(t, "p1", "k1")
	suspect := b.enqueue(t, "p1", "k2")
	b.record(t, recordOutcome(t, b.claimOne(t, "r1", longLease), "r1", store.Failed))
	for range 2 {
		b.reap(t, b.claimOne(t, "dies", shortLease))
	}
	b.replay(t, dead) // the suspect waits behind the replayed one
	b.wantDue(t, suspect, "infinity", false)
	c := b.claimOne(t, "r2", longLease)
	if c.OutboxID != dead {
		t.Fatalf("claimed %s, want the replayed %s", c.OutboxID, dead)
	}
	if handed := b.dispatchHandingOff(t, c, "r2"); len(handed) != 0 {
		t.Fatalf("the hand-off claimed the suspect %s beside its relayer's other work", handed[0].OutboxID)
	}
	b.wantDue(t, suspect, "now", false)
	b.verifyOK(t)
	claimed, err := b.st.Claim(b.ctx, b.pool, store.ClaimParams{RelayerID: "r3", Limit: 1, Suspects: true,
		Leases: map[string]time.Duration{"sandbox": longLease}})
	if err != nil || len(claimed) != 1 || claimed[0].OutboxID != suspect {
		t.Fatalf("suspect claim: %v, %v; want %s", outboxIDs(claimed), err, suspect)
	}
}
