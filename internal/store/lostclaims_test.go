package store_test

import (
	"slices"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"

	"github.com/ledgerline/outbox/internal/store"
)

// thisRun is the run id of the looking relayer in the tests that
// register no run.
var thisRun = uuid.Must(uuid.NewV4())

// lostOutboxIDs are the outbox ids of claims, sorted.
func lostOutboxIDs(claims []store.Claimed) []uuid.UUID {
	ids := make([]uuid.UUID, len(claims))
	for i, c := range claims {
		ids[i] = c.OutboxID
	}
	slices.SortFunc(ids, func(a, b uuid.UUID) int { return slices.Compare(a[:], b[:]) })
	return ids
}

// TestLostClaimsAreTheLostClaimsOwn: LostClaims returns exactly the rows
// of the one claim a relayer made after the last it knows of: not the
// claims it knows (claimed before, or named as held), not what an outcome
// write's hand-off claimed for it after (the relayer holds those), not
// another relayer's, and nothing at all when two claims' rows are left
// (it cannot tell its own) or when the lost claim took nothing.
func TestLostClaimsAreTheLostClaimsOwn(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	b.enqueue(t, "pa", "ka1")
	b.enqueue(t, "pb", "kb1")
	b.enqueue(t, "pc", "kc1")
	successor := b.enqueue(t, "pa", "ka2")
	b.enqueue(t, "pd", "kd1")
	b.enqueue(t, "pe", "ke1")
	leases := map[string]time.Duration{"sandbox": longLease}

	known := b.claimOne(t, "r1", longLease) // pa's first: the last claim r1 heard of
	lost, err := b.st.Claim(b.ctx, b.pool, store.ClaimParams{RelayerID: "r1", Limit: 2, Leases: leases})
	if err != nil || len(lost) != 2 {
		t.Fatalf("claimed %+v, %v: want pb's and pc's", lost, err)
	}
	other := b.claimOne(t, "r2", longLease) // pd's: another relayer's, after
	// An outcome write of r1 hands pa's successor off to r1, after the
	// lost claim: r1 holds it.
	o := recordOutcome(t, known, "r1", store.Dispatched)
	if _, handed, err := b.st.Record(b.ctx, b.pool, []store.Outcome{o},
		store.HandoffParams{RelayerID: "r1", Limit: 1, Leases: leases}); err != nil || len(handed) != 1 || handed[0].OutboxID != successor {
		t.Fatalf("hand-off %+v, %v: want %s", handed, err, successor)
	}

	got, err := b.st.LostClaims(b.ctx, b.pool, "r1", thisRun, known.ClaimedAt, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(lostOutboxIDs(got), lostOutboxIDs(lost)) || got[0].LeaseUntil.IsZero() || len(got[0].Payload) == 0 {
		t.Fatalf("lost claims %+v, want the two of the lost claim %+v", got, lost)
	}
	for _, c := range []struct {
		name  string
		after time.Time
		known []uuid.UUID
	}{
		{"the lost claim known by its time", lost[0].ClaimedAt, nil},
		{"the lost claim known by its ids", known.ClaimedAt, []uuid.UUID{lost[0].AttemptID, lost[1].AttemptID}},
	} {
		if got, err := b.st.LostClaims(b.ctx, b.pool, "r1", thisRun, c.after, c.known); err != nil || len(got) != 0 {
			t.Fatalf("%s: lost claims %+v, %v; want none", c.name, got, err)
		}
	}
	if got, err := b.st.LostClaims(b.ctx, b.pool, "r2", thisRun, other.ClaimedAt, nil); err != nil || len(got) != 0 {
		t.Fatalf("r2's lost claims after its own: %+v, %v; want none", got, err)
	}

	// A second claim of r1 after the lost one: two transactions' rows, of
	// which r1 could know one; none is returned.
	b.claimOne(t, "r1", longLease)
	if got, err := b.st.LostClaims(b.ctx, b.pool, "r1", thisRun, known.ClaimedAt, nil); err != nil || len(got) != 0 {
		t.Fatalf("lost claims among two claims' rows: %+v, %v; want none", got, err)
	}
}

// TestLostClaimsUnderTheReaper: the reaper requeues a lost claim's rows
// between the relayer's look and its write of their RELEASED outcomes.
// The outcomes are then late (archived, the requeued copies left
// pending and due), each claim is closed once by the reaper with one late
// row after it (audit verify passes), and a look made after the reaper's
// finds nothing.
func TestLostClaimsUnderTheReaper(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	b.enqueue(t, "pa", "ka1")
	b.enqueue(t, "pb", "kb1")
	b.enqueue(t, "pc", "kc1")
	known := b.claimOne(t, "r1", longLease)
	lost, err := b.st.Claim(b.ctx, b.pool, store.ClaimParams{RelayerID: "r1", Limit: 2,
		Leases: map[string]time.Duration{"sandbox": shortLease}})
	if err != nil || len(lost) != 2 {
		t.Fatalf("claimed %+v, %v: want pb's and pc's", lost, err)
	}
	found, err := b.st.LostClaims(b.ctx, b.pool, "r1", thisRun, known.ClaimedAt, nil)
	if err != nil || len(found) != 2 {
		t.Fatalf("lost claims %+v, %v: want 2", found, err)
	}
	b.waitExpired(t, lost...)
	if requeued, err := b.reaper.RunOnce(b.ctx); err != nil || len(requeued) != 2 {
		t.Fatalf("reaper requeued %+v, %v: want the lost claim's 2", requeued, err)
	}
	outcomes := make([]store.Outcome, len(found))
	for i, c := range found {
		outcomes[i] = recordOutcome(t, c, "r1", store.Retryable)
		outcomes[i].ErrorCode, outcomes[i].ErrorMessage, outcomes[i].CountAttempt = "RELEASED", "released", false
	}
	for _, r := range b.record(t, outcomes...) {
		if !r.Late {
			t.Errorf("%+v: want late", r)
		}
	}
	for _, c := range found {
		if w := b.where(t, c.OutboxID); !w.pending || w.inflight != nil {
			t.Errorf("%s: %+v, want its requeued copy pending", c.OutboxID, w)
		}
	}
	if got, err := b.st.LostClaims(b.ctx, b.pool, "r1", thisRun, known.ClaimedAt, nil); err != nil || len(got) != 0 {
		t.Fatalf("lost claims after the reaper's: %+v, %v; want none", got, err)
	}
	b.record(t, recordOutcome(t, known, "r1", store.Dispatched))
	b.verifyOK(t)
}

// registerRun registers a run of relayerID whose claims the
// registration covers for claimsFor.
func (b *recordBundle) registerRun(t *testing.T, relayerID string, claimsFor time.Duration) store.Run {
	t.Helper()
	self, _, err := b.st.RegisterRun(b.ctx, b.pool, store.RunParams{RunID: uuid.Must(uuid.NewV7()), RelayerID: relayerID,
		Host: "test-host", PID: 1, ClaimsFor: claimsFor})
	if err != nil {
		t.Fatal(err)
	}
	return self
}

// TestLostClaimsLeaveAnotherRunsClaims: the look's bound is the claims of
// one run, and nothing in the in-flight rows tells the lost claim's
// transaction from a claim another process made under the same relayer
// id after it. When the lost claim did not commit and the other process
// claimed meanwhile, its claim is the one transaction left; before
// migration 052 LostClaims returned it while that process dispatched it,
// and its RELEASED rows sent those instructions again. Now each run is
// registered (relayer_runs), and while another run of the id is, its
// claims covered past the last claim this run heard of, the look returns
// nothing: the rows are left to the reaper. Without the registration (the
// other run ended it) the rows are what they were: the look returns the
// claim again, which is why a run keeps its registration while a claim it
// dispatches is in flight.
func TestLostClaimsLeaveAnotherRunsClaims(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	b.enqueue(t, "pa", "ka1")
	b.enqueue(t, "pb", "kb1")
	me := b.registerRun(t, "r1", time.Hour)      // this run
	sibling := b.registerRun(t, "r1", time.Hour) // another process started with the same id
	known := b.claimOne(t, "r1", longLease)      // the last claim this run heard of
	// This run's next claim fails without the server's answer and did
	// not commit: nothing of it is in flight. The other process claims
	// meanwhile, and dispatches what it took.
	siblings := b.claimOne(t, "r1", longLease)
	got, err := b.st.LostClaims(b.ctx, b.pool, "r1", me.RunID, known.ClaimedAt, []uuid.UUID{known.AttemptID})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 0 {
		t.Fatalf("lost claims %+v: want none while another run of r1 is registered (its claim %s would be sent twice)", got, siblings.AttemptID)
	}
	if err := b.st.EndRun(b.ctx, b.pool, sibling.RunID); err != nil {
		t.Fatal(err)
	}
	got, err = b.st.LostClaims(b.ctx, b.pool, "r1", me.RunID, known.ClaimedAt, []uuid.UUID{known.AttemptID})
	if err != nil || len(got) != 1 || got[0].AttemptID != siblings.AttemptID {
		t.Fatalf("lost claims %+v, %v: want the other run's claim %s once its registration is gone (nothing else tells)", got, err, siblings.AttemptID)
	}
}

// TestLostClaimsAfterAKilledRunOfTheSameID: a run of the same relayer id
// killed before this run heard of its first claim (a restart under a fixed
// id) left its registration, whose claims ended before that claim: it does
// not stop the look, which returns the lost claim's rows.
func TestLostClaimsAfterAKilledRunOfTheSameID(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	b.enqueue(t, "pa", "ka1")
	b.enqueue(t, "pb", "kb1")
	b.registerRun(t, "r1", 0) // killed: its claims ended when it last refreshed
	me := b.registerRun(t, "r1", time.Hour)
	known := b.claimOne(t, "r1", longLease)
	lost := b.claimOne(t, "r1", longLease) // committed, its reply lost
	got, err := b.st.LostClaims(b.ctx, b.pool, "r1", me.RunID, known.ClaimedAt, []uuid.UUID{known.AttemptID})
	if err != nil || len(got) != 1 || got[0].AttemptID != lost.AttemptID {
		t.Fatalf("lost claims %+v, %v: want the lost claim %s", got, err, lost.AttemptID)
	}
}

// TestForgetEndedRunsKeepsWhatCoversAClaimInFlight: the reaper's removal
// of ended runs' registrations leaves one while a claim of its relayer id
// that it may cover (claimed before its claims_until) is in flight, and
// removes it once that claim has its outcome.
func TestForgetEndedRunsKeepsWhatCoversAClaimInFlight(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	b.enqueue(t, "pa", "ka1")
	c := b.claimOne(t, "r1", longLease)
	covering := b.registerRun(t, "r1", 0) // claims_until after c's claim
	b.registerRun(t, "r2", 0)             // nothing of r2 in flight
	if n, err := b.st.ForgetEndedRuns(b.ctx, b.pool, 0); err != nil || n != 1 {
		t.Fatalf("forgot %d, %v: want r2's run alone", n, err)
	}
	if runs, err := b.st.Runs(b.ctx, b.pool); err != nil || len(runs) != 1 || runs[0].RunID != covering.RunID {
		t.Fatalf("runs %+v, %v: want r1's, which covers a claim in flight", runs, err)
	}
	b.record(t, recordOutcome(t, c, "r1", store.Dispatched))
	if n, err := b.st.ForgetEndedRuns(b.ctx, b.pool, 0); err != nil || n != 1 {
		t.Fatalf("forgot %d, %v: want r1's run once its claim has its outcome", n, err)
	}
}
