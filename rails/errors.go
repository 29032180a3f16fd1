package rails

import "errors"

// ErrorCode is a stable code of the error taxonomy. It is stored in attempt
// rows and used as a metric label, so values never change once released.
type ErrorCode string

// The error taxonomy.
const (
	// CodeValidationFailed: the instruction failed validation (terminal; the
	// rail is never called).
	CodeValidationFailed ErrorCode = "VALIDATION_FAILED"
	// CodeRailRejected: the rail answered with a terminal rejection.
	CodeRailRejected ErrorCode = "RAIL_REJECTED"
	// CodeRailUnavailable: the rail certainly did not act on the request:
	// it could not be reached before anything was sent (connection refused,
	// DNS failure), or it answered with a refusal that comes before any
	// processing (HTTP 503, 401, 403). A dead letter with this code is not
	// marked outcome unknown, so nothing whose effect is unsure may map to
	// it; see CodeRailUpstreamError.
	CodeRailUnavailable ErrorCode = "RAIL_UNAVAILABLE"
	// CodeRailUpstreamError: the rail answered with a server-side error
	// that does not say whether the request was acted on (HTTP 500, or a
	// gateway's 502/504 after its upstream may have received the payment).
	// Retryable with the same idempotency key, a breaker failure, and a
	// dead letter with this code is marked outcome unknown.
	CodeRailUpstreamError ErrorCode = "RAIL_UPSTREAM_ERROR"
	// CodeRailTimeout: no answer within the hard timeout. The rail may have
	// acted, so the retry carries the same idempotency key.
	CodeRailTimeout ErrorCode = "RAIL_TIMEOUT"
	// CodeRailTransport: the request may have reached the rail but the
	// exchange broke (connection reset, malformed answer). Treated like a
	// timeout: retried with the same idempotency key.
	CodeRailTransport ErrorCode = "RAIL_TRANSPORT_ERROR"
	// CodeRateLimited: the rail asked us to slow down (retryable).
	CodeRateLimited ErrorCode = "RAIL_RATE_LIMITED"
	// CodeCircuitOpen: the rail's circuit breaker refused the call.
	CodeCircuitOpen ErrorCode = "CIRCUIT_OPEN"
	// CodeMaxAttemptsExceeded: a retryable failure on the last allowed attempt.
	CodeMaxAttemptsExceeded ErrorCode = "MAX_ATTEMPTS_EXCEEDED"
	// CodeUnknownRailCode: the rail answered with a code its table does not
	// know. Safe default: retryable (the same key protects the payment) and
	// flagged so an operator extends the table. It counts as a breaker
	// failure, so a misconfigured endpoint opens the breaker.
	CodeUnknownRailCode ErrorCode = "UNKNOWN_RAIL_CODE"
	// CodeZombieRequeue: the relayer holding the instruction stopped
	// renewing its lease and the reaper put it back.
	CodeZombieRequeue ErrorCode = "ZOMBIE_REQUEUE"
	// CodeRailNotConfigured: no rail of this type is loaded by the relayer.
	CodeRailNotConfigured ErrorCode = "RAIL_NOT_CONFIGURED"
	// CodeReleased: claimed but handed back without calling the rail (the
	// relayer is stopping, or the lease would end before the rail's
	// timeout). Does not use up the retry budget.
	CodeReleased ErrorCode = "RELEASED"
	// CodeCutOffAtStop: a rail call in progress was cancelled by the
	// stopping relayer's hard deadline (Stop's context). The rail may have
	// acted (outcome unknown): the retry carries the same idempotency key,
	// and waits until the cut-off claim's lease has ended, as long as the
	// rail may still be acting on the call. A graceful stop is no fault of
	// the instruction: it uses up neither the retry budget nor the
	// reaper's zombie limit.
	CodeCutOffAtStop ErrorCode = "CUT_OFF_AT_STOP"
)

// ErrUnavailable is returned (wrapped) by transports when the rail could not
// be reached before the request was sent; it classifies as RAIL_UNAVAILABLE.
var ErrUnavailable = errors.New("rail unavailable")

// ErrCircuitOpen is returned when a rail's circuit breaker refuses a call.
var ErrCircuitOpen = errors.New("circuit breaker open")
