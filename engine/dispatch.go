package engine

import (
	"fmt"
	"runtime/debug"
	"time"

	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/rails"
)

// dispatch sends one claimed instruction and queues its outcome. The
// instruction's slot goes back when the recorder has recorded the outcome;
// here only when there is nothing to record. handoffOf and started say
// which write's hand-off claimed it (0: a claim) and when its dispatch
// started, for the recorder (see recorder.hold).
//
// Each dispatch runs on a goroutine of its own, whose stack is copied to
// a larger one whenever the frames down to the rail's transport outgrow
// it: so the frames on that path stay small. Building the outcome and the
// cold paths' log lines are in functions of their own, off it (a frame 16
// bytes wider below this one cost the drain 3 µs of processor time a
// message, in stack copies).
func (r *run) dispatch(c store.Claimed, callDeadline time.Time, handoffOf uint64, started time.Time) {
	defer r.dispatches.Done()
	defer r.inFlight.Add(-1)

	var d rails.Decision
	latency := r.send(&c, &d, callDeadline)
	r.railReturned(c.RailType)
	r.queueOutcome(&c, &d, latency, handoffOf, started)
}

// send decides c's outcome into d: the rail's answer, or a release or a
// failure without calling it, or, for a call the hard deadline cut off
// without an answer, a cut-off (cutOff).
func (r *run) send(c *store.Claimed, d *rails.Decision, callDeadline time.Time) time.Duration {
	ins, payloadErr := railInstruction(c)
	switch {
	case payloadErr != nil:
		*d = payloadFailure(payloadErr)
	case r.isStopping():
		*d = released("released: relayer stopping")
	default:
		start := time.Now()
		*d = r.execute(c, &ins, callDeadline)
		latency := time.Since(start)
		// An explicit answer stands even when the stop's deadline passed
		// as it arrived (a status read before the cut, its body after):
		// the rail is done with the call, and its code says what it did.
		if r.dispatchCtx.Err() != nil && d.RailCalled && !d.Answered && d.Outcome == rails.Retryable {
			r.cutOff(c, d)
		}
		return latency
	}
	return 0
}

// cutOff turns d, the decision of a call the stop's hard deadline cut off
// without an answer, into a CUT_OFF_AT_STOP retry (see outcome: it waits
// until the lease ends, and counts neither as an attempt nor as a zombie).
// The stopping relayer records it itself: left in flight, the claim would
// be requeued by the reaper as a zombie, and a few stops during a slow
// rail would make a ZOMBIE_LIMIT dead letter of it although no relayer
// died. If recording fails (the database is gone too), the claim stays in
// flight for the reaper, as before.
func (r *run) cutOff(c *store.Claimed, d *rails.Decision) {
	r.log.Warn("rail call cut off at stop deadline; recorded as outcome unknown, retried after its lease", "outbox_id", c.OutboxID,
		"instruction_id", c.InstructionID, "participant", c.ParticipantID, "attempt_no", c.AttemptNo, "lease_until", c.LeaseUntil,
		"error_code", d.ErrorCode, "err", d.Message)
	*d = rails.Decision{Outcome: rails.Retryable, ErrorCode: rails.CodeCutOffAtStop, RailCalled: true,
		Message: fmt.Sprintf("rail call cut off by the relayer's stop deadline (%s: %s): outcome unknown; not retried before its lease ends",
			d.ErrorCode, d.Message)}
}

// released is the decision for an instruction handed back unsent.
func released(msg string) rails.Decision {
	return rails.Decision{Outcome: rails.Retryable, ErrorCode: rails.CodeReleased, Message: msg}
}

// queueOutcome hands c's outcome to the recorder.
func (r *run) queueOutcome(c *store.Claimed, d *rails.Decision, latency time.Duration, handoffOf uint64, started time.Time) {
	po := pendingOutcome{Outcome: r.outcome(*c, *d, latency), enqueuedAt: c.EnqueuedAt,
		handoffOf: handoffOf, took: time.Since(started)}
	if h := r.testHooks.outcome; h != nil {
		h(&po.Outcome)
	}
	if r.rec.submit(po) {
		return
	}
	// Stop stopped recording before this dispatch returned (it ignored the
	// hard deadline): the lease stands and the reaper requeues it.
	r.leaveInFlight(c, "outcome arrived after recording stopped; left in flight for the reaper", "state", po.State)
}

// leaveInFlight gives back c's slot without an outcome: its lease stands,
// and the reaper requeues it.
func (r *run) leaveInFlight(c *store.Claimed, msg string, more ...any) {
	r.slots.Release(1)
	r.stats.leftInFlight.Add(1)
	r.log.Warn(msg, append([]any{"outbox_id", c.OutboxID, "instruction_id", c.InstructionID, "participant", c.ParticipantID,
		"attempt_no", c.AttemptNo, "lease_until", c.LeaseUntil}, more...)...)
}

// execute calls the rail, turning a panic in a rail (a transport registered
// by the embedding program) into a retryable transport error: whether the
// request left is unknown, so the retry carries the same idempotency key.
// A panic must not take the relayer, and every other instruction it holds,
// down with it. It takes pointers: every dispatch runs on a goroutine of
// its own, whose stack grows (a copy) once the frames down to the rail's
// transport outgrow it, and the claim and the instruction by value were
// 900 bytes of those frames (measured: a 16-byte wider frame below this
// one cost the drain 3 µs of processor time a message).
func (r *run) execute(c *store.Claimed, ins *payment.Instruction, callDeadline time.Time) (d rails.Decision) {
	defer func() {
		if p := recover(); p != nil {
			r.log.Error("rail panicked", "rail", c.RailType, "outbox_id", c.OutboxID, "panic", p, "stack", string(debug.Stack()))
			d = rails.Decision{Outcome: rails.Retryable, ErrorCode: rails.CodeRailTransport, RailCalled: true,
				Message: fmt.Sprintf("rail %s panicked: %v", c.RailType, p)}
		}
	}()
	return r.cfg.Rails.ExecuteWithin(r.dispatchCtx, r.slotWait, *ins, callDeadline)
}

// payloadFailure is the decision for an instruction whose stored payload
// cannot be decoded (it was altered outside the producer): nothing any
// rail could be sent, and retrying cannot help.
func payloadFailure(err error) rails.Decision {
	return rails.Decision{Outcome: rails.Failed, ErrorCode: rails.CodeValidationFailed, Field: payment.FieldPayload,
		Message: "stored payload cannot be decoded: " + err.Error()}
}

// railInstruction is the rail's view of a claimed instruction, its
// payload decoded.
func railInstruction(c *store.Claimed) (payment.Instruction, error) {
	ins := payment.Instruction{
		OutboxID: c.OutboxID, InstructionID: c.InstructionID, ParticipantID: c.ParticipantID,
		SequenceID: c.SequenceID, IdempotencyKey: c.IdempotencyKey, RailType: c.RailType,
		TenantID: c.TenantID, CorrelationID: c.CorrelationID, AttemptNo: c.AttemptNo, AttemptID: c.AttemptID,
	}
	p, err := payment.DecodePayload(c.Payload)
	if err != nil {
		return ins, fmt.Errorf("outbox %s: decode payload: %w", c.OutboxID, err)
	}
	ins.Metadata, ins.Payment = p.Metadata, p.Payment(false)
	return ins, nil
}
