package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/gofrs/uuid/v5"

	"github.com/ledgerline/outbox/internal/store"
)

// lostClaim is what the claim loop knows of its claims' replies: a claim
// that failed without the server's answer (replyLost: a connection that
// broke, a deadline) may have committed, its rows in flight under this
// relayer's id with a lease and no dispatch. Left so, they waited for the
// lease to end and for the reaper, which counted each a zombie, and with
// ordering on their participants' queues waited behind them. The next
// claim of the loop first looks for them (store.LostClaims) and hands
// them back RELEASED, due again at once (releaseLostClaim). The look is
// made only after such a failure; a claim that goes through costs only
// heard's two comparisons.
type lostClaim struct {
	// after is the latest claimed_at of this run's claims that returned
	// work: the lost claim began after it (the loop claims one claim at a
	// time), and every row of this run's claims up to it is one the
	// relayer knows of. Zero until a claim of this run returned work.
	after time.Time
	// claim is set when a claim failed without the server's answer, and
	// known holds the attempt ids that the same call claimed before it
	// and the relayer dispatches (a half-open rail's probe).
	claim bool
	known []uuid.UUID
	// released are the RELEASED outcomes of a lost claim's rows whose
	// write has not gone through yet: written before the next claim.
	released []pendingOutcome
}

// heard notes a claim that returned work (claimed is not empty; the rows
// of one claim statement share their claimed_at, and a call's second
// statement, after a probe's, comes last).
func (l *lostClaim) heard(claimed []store.Claimed) {
	for _, t := range [...]time.Time{claimed[0].ClaimedAt, claimed[len(claimed)-1].ClaimedAt} {
		if t.After(l.after) {
			l.after = t
		}
	}
}

// failed notes a claim statement's error: one the server did not send
// (replyLost) leaves the claim's commit unknown. claimed are what the
// same call claimed before it, which the relayer dispatches.
func (l *lostClaim) failed(err error, claimed []store.Claimed) {
	if err == nil || !replyLost(err) {
		return
	}
	l.claim = true
	for _, c := range claimed {
		l.known = append(l.known, c.AttemptID)
	}
}

// releasedLostClaim is the message of a lost claim's RELEASED attempts.
const releasedLostClaim = "released without calling the rail: claimed by a claim whose commit reply was lost"

// releaseLostClaim looks, after a claim whose reply was lost, for what it
// claimed (store.LostClaims: this relayer's rows of the one claim
// transaction after the last claim it heard of, none of a hand-off's,
// and none while another run of its relayer id is registered with claims
// after that one: registration.go) and records them RELEASED: no rail call, no attempt counted, due again
// at once, and with ordering on still their participants' heads. A row
// the reaper requeued meanwhile gets its RELEASED row as a late outcome
// (the copy stays pending); a claim that did not commit left nothing to
// find. If the look or the write fails, the error is the claim loop's,
// and they are tried again before its next claim. Before this run heard
// of any claim there is no bound that keeps an earlier run's rows out
// (the same relayer id, its rows left in flight for the reaper): then
// the look is not made, and what the lost claim took, if it committed,
// waits for the reaper as before. So does what a claim took that
// committed only after the look (a server that went on while the
// relayer's deadline passed), and what one took that was lost as the
// relayer stopped (no claim follows). A cold path.
//
//go:noinline
func (r *run) releaseLostClaim(ctx context.Context) error {
	l := &r.lost
	if l.claim && l.after.IsZero() {
		l.claim, l.known = false, nil
		r.log.Warn("a claim's reply was lost before this run heard of any claim; what it claimed, if it committed, stays in flight until the reaper requeues it")
	}
	if l.claim {
		lookCtx, cancel := r.bounded(ctx)
		lost, err := r.store.LostClaims(lookCtx, r.pool, r.cfg.RelayerID, r.reg.id, l.after, l.known)
		cancel()
		if err != nil {
			return fmt.Errorf("look for the claims of a claim whose reply was lost: %w", err)
		}
		l.claim, l.known = false, nil
		for _, c := range lost {
			r.log.Warn("handing back a claim unsent", "outbox_id", c.OutboxID, "instruction_id", c.InstructionID,
				"participant", c.ParticipantID, "attempt_no", c.AttemptNo, "lease_until", c.LeaseUntil, "why", releasedLostClaim)
			l.released = append(l.released, pendingOutcome{Outcome: r.outcome(c, released(releasedLostClaim), 0), enqueuedAt: c.EnqueuedAt})
		}
	}
	if len(l.released) == 0 {
		return nil
	}
	outcomes := make([]store.Outcome, len(l.released))
	for i, p := range l.released {
		outcomes[i] = p.Outcome
	}
	// No hand-off: a release frees no participant. Sent again after a
	// failure, the same outcomes are archived once (Record is idempotent).
	writeCtx, cancel := r.bounded(ctx)
	recorded, _, err := r.store.Record(writeCtx, r.pool, outcomes, store.HandoffParams{RelayerID: r.cfg.RelayerID})
	cancel()
	if recorded == nil {
		return fmt.Errorf("record the release of the claims of a claim whose reply was lost: %w", err)
	}
	r.rec.afterFlush(l.released, recorded, 0)
	l.released = nil
	return nil
}
