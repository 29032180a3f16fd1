package rails

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync/atomic"
	"time"

	"github.com/sony/gobreaker/v2"
	"golang.org/x/sync/semaphore"

	"github.com/ledgerline/outbox/payment"
)

// Default per-rail limits.
const (
	DefaultMaxConcurrency = 32
	DefaultTimeout        = 30 * time.Second
)

// Transport carries an instruction to an external system and returns its
// explicit answer. One transport (sandbox, webhook, a Go implementation of
// the embedding program) can serve many rail types.
//
// The answer's Result.Code is looked up in the rail's [CodeTable]. A
// non-nil error means there is no answer, and is classified by type (see
// [CodeTable.Decide]): wrap [ErrUnavailable] only when nothing can have
// reached the rail (RAIL_UNAVAILABLE, not outcome unknown; RELEASED, no
// attempt used up, when the caller cancelled the call); any other
// error is a retryable RAIL_TRANSPORT_ERROR (or RAIL_TIMEOUT for ctx's
// deadline) that may have paid, retried under the same idempotency key.
//
// Send must return promptly once ctx is done (its deadline is the rail's
// timeout; it is also cancelled when the relayer stops), with ctx's error
// or one wrapping it. The [Set] never abandons a running Send: a call left
// running after its attempt was recorded could still pay after the
// instruction was retried or dead-lettered. So a Send that ignores ctx (a
// blocking client call that takes no context) holds its dispatch, and its
// rail slot, for as long as it runs; its claim's lease (the timeout plus a
// grace) may expire meanwhile, and the reaper then requeues the
// instruction while the call is still under way (its outcome is archived
// as late). [Set.Overruns] counts such calls.
//
// An error that is (or wraps) a [*payment.ValidationError] says the
// transport refused the instruction before sending anything: it is
// recorded as terminal VALIDATION_FAILED that never reached the rail, so a
// dead letter from it is not marked outcome unknown. A transport must not
// return one once any of the request may have left.
type Transport interface {
	Send(ctx context.Context, ins payment.Instruction) (Result, error)
}

// OverrunGrace is how long after its context's deadline a Send may return
// before [Set.Overruns] counts it as ignoring its context.
const OverrunGrace = 250 * time.Millisecond

// CodeProvider is implemented by transports that come with their own code
// table (the sandbox and webhook transports do).
type CodeProvider interface {
	Codes() CodeTable
}

// BreakerOptions configure a rail's circuit breaker.
type BreakerOptions struct {
	// Disabled turns the breaker off for this rail.
	Disabled bool `json:"disabled,omitempty"`
	// ConsecutiveFailures opens the breaker (default 5). Only failures that
	// say the rail is in trouble count: unavailable, timeout, broken
	// exchange, an answer code missing from the code table; rejections of a
	// single instruction do not, and neither does a call cut short because
	// the caller's context was cancelled (the relayer stopping). A call
	// cut short that way, or one whose transport refused the instruction
	// before sending it (a validation error), counts as no success either:
	// neither closes a half-open breaker.
	ConsecutiveFailures uint32 `json:"consecutive_failures,omitempty"`
	// OpenFor is how long the breaker stays open before a half-open probe
	// (default 30 s).
	OpenFor time.Duration `json:"open_for,omitempty"`
	// HalfOpenProbes is how many calls a half-open breaker lets through
	// (default 1).
	HalfOpenProbes uint32 `json:"half_open_probes,omitempty"`
}

// Options configure one rail: its type name, validator profile, transport,
// code table and limits.
type Options struct {
	Type      string
	Profile   payment.Profile
	Transport Transport
	// Codes overrides the transport's own code table.
	Codes CodeTable
	// MaxConcurrency caps concurrent dispatches to this rail (default 32).
	MaxConcurrency int
	// Timeout is the deadline of the context each dispatch's Send gets
	// (default 30 s). It bounds the dispatch only if the transport honours
	// its context, as [Transport] requires: the Set waits for Send to
	// return, and an answer that arrives after the deadline is classified
	// like any other (the rail did answer).
	Timeout time.Duration
	Breaker BreakerOptions
	// OnBreakerChange, if set, is called on every breaker state change.
	OnBreakerChange func(railType string, from, to BreakerState)
}

// BreakerState is a circuit breaker's state.
type BreakerState = gobreaker.State

// Breaker states.
const (
	BreakerClosed   = gobreaker.StateClosed
	BreakerHalfOpen = gobreaker.StateHalfOpen
	BreakerOpen     = gobreaker.StateOpen
)

// configured is a Rail built from Options.
type configured struct {
	opts    Options
	codes   CodeTable
	slots   *semaphore.Weighted
	breaker *gobreaker.CircuitBreaker[Decision]
	// maxProbes is the breaker's MaxRequests: how many calls it lets
	// through while half-open.
	maxProbes uint32
	// probes counts calls admitted while the breaker was half-open that
	// have not finished yet (from admission until the breaker has recorded
	// their result), so [Set.Claimable] does not offer the rail for more
	// probes than the breaker would let through.
	probes atomic.Int64
	// held counts probes claimed ([Set.ProbeClaimed]) whose Execute has
	// not begun yet, until heldUntil (monoNow's nanoseconds): they count
	// as probes in flight too, so the rail is not offered for another
	// probe between a probe's claim and its call.
	held, heldUntil atomic.Int64
	// overruns counts Sends that returned more than OverrunGrace after
	// their deadline.
	overruns atomic.Int64
}

func (c *configured) Type() string                           { return c.opts.Type }
func (c *configured) Validate(ins payment.Instruction) error { return c.opts.Profile.Validate(ins) }
func (c *configured) Dispatch(ctx context.Context, ins payment.Instruction) (Result, error) {
	return c.opts.Transport.Send(ctx, ins)
}

// errTrip marks a decision that counts as a breaker failure.
var errTrip = errors.New("rail failure")

// errCallerGone marks a call cut short because the caller's context was
// cancelled (the relayer's hard stop), not because of the rail: the
// breaker counts it neither as a failure nor as a success, so a stopping
// relayer neither trips the breaker nor closes it on an unfinished probe.
var errCallerGone = errors.New("dispatch cancelled by the caller")

// errNotCalled marks a call whose transport refused the instruction
// before sending anything (its own validation error): it says nothing
// about the rail, so the breaker counts it neither as a failure nor as a
// success. Counted a success, such a half-open probe closed the breaker
// and let a full batch through to a rail that was still down.
var errNotCalled = errors.New("the transport refused the instruction before sending it")

// Set is the collection of rails a relayer dispatches to. It applies, per
// rail: validation, the concurrency cap, the circuit breaker, the hard
// timeout and the code table. It is safe for concurrent use.
type Set struct {
	rails map[string]*configured
	types []string
}

// NewSet builds a Set. Every option needs a Type, a Profile and a Transport;
// a code table comes from Options.Codes or the transport's [CodeProvider].
func NewSet(options ...Options) (*Set, error) {
	s := &Set{rails: make(map[string]*configured)}
	for _, o := range options {
		if o.Type == "" || o.Profile == nil || o.Transport == nil {
			return nil, fmt.Errorf("rails: rail %q needs a type, a profile and a transport", o.Type)
		}
		if _, dup := s.rails[o.Type]; dup {
			return nil, fmt.Errorf("rails: rail type %q configured twice", o.Type)
		}
		codes := o.Codes
		if codes == nil {
			if cp, ok := o.Transport.(CodeProvider); ok {
				codes = cp.Codes()
			}
		}
		if codes == nil {
			return nil, fmt.Errorf("rails: rail %q has no code table", o.Type)
		}
		if o.MaxConcurrency <= 0 {
			o.MaxConcurrency = DefaultMaxConcurrency
		}
		if o.Timeout <= 0 {
			o.Timeout = DefaultTimeout
		}
		c := &configured{opts: o, codes: codes, slots: semaphore.NewWeighted(int64(o.MaxConcurrency))}
		if !o.Breaker.Disabled {
			c.breaker, c.maxProbes = newBreaker(o)
		}
		s.rails[o.Type] = c
		s.types = append(s.types, o.Type)
	}
	slices.Sort(s.types)
	return s, nil
}

// newBreaker builds a rail's breaker and returns it with its MaxRequests
// (calls let through while half-open).
func newBreaker(o Options) (*gobreaker.CircuitBreaker[Decision], uint32) {
	b := o.Breaker
	if b.ConsecutiveFailures == 0 {
		b.ConsecutiveFailures = 5
	}
	if b.OpenFor <= 0 {
		b.OpenFor = 30 * time.Second
	}
	if b.HalfOpenProbes == 0 {
		b.HalfOpenProbes = 1
	}
	st := gobreaker.Settings{
		Name:        o.Type,
		MaxRequests: b.HalfOpenProbes,
		Timeout:     b.OpenFor,
		ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= b.ConsecutiveFailures },
		// A half-open probe excluded this way also frees its slot, so the
		// next claim can probe again.
		IsExcluded: func(err error) bool { return errors.Is(err, errCallerGone) || errors.Is(err, errNotCalled) },
	}
	if o.OnBreakerChange != nil {
		st.OnStateChange = func(name string, from, to gobreaker.State) { o.OnBreakerChange(name, from, to) }
	}
	return gobreaker.NewCircuitBreaker[Decision](st), b.HalfOpenProbes
}

// Types returns the configured rail types, sorted.
func (s *Set) Types() []string { return slices.Clone(s.types) }

// Catalog returns the validation profiles of the configured rails, for
// producers that share the relay configuration.
func (s *Set) Catalog() payment.Catalog {
	c := make(payment.Catalog, len(s.rails))
	for t, r := range s.rails {
		c[t] = r.opts.Profile
	}
	return c
}

// Rail returns the configured rail of a type.
func (s *Set) Rail(railType string) (Rail, bool) {
	r, ok := s.rails[railType]
	return r, ok
}

// Timeout returns the dispatch timeout of a rail type (zero if unknown);
// see [Options].Timeout for what it bounds.
func (s *Set) Timeout(railType string) time.Duration {
	if r, ok := s.rails[railType]; ok {
		return r.opts.Timeout
	}
	return 0
}

// MaxConcurrency returns a rail type's concurrency cap ([Options].MaxConcurrency,
// its default applied; zero if unknown).
func (s *Set) MaxConcurrency(railType string) int {
	if r, ok := s.rails[railType]; ok {
		return r.opts.MaxConcurrency
	}
	return 0
}

// Overruns returns how many calls to a rail type's transport returned more
// than [OverrunGrace] after their context's deadline (zero if unknown): a
// transport that does not honour its context (see [Transport]), whose
// dispatches the rail's timeout does not bound.
func (s *Set) Overruns(railType string) int64 {
	if r, ok := s.rails[railType]; ok {
		return r.overruns.Load()
	}
	return 0
}

// State returns the breaker state of a rail (closed when it has none).
func (s *Set) State(railType string) BreakerState {
	if r, ok := s.rails[railType]; ok && r.breaker != nil {
		return r.breaker.State()
	}
	return BreakerClosed
}

// ProbesInFlight returns how many calls a rail's half-open breaker has
// let through that have not finished (zero if unknown or without a
// breaker). A half-open breaker with none waits for the rail's next
// instruction: the open period is over and nothing new is known of the
// rail until that probe.
func (s *Set) ProbesInFlight(railType string) int64 {
	if r, ok := s.rails[railType]; ok {
		return r.inFlightProbes()
	}
	return 0
}

// ProbeClaimed tells the Set that an instruction of a half-open rail was
// claimed as its probe: it counts as a probe in flight from now, not from
// its call, so [Set.Claimable] does not offer the rail for another probe
// while this one is validated or waits for its goroutine or a rail slot.
// Counted only from its call, a relayer draining another rail's backlog
// claimed more "probes" in between, which the breaker refused as
// CIRCUIT_OPEN (an attempt and an archive row each, for nothing). The
// hold passes to the first Execute of the rail that begins, or lapses
// after the rail's timeout (a claim that is never dispatched: its
// relayer stopped).
func (s *Set) ProbeClaimed(railType string) {
	if r, ok := s.rails[railType]; ok && r.breaker != nil {
		now := monoNow()
		r.heldUntil.Store(now + min(int64(r.opts.Timeout), math.MaxInt64-now))
		r.held.Add(1)
	}
}

// monoStart is monoNow's origin.
var monoStart = time.Now()

// monoNow is this process's monotonic clock, in nanoseconds since
// monoStart: a hold's end kept as wall-clock Unix nanoseconds moved with
// every step of the host's clock, and wrapped for a timeout reaching past
// 2262.
func monoNow() int64 { return int64(time.Since(monoStart)) }

// inFlightProbes counts the probes in flight: called, or claimed and
// held (see ProbeClaimed) within the hold's time.
func (r *configured) inFlightProbes() int64 {
	n := r.probes.Load()
	if held := r.held.Load(); held > 0 {
		if monoNow() < r.heldUntil.Load() {
			return n + held
		}
		r.held.CompareAndSwap(held, 0) // lapsed: never dispatched
	}
	return n
}

// takeHold moves a held probe (see ProbeClaimed) to the probes counted in
// flight, for an Execute of the rail that begins: it reports whether it
// did.
func (r *configured) takeHold() bool {
	for {
		held := r.held.Load()
		if held <= 0 {
			return false
		}
		if r.held.CompareAndSwap(held, held-1) {
			r.probes.Add(1)
			return true
		}
	}
}

// Claimable splits the rail types by breaker state: open rails are not
// claimed at all (their instructions stay pending and burn no attempt),
// half-open rails only while fewer probes are in flight than the breaker
// lets through (HalfOpenProbes; a probe the caller reports with
// [Set.ProbeClaimed] counts from its claim). Without that limit every claim pass would
// claim another "probe" while the first is still running, and the breaker
// would refuse each one (a DISPATCHING + CIRCUIT_OPEN pair in the archive).
func (s *Set) Claimable() (closed []string, halfOpen []string) {
	for _, t := range s.types {
		switch s.State(t) {
		case BreakerClosed:
			closed = append(closed, t)
		case BreakerHalfOpen:
			if r := s.rails[t]; r.inFlightProbes() < int64(r.maxProbes) {
				halfOpen = append(halfOpen, t)
			}
		}
	}
	return closed, halfOpen
}

// Execute validates ins for its rail, waits for a slot under the rail's
// concurrency cap, and dispatches it through the breaker with the rail's
// timeout as the deadline of the transport's context (which bounds the
// call only if the transport honours it; see [Transport]). It always
// returns a Decision; if ctx ends while waiting for a slot, or is
// cancelled during a call whose transport then says nothing was sent
// (RAIL_UNAVAILABLE), the decision is a retryable RELEASED that never
// reached the rail.
func (s *Set) Execute(ctx context.Context, ins payment.Instruction) Decision {
	return s.ExecuteBefore(ctx, ins, time.Time{})
}

// ExecuteBefore is Execute for a caller whose claim on ins ends at
// leaseUntil: if, once a rail slot is free, less than the rail's timeout
// remains, the rail is not called and the decision is a retryable RELEASED
// (the call could outlive the lease, and the reaper would hand the
// instruction to someone else mid-call). A zero leaseUntil means no limit.
// leaseUntil is read by this process's clock: pass a time.Now taken before
// the claim was sent plus the lease's length (lease_until - claimed_at),
// as the engine does, not the database's lease_until itself, which a host
// clock minutes apart from the database's would move by as much.
func (s *Set) ExecuteBefore(ctx context.Context, ins payment.Instruction, leaseUntil time.Time) Decision {
	return s.ExecuteWithin(ctx, ctx, ins, leaseUntil)
}

// ExecuteWithin is ExecuteBefore whose wait for a rail slot also ends when
// wait is done, and at once if it is done already: a relayer that begins
// to stop hands back the instructions still waiting for a slot (a
// retryable RELEASED that never reached the rail), while the calls in
// progress, bound by ctx alone, run on to their answers.
func (s *Set) ExecuteWithin(ctx, wait context.Context, ins payment.Instruction, leaseUntil time.Time) Decision {
	r, ok := s.rails[ins.RailType]
	if !ok {
		return Decision{Outcome: Retryable, ErrorCode: CodeRailNotConfigured,
			Message: fmt.Sprintf("no rail of type %q is configured", ins.RailType)}
	}
	// A probe claimed as such (ProbeClaimed) counts as in flight from
	// here until its result is recorded, as one admitted below does.
	probing := r.takeHold()
	defer func() {
		if probing {
			r.probes.Add(-1)
		}
	}()
	if err := r.Validate(ins); err != nil {
		return r.codes.Decide(Result{}, err)
	}
	// Acquire fails on a wait that is done, even with a slot free; ctx
	// is checked too, for a wait that does not derive from it. (One
	// return here: each Decision literal widens this frame, and every
	// dispatch goroutine's stack with it.)
	if ctx.Err() != nil || r.slots.Acquire(wait, 1) != nil {
		return Decision{Outcome: Retryable, ErrorCode: CodeReleased, Message: "released without calling the rail: stopped while waiting for a rail slot"}
	}
	defer r.slots.Release(1)
	if !leaseUntil.IsZero() && time.Until(leaseUntil) < r.opts.Timeout {
		return Decision{Outcome: Retryable, ErrorCode: CodeReleased,
			Message: "released without calling the rail: the lease would end before the rail's timeout"}
	}

	// probing is set when the breaker admitted this call while half-open
	// (or above, for a probe claimed as such); the probe counts as in
	// flight until Execute has recorded its result, so Claimable cannot
	// offer the rail again in between. (A probe whose
	// breaker has meanwhile moved on to another generation stays counted
	// until it ends, at most the rail's timeout: conservative.)
	call := func() (Decision, error) {
		if !probing && r.breaker != nil && r.breaker.State() == BreakerHalfOpen {
			probing = true
			r.probes.Add(1)
		}
		callCtx, cancel := context.WithTimeout(ctx, r.opts.Timeout)
		defer cancel()
		res, err := r.Dispatch(callCtx, ins)
		if deadline, _ := callCtx.Deadline(); time.Since(deadline) > OverrunGrace {
			r.overruns.Add(1)
		}
		d := r.codes.Decide(res, err)
		switch {
		case err != nil && errors.Is(ctx.Err(), context.Canceled):
			// The caller (the relayer's hard stop) cancelled the call:
			// whatever error the transport made of that, the rail did
			// nothing wrong. The decision stays as classified, retryable
			// (the rail may have acted), unless the transport says
			// nothing was sent; only the breaker ignores it.
			d.releaseIfUnsent()
			return d, errCallerGone
		case d.breakerFailure():
			return d, errTrip
		case !d.RailCalled:
			return d, errNotCalled
		}
		return d, nil
	}
	if r.breaker == nil {
		d, _ := call()
		return d
	}
	d, err := r.breaker.Execute(call)
	switch {
	case errors.Is(err, gobreaker.ErrOpenState):
		return r.codes.Decide(Result{}, fmt.Errorf("rail %q: %w", ins.RailType, ErrCircuitOpen))
	case errors.Is(err, gobreaker.ErrTooManyRequests):
		return r.codes.Decide(Result{}, halfOpenRefusal{rail: ins.RailType, probes: r.maxProbes})
	}
	return d
}

// halfOpenRefusal is a half-open breaker's refusal of a call beyond its
// probes. It is [ErrCircuitOpen] (CIRCUIT_OPEN) but says half-open: the
// archive row an auditor reads must not say the breaker was open while
// its probe was being answered.
type halfOpenRefusal struct {
	rail   string
	probes uint32
}

func (e halfOpenRefusal) Error() string {
	return fmt.Sprintf("rail %q: circuit breaker half-open: the %d probe call(s) it lets through are in flight, and their answer decides whether it closes", e.rail, e.probes)
}

func (e halfOpenRefusal) Unwrap() error { return ErrCircuitOpen }

// releaseIfUnsent makes d, the decision of a call its caller cancelled, a
// RELEASED when the transport said nothing was sent (RAIL_UNAVAILABLE):
// the caller stopping is no attempt of the instruction's, and counted as
// one, a graceful stop on its last attempt made a dead letter of an
// instruction never sent. (Fields set in place: a Decision literal here
// would widen every dispatch goroutine's frame.)
func (d *Decision) releaseIfUnsent() {
	if d.RailCalled || d.ErrorCode != CodeRailUnavailable {
		return
	}
	d.ErrorCode = CodeReleased
	d.Message = "released without calling the rail: the caller stopped before anything was sent (" + d.Message + ")"
}
