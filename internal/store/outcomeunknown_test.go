package store_test

import (
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"

	"github.com/ledgerline/outbox/internal/store"
)

// timedOut is the outcome of claim c that timed out after its request was
// sent: retryable, the rail may have acted on it.
func timedOut(t *testing.T, c store.Claimed) store.Outcome {
	t.Helper()
	o := recordOutcome(t, c, "r1", store.Retryable)
	o.RailCode, o.ErrorCode, o.ErrorMessage, o.OutcomeUnknown = "", "RAIL_TIMEOUT", "no answer in time", true
	return o
}

// deadUnknown returns the error code and outcome_unknown of id's dead
// letter.
func (b *recordBundle) deadUnknown(t *testing.T, id uuid.UUID) (string, bool) {
	t.Helper()
	var (
		code    string
		unknown bool
	)
	if err := b.pool.QueryRow(b.ctx, `SELECT error_code, outcome_unknown FROM outbox.dead_letters WHERE outbox_id = $1`, id).
		Scan(&code, &unknown); err != nil {
		t.Fatalf("dead letter of %s: %v", id, err)
	}
	return code, unknown
}

// TestMaxAttemptsAfterATimeoutIsOutcomeUnknown: attempt 1 timed out (the
// rail may have paid), attempt 2 was answered 503, attempt 3 too and used
// the last of the budget. The dead letter is outcome unknown though its
// last attempt proves the rail did nothing with that one: operators refund
// by hand the dead letters that are not (docs/operations.md), and this one
// the rail may have paid.
func TestMaxAttemptsAfterATimeoutIsOutcomeUnknown(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	id := b.enqueue(t, "p1", "k1")
	b.record(t, timedOut(t, b.claimOne(t, "r1", longLease)))
	b.record(t, recordOutcome(t, b.claimOne(t, "r1", longLease), "r1", store.Retryable))
	last := recordOutcome(t, b.claimOne(t, "r1", longLease), "r1", store.Failed)
	last.ErrorCode, last.ErrorMessage = "MAX_ATTEMPTS_EXCEEDED", "attempt 3 of 3 failed with RAIL_UNAVAILABLE: try later"
	b.record(t, last)
	if code, unknown := b.deadUnknown(t, id); code != "MAX_ATTEMPTS_EXCEEDED" || !unknown {
		t.Errorf("dead letter %s, outcome unknown %v; want MAX_ATTEMPTS_EXCEEDED, outcome unknown: attempt 1 timed out", code, unknown)
	}
	b.verifyOK(t)
}

// TestTerminalFailureAfterAZombieRequeueIsOutcomeUnknown: the relayer of
// attempt 1 died with the request perhaps sent; the reaper requeued the
// instruction and attempt 2 was rejected. Nobody knows what became of
// attempt 1, so the dead letter is outcome unknown.
func TestTerminalFailureAfterAZombieRequeueIsOutcomeUnknown(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	id := b.enqueue(t, "p1", "k1")
	b.reap(t, b.claimOne(t, "dead", shortLease))
	b.record(t, recordOutcome(t, b.claimOne(t, "r1", longLease), "r1", store.Failed))
	if code, unknown := b.deadUnknown(t, id); code != "RAIL_REJECTED" || !unknown {
		t.Errorf("dead letter %s, outcome unknown %v; want RAIL_REJECTED, outcome unknown: attempt 1's relayer died", code, unknown)
	}
	b.verifyOK(t)
}

// TestLateFailureOfAnAbandonedClaim: a late FAILED of the claim the reaper
// took back settles that claim (the rail answered), and withdraws its
// copy into a dead letter: outcome unknown only if an attempt before it
// was.
func TestLateFailureOfAnAbandonedClaim(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	settled := b.enqueue(t, "p1", "k1")
	c := b.claimOne(t, "slow", shortLease)
	b.reap(t, c)
	b.record(t, recordOutcome(t, c, "slow", store.Failed))
	if code, unknown := b.deadUnknown(t, settled); code != "RAIL_REJECTED" || unknown {
		t.Errorf("dead letter %s, outcome unknown %v; want RAIL_REJECTED, not outcome unknown: its one attempt was rejected", code, unknown)
	}

	earlier := b.enqueue(t, "p2", "k2")
	b.record(t, timedOut(t, b.claimOne(t, "r1", longLease)))
	c = b.claimOne(t, "slow", shortLease)
	b.reap(t, c)
	b.record(t, recordOutcome(t, c, "slow", store.Failed))
	if code, unknown := b.deadUnknown(t, earlier); code != "RAIL_REJECTED" || !unknown {
		t.Errorf("dead letter %s, outcome unknown %v; want RAIL_REJECTED, outcome unknown: attempt 1 timed out", code, unknown)
	}
	b.verifyOK(t)
}

// TestReplayCarriesOutcomeUnknown: a dead letter marked outcome unknown
// that an operator replays, and that fails again on an attempt the rail
// certainly did not act on, is outcome unknown still: the attempts before
// the replay are the same instruction's, under the same key. One that was
// not stays not.
func TestReplayCarriesOutcomeUnknown(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	unsure := b.enqueue(t, "p1", "k1")
	// Its last attempt timed out: outcome unknown by that attempt alone.
	last := timedOut(t, b.claimOne(t, "r1", longLease))
	last.State, last.ErrorCode = store.Failed, "MAX_ATTEMPTS_EXCEEDED"
	b.record(t, last)
	if _, unknown := b.deadUnknown(t, unsure); !unknown {
		t.Fatal("dead letter of a timed out last attempt is not outcome unknown")
	}
	b.replay(t, unsure)
	b.record(t, recordOutcome(t, b.claimOne(t, "r1", longLease), "r1", store.Failed))
	if code, unknown := b.deadUnknown(t, unsure); code != "RAIL_REJECTED" || !unknown {
		t.Errorf("replayed dead letter %s, outcome unknown %v; want RAIL_REJECTED, outcome unknown: an attempt before the replay timed out", code, unknown)
	}

	sure := b.enqueue(t, "p2", "k2")
	b.record(t, recordOutcome(t, b.claimOne(t, "r1", longLease), "r1", store.Failed))
	b.replay(t, sure)
	b.record(t, recordOutcome(t, b.claimOne(t, "r1", longLease), "r1", store.Failed))
	if code, unknown := b.deadUnknown(t, sure); code != "RAIL_REJECTED" || unknown {
		t.Errorf("replayed dead letter %s, outcome unknown %v; want RAIL_REJECTED, not outcome unknown", code, unknown)
	}
	b.verifyOK(t)
}

// TestQueuedShowsOutcomeUnknown: the console lists, beside the cancel
// button, whether an earlier attempt of a pending or in-flight instruction
// may have reached the rail (a timeout, a reaped claim): cancelling such
// an instruction does not undo a payment the rail may have made.
func TestQueuedShowsOutcomeUnknown(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	retried := b.enqueue(t, "p1", "k1")
	o := timedOut(t, b.claimOne(t, "r1", longLease))
	o.RetryDelay = time.Hour // not due: the next claim takes p2
	b.record(t, o)
	reaped := b.enqueue(t, "p2", "k2")
	b.reap(t, b.claimOne(t, "dead", shortLease))
	fresh := b.enqueue(t, "p3", "k3")
	want := map[uuid.UUID]bool{retried: true, reaped: true, fresh: false}
	items, err := b.st.ListQueued(b.ctx, b.pool, store.QueuedFilter{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(items) != len(want) {
		t.Fatalf("%d pending, want %d", len(items), len(want))
	}
	for _, q := range items {
		if q.OutcomeUnknown != want[q.OutboxID] {
			t.Errorf("pending %s (%s): outcome unknown %v, want %v", q.OutboxID, q.ParticipantID, q.OutcomeUnknown, want[q.OutboxID])
		}
	}
	c := b.claimOne(t, "r1", longLease)
	items, err = b.st.ListQueued(b.ctx, b.pool, store.QueuedFilter{InFlight: true, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(items) != 1 || items[0].OutboxID != c.OutboxID || items[0].OutcomeUnknown != want[c.OutboxID] {
		t.Errorf("in flight %+v, want %s with outcome unknown %v", items, c.OutboxID, want[c.OutboxID])
	}
}
