package store_test

import (
	"bytes"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"

	"github.com/ledgerline/outbox/internal/store"
)

// handOff records outcomes DISPATCHED for the claims with a hand-off of
// up to limit on the sandbox rail and returns what it claimed.
func (b *recordBundle) handOff(t *testing.T, limit int, claims ...store.Claimed) []store.Claimed {
	t.Helper()
	outcomes := make([]store.Outcome, len(claims))
	for i, c := range claims {
		outcomes[i] = recordOutcome(t, c, "r-1", store.Dispatched)
	}
	_, handed, err := b.st.Record(b.ctx, b.pool, outcomes,
		store.HandoffParams{RelayerID: "r-1", Limit: limit, Leases: map[string]time.Duration{"sandbox": longLease}, Refill: true})
	if err != nil {
		t.Fatal(err)
	}
	return handed
}

func outboxIDs(cs []store.Claimed) []uuid.UUID {
	ids := make([]uuid.UUID, len(cs))
	for i, c := range cs {
		ids[i] = c.OutboxID
	}
	return ids
}

// sameIDs reports whether the claims are of exactly the instructions want,
// in any order (a hand-off returns its claims in due order, and a
// successor was not due).
func sameIDs(cs []store.Claimed, want ...uuid.UUID) bool {
	byBytes := func(a, b uuid.UUID) int { return bytes.Compare(a[:], b[:]) }
	got, want := outboxIDs(cs), slices.Clone(want)
	slices.SortFunc(got, byBytes)
	slices.SortFunc(want, byBytes)
	return slices.Equal(got, want)
}

// TestHandoffRefillsFreedSlots: with ordering off, the transaction that
// records outcomes fills the slots they free from the due queue (when
// asked to: HandoffParams.Refill), as a claim would: oldest due first, up to the limit, never a row that is not due, a
// suspect or on a rail the relayer does not claim.
func TestHandoffRefillsFreedSlots(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	if err := b.st.SetOrdered(b.ctx, b.pool, false); err != nil {
		t.Fatal(err)
	}
	var due []uuid.UUID
	for i := range 5 {
		due = append(due, b.enqueue(t, "p-"+string(rune('a'+i)), "due-"+string(rune('a'+i))))
	}
	later := b.enqueue(t, "p-later", "later")
	suspect := b.enqueue(t, "p-suspect", "suspect")
	otherRail := b.enqueue(t, "p-other", "other-rail")
	b.execAll(t,
		`UPDATE outbox.pending SET next_attempt_at = now() + interval '1 hour' WHERE outbox_id = '`+later.String()+`'`,
		`UPDATE outbox.pending SET zombie_count = 2 WHERE outbox_id = '`+suspect.String()+`'`,
		`UPDATE outbox.pending SET rail_type = 'other' WHERE outbox_id = '`+otherRail.String()+`'`)

	first := b.claimOne(t, "r-1", longLease)
	if first.OutboxID != due[0] {
		t.Fatalf("claimed %s first, want the oldest %s", first.OutboxID, due[0])
	}
	// Without Refill (a relayer that is not draining a backlog) the
	// hand-off only takes successors, and there are none.
	_, handed, err := b.st.Record(b.ctx, b.pool, []store.Outcome{recordOutcome(t, first, "r-1", store.Dispatched)},
		store.HandoffParams{RelayerID: "r-1", Limit: 2, Leases: map[string]time.Duration{"sandbox": longLease}})
	if err != nil || len(handed) != 0 {
		t.Fatalf("hand-off without refill: claimed %v (%v), want nothing", outboxIDs(handed), err)
	}
	handed = b.handOff(t, 2, b.claimOne(t, "r-1", longLease))
	if !sameIDs(handed, due[2:4]...) {
		t.Fatalf("refilled %v, want the two oldest due %v", outboxIDs(handed), due[2:4])
	}
	handed = b.handOff(t, 10, handed...)
	if !sameIDs(handed, due[4:]...) {
		t.Fatalf("refilled %v, want the rest of the due ones %v and nothing else", outboxIDs(handed), due[4:])
	}
	if handed = b.handOff(t, 10, handed...); len(handed) != 0 {
		t.Fatalf("refilled %v with nothing claimable left", outboxIDs(handed))
	}
	for _, id := range []uuid.UUID{later, suspect, otherRail} {
		if w := b.where(t, id); !w.pending {
			t.Errorf("%s: %+v, want it still pending", id, w)
		}
	}
	for _, id := range due {
		if w := b.where(t, id); w.pending || w.inflight != nil {
			t.Errorf("%s: %+v, want it recorded", id, w)
		}
	}
	b.verifyOK(t)
}

// TestHandoffTakesSuccessorsBeforeRefill: with ordering on, a freed
// participant's next instruction comes first, then the slots left are
// filled with other participants' due heads; a participant's later
// instructions are never taken by the refill.
func TestHandoffTakesSuccessorsBeforeRefill(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	a1 := b.enqueue(t, "p-a", "a-1")
	bHead := b.enqueue(t, "p-b", "b-1")
	a2 := b.enqueue(t, "p-a", "a-2")
	b.enqueue(t, "p-b", "b-2")
	cHead := b.enqueue(t, "p-c", "c-1")

	first := b.claimOne(t, "r-1", longLease)
	if first.OutboxID != a1 {
		t.Fatalf("claimed %s first, want %s", first.OutboxID, a1)
	}
	handed := b.handOff(t, 2, first)
	if !sameIDs(handed, a2, bHead) {
		t.Fatalf("handed off %v, want p-a's successor %s and the oldest due head %s (not p-c's %s)", outboxIDs(handed), a2, bHead, cHead)
	}
	// p-b is in flight: the refill takes p-c's head and not p-b's second
	// instruction; p-a has nothing left.
	var aClaim, bClaim store.Claimed
	for _, c := range handed {
		if c.OutboxID == a2 {
			aClaim = c
		} else {
			bClaim = c
		}
	}
	handed = b.handOff(t, 3, aClaim)
	if !sameIDs(handed, cHead) {
		t.Fatalf("handed off %v, want only p-c's head %s", outboxIDs(handed), cHead)
	}
	b.drain(t, append(handed, bClaim))
	b.verifyOK(t)
}

// TestHandoffRefusedWritesNothing: if the database refuses one of the
// hand-off's claims (a second ordered in-flight row for a participant,
// which only a broken invariant can offer: here a successor made due by
// hand while its head is in flight), the outcomes are not written either,
// the error says why, and the same outcomes are recorded without the
// hand-off.
func TestHandoffRefusedWritesNothing(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	b.enqueue(t, "p-a", "a-1")
	a2 := b.enqueue(t, "p-a", "a-2")
	b.enqueue(t, "p-b", "b-1")
	heads, err := b.st.Claim(b.ctx, b.pool, store.ClaimParams{RelayerID: "r-1", Limit: 10, Leases: map[string]time.Duration{"sandbox": longLease}})
	if err != nil || len(heads) != 2 {
		t.Fatalf("claimed %d heads (%v), want 2", len(heads), err)
	}
	b.execAll(t, `UPDATE outbox.pending SET next_attempt_at = now() - interval '1 hour' WHERE outbox_id = '`+a2.String()+`'`)
	var pb store.Claimed
	for _, c := range heads {
		if c.ParticipantID == "p-b" {
			pb = c
		}
	}
	outcome := recordOutcome(t, pb, "r-1", store.Dispatched)
	_, _, err = b.st.Record(b.ctx, b.pool, []store.Outcome{outcome},
		store.HandoffParams{RelayerID: "r-1", Limit: 1, Leases: map[string]time.Duration{"sandbox": longLease}, Refill: true})
	if !errors.Is(err, store.ErrOrderingConflict) {
		t.Fatalf("record with the refill offered p-a's second instruction: %v, want ErrOrderingConflict", err)
	}
	if w := b.where(t, pb.OutboxID); w.inflight == nil {
		t.Fatalf("p-b's head after the refused write: %+v, want it still in flight", w)
	}
	rec, handed, err := b.st.Record(b.ctx, b.pool, []store.Outcome{outcome}, store.HandoffParams{})
	if err != nil || len(rec) != 1 || len(handed) != 0 {
		t.Fatalf("record without the hand-off: %d recorded, %d handed, %v", len(rec), len(handed), err)
	}
}
