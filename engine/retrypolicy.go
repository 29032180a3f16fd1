package engine

import (
	"fmt"
	"time"

	"github.com/gofrs/uuid/v5"

	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/rails"
)

// The retry policy: what an attempt's decision means for the instruction.
// Which attempts count against the budget, how long a retry waits
// (Backoff, or the rail's Retry-After when longer) and when the budget is
// spent. How the budget is kept in the tables is the store's (budget.go).

// countsAgainstBudget: an attempt that never reached the rail for reasons of
// ours (open breaker, released, rail not loaded), or whose call our own
// stop cut off, does not use up retries: a few rolling restarts during a
// slow rail must not make a dead letter.
func countsAgainstBudget(code rails.ErrorCode) bool {
	switch code {
	case rails.CodeCircuitOpen, rails.CodeReleased, rails.CodeRailNotConfigured, rails.CodeCutOffAtStop:
		return false
	}
	return true
}

// RailCalled reports whether the attempt went to the rail's transport:
// false when it never reached it for reasons of ours (open breaker,
// released, rail not loaded) or failed validation before the call. Its
// LatencyMS, whole milliseconds and 0 for a call under 1 ms, is the
// call's duration only when this is true.
func (r Recorded) RailCalled() bool {
	code := rails.ErrorCode(r.ErrorCode)
	return code == rails.CodeCutOffAtStop || countsAgainstBudget(code) && code != rails.CodeValidationFailed
}

// outcomeUnknown: the request may have reached the rail and been acted on,
// but we cannot know (no answer in time, a broken exchange, a server error
// such as a gateway timeout, an answer we cannot read). Such an attempt
// that ends an instruction makes a dead letter marked outcome unknown; its
// replay reuses the idempotency key. Operators replay the other dead
// letters as ones the rail certainly did not act on, so a code belongs
// here unless it proves the rail did nothing.
func outcomeUnknown(code rails.ErrorCode) bool {
	switch code {
	case rails.CodeRailTimeout, rails.CodeRailTransport, rails.CodeRailUpstreamError, rails.CodeUnknownRailCode,
		rails.CodeCutOffAtStop:
		return true
	}
	return false
}

// outcome turns a decision into what is recorded: backoff for retries,
// MAX_ATTEMPTS_EXCEEDED on the last allowed attempt.
func (r *Relayer) outcome(c store.Claimed, d rails.Decision, latency time.Duration) store.Outcome {
	id, _ := uuid.NewV7()
	o := store.Outcome{
		Identity: c.Identity, AttemptID: id, ClaimAttemptID: c.AttemptID, AttemptNo: c.AttemptNo,
		RelayerID: r.cfg.RelayerID, ClaimedAt: c.ClaimedAt,
		RailReference: rails.CleanText(d.Reference, maxRailTextLength), RailCode: rails.CleanText(d.RailCode, maxRailTextLength),
		ErrorCode:    string(d.ErrorCode),
		ErrorMessage: sanitize(d.Message, r.cfg.MaxErrorLength), LatencyMS: int(latency.Milliseconds()),
		CountAttempt:   countsAgainstBudget(d.ErrorCode),
		OutcomeUnknown: outcomeUnknown(d.ErrorCode),
	}
	if d.Field != "" {
		o.ErrorMessage = sanitize(fmt.Sprintf("field %s: %s", d.Field, d.Message), r.cfg.MaxErrorLength)
	}
	switch d.Outcome {
	case rails.Dispatched:
		o.State, o.ErrorMessage = store.Dispatched, ""
	case rails.Failed:
		o.State = store.Failed
	default:
		o.State = store.Retryable
		switch {
		case o.CountAttempt && store.LastAttempt(c.AttemptNo, r.cfg.MaxAttempts):
			o.State, o.ErrorCode = store.Failed, string(rails.CodeMaxAttemptsExceeded)
			o.ErrorMessage = sanitize(fmt.Sprintf("attempt %d of %d failed with %s: %s", c.AttemptNo, r.cfg.MaxAttempts, d.ErrorCode, d.Message), r.cfg.MaxErrorLength)
		case o.CountAttempt:
			r.rndMu.Lock()
			o.RetryDelay = r.backoff.Delay(c.AttemptNo, r.rnd)
			r.rndMu.Unlock()
		case d.ErrorCode == rails.CodeReleased:
			o.RetryDelay = 0
		case d.ErrorCode == rails.CodeCutOffAtStop:
			o.RetryDelay = cutOffDelay(c, latency)
		default:
			o.RetryDelay = time.Second
		}
		if d.RetryAfter > o.RetryDelay {
			o.RetryDelay = d.RetryAfter
		}
		if o.State == store.Retryable && d.ErrorCode != rails.CodeReleased {
			// A release is no attempt (the rail was not called): it is
			// handed back due at once whatever the floor.
			o.RetryDelay = max(o.RetryDelay, r.cfg.MinRetryDelay)
		}
	}
	return o
}

// cutOffDelay is how long an instruction whose call a stop cut off waits
// in pending: until the cut-off claim's lease has ended, the time the rail
// may still act on that call, as the reaper would have waited. The lease's
// length is the database's (lease_until - claimed_at), and the call's
// latency stands for the time since the claim: the call began after the
// claim's transaction and the outcome's write begins after the call, so by
// the database's clock the write's now() + this delay is never before
// lease_until.
func cutOffDelay(c store.Claimed, latency time.Duration) time.Duration {
	return max(c.LeaseUntil.Sub(c.ClaimedAt)-latency, 0)
}

// sanitize makes an error message storable: secrets stripped, text
// cleaned, truncated to max bytes.
func sanitize(msg string, max int) string { return rails.CleanText(rails.RedactSecrets(msg), max) }
