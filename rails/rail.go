// Package rails is the edge where money leaves the system: the rail
// contract ([Transport], [Result]), the error taxonomy that turns a rail's
// explicit answer into an outcome, circuit breakers and concurrency caps
// ([Set]), the sandbox and webhook transports, and the relay configuration
// file.
//
// Nothing in this package decides anything by matching error text: a rail
// answers with an explicit code, and a per-rail [CodeTable] maps that code to
// an [Outcome] and an [ErrorCode].
package rails

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"

	"github.com/ledgerline/outbox/payment"
)

// Outcome is how a dispatch attempt ended.
type Outcome string

// Outcomes of a dispatch attempt.
const (
	// Dispatched: the rail accepted the instruction.
	Dispatched Outcome = "DISPATCHED"
	// Retryable: try again later with the same idempotency key.
	Retryable Outcome = "RETRYABLE"
	// Failed: terminal; the instruction goes to the dead letters.
	Failed Outcome = "FAILED"
)

// Result is a rail's answer to a dispatch: an explicit code, the rail's
// reference for the payment and optional detail.
type Result struct {
	// Code is the rail's explicit answer code, looked up in the rail's
	// [CodeTable]. Every answer has one.
	Code string
	// Reference is the rail's identifier for the payment, when accepted.
	Reference string
	// Message is the rail's human-readable detail, stored (truncated,
	// sanitized) in the archive; never used to decide anything.
	Message string
	// RetryAfter is the rail's requested delay before a retry, if any.
	RetryAfter time.Duration
}

// MaxRetryAfter caps the retry delay a rail asks for (Result.RetryAfter),
// whatever its transport: a misconfigured or hostile rail must not park
// instructions, and with ordering their participants' later ones, for
// days. [CodeTable.Decide] applies it, and a negative delay counts as none.
const MaxRetryAfter = time.Hour

// Rail is a configured payment rail: what the relayer dispatches to.
type Rail interface {
	// Type is the rail type instructions carry (e.g. "ach", "sandbox").
	Type() string
	// Validate checks an instruction for this rail; a failure is terminal
	// and the rail is never called.
	Validate(payment.Instruction) error
	// Dispatch sends the instruction, carrying its idempotency key. A
	// non-nil error means no explicit answer was obtained (timeout, refused
	// connection, broken exchange); otherwise Result.Code is the answer.
	Dispatch(ctx context.Context, ins payment.Instruction) (Result, error)
}

// CodeRule is what one rail code means.
type CodeRule struct {
	Outcome Outcome   `json:"outcome"`
	Error   ErrorCode `json:"error,omitempty"` // empty for Dispatched
}

// CodeTable maps a rail's explicit codes to outcomes. Codes not in the table
// are retryable with [CodeUnknownRailCode] (see [CodeTable.Decide]).
type CodeTable map[string]CodeRule

// Decision is the classified result of one dispatch attempt: what the
// relayer records and how it proceeds.
type Decision struct {
	Outcome    Outcome
	ErrorCode  ErrorCode // empty when Dispatched
	RailCode   string    // the rail's own code, when it answered
	Reference  string
	Message    string
	RetryAfter time.Duration
	// Field is the invalid field when ErrorCode is VALIDATION_FAILED.
	Field string
	// RailCalled is false when the rail was never reached (validation,
	// open breaker, refused connection): such an attempt is not counted
	// against the instruction's retry budget for breaker refusals.
	RailCalled bool
	// Answered is true when the rail gave an explicit answer (the
	// transport returned no error), whatever its code means: the call is
	// over on the rail's side. A relayer whose stop cut the call short
	// records such an answer as it is, not as an outcome unknown.
	Answered bool
}

// Decide classifies a dispatch answer. Errors are classified by type, never
// by text: a context deadline is RAIL_TIMEOUT, [ErrUnavailable] or a refused
// connection is RAIL_UNAVAILABLE, [ErrCircuitOpen] is CIRCUIT_OPEN, a
// [*payment.ValidationError] is terminal VALIDATION_FAILED, and anything else is an
// ambiguous RAIL_TRANSPORT_ERROR (retryable: the rail may have acted, and the
// retry carries the same idempotency key). An answer code missing from the
// table is retryable UNKNOWN_RAIL_CODE. The answer's RetryAfter is kept
// within [0, MaxRetryAfter].
func (t CodeTable) Decide(res Result, err error) Decision {
	d := Decision{RailCode: res.Code, Reference: res.Reference, Message: res.Message, RetryAfter: min(max(res.RetryAfter, 0), MaxRetryAfter), RailCalled: true}
	if err != nil {
		d.Outcome = Retryable
		d.Message = err.Error()
		var verr *payment.ValidationError
		switch {
		case errors.As(err, &verr):
			d.Outcome, d.ErrorCode, d.Field, d.RailCalled = Failed, CodeValidationFailed, verr.Field, false
		case errors.Is(err, ErrCircuitOpen):
			d.ErrorCode, d.RailCalled = CodeCircuitOpen, false
		case errors.Is(err, context.DeadlineExceeded):
			d.ErrorCode = CodeRailTimeout
		case notSent(err):
			d.ErrorCode, d.RailCalled = CodeRailUnavailable, false
		default:
			d.ErrorCode = CodeRailTransport
		}
		return d
	}
	d.Answered = true
	rule, ok := t[res.Code]
	if !ok {
		d.Outcome, d.ErrorCode = Retryable, CodeUnknownRailCode
		if d.Message == "" {
			d.Message = fmt.Sprintf("rail answered with unknown code %q", res.Code)
		}
		return d
	}
	d.Outcome, d.ErrorCode = rule.Outcome, rule.Error
	if d.Outcome == Dispatched {
		d.ErrorCode = ""
	}
	return d
}

// errRequestWritten marks a transport error after which a refused or failed
// dial no longer proves that nothing was sent: some of the request was
// written (on a connection that then broke) before the transport retried
// on a new one, which was refused. See [Webhook.Send].
var errRequestWritten = errors.New("the request had already been written on an earlier connection")

// notSent reports whether err proves the request never left: the rail said
// it is unavailable, or the connection was refused or could not be dialled,
// and the transport did not mark the error with errRequestWritten.
func notSent(err error) bool {
	if errors.Is(err, errRequestWritten) {
		return false
	}
	if errors.Is(err, ErrUnavailable) || errors.Is(err, syscall.ECONNREFUSED) {
		return true
	}
	var opErr *net.OpError
	if errors.As(err, &opErr) && opErr.Op == "dial" {
		return true
	}
	var dnsErr *net.DNSError
	return errors.As(err, &dnsErr)
}

// breakerFailure reports whether a decision says the rail itself is in
// trouble (as opposed to rejecting one instruction): these trip breakers.
// UNKNOWN_RAIL_CODE counts: a misconfigured endpoint (a wrong path answering
// 404 to everything) must open the breaker, so instructions wait for the fix
// instead of every one burning its retry budget into the dead letters; a
// healthy rail does not answer with codes its table lacks.
func (d Decision) breakerFailure() bool {
	if d.Outcome != Retryable {
		return false
	}
	switch d.ErrorCode {
	case CodeRailUnavailable, CodeRailTimeout, CodeRailTransport, CodeRailUpstreamError, CodeUnknownRailCode:
		return true
	}
	return false
}
