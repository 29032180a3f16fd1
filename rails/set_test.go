package rails_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"

	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/rails"
)

// sandboxIns returns a valid payment instruction for rail with its own
// outbox id and idempotency key.
func sandboxIns(rail, key string) payment.Instruction {
	ins := payment.Instruction{InstructionID: "ins-1", ParticipantID: "acme", IdempotencyKey: "key-1", RailType: rail,
		Payment: &payment.Payment{AmountMinor: 1000, Currency: "USD", Destination: "acct-" + key}}
	ins.IdempotencyKey = key
	ins.OutboxID = uuid.NewV5(uuid.NamespaceOID, key)
	ins.AttemptNo = 1
	return ins
}

func newSet(t *testing.T, opts ...rails.Options) *rails.Set {
	t.Helper()
	s, err := rails.NewSet(opts...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// waitFor polls cond until it holds or a generous deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestNewSetErrors(t *testing.T) {
	t.Parallel()
	sbx := rails.NewSandbox(rails.SandboxOptions{})
	for name, opts := range map[string][]rails.Options{
		"no type":      {{Profile: payment.Generic{}, Transport: sbx}},
		"no profile":   {{Type: "a", Transport: sbx}},
		"no transport": {{Type: "a", Profile: payment.Generic{}}},
		"duplicate":    {{Type: "a", Profile: payment.Generic{}, Transport: sbx}, {Type: "a", Profile: payment.Generic{}, Transport: sbx}},
		"no codes":     {{Type: "a", Profile: payment.Generic{}, Transport: &gate{}}},
	} {
		if _, err := rails.NewSet(opts...); err == nil {
			t.Errorf("%s: expected an error", name)
		}
	}
}

func TestSetValidationNeverCallsTransport(t *testing.T) {
	t.Parallel()
	sbx := rails.NewSandbox(rails.SandboxOptions{})
	s := newSet(t, rails.Options{Type: "ach", Profile: payment.ACH{}, Transport: sbx})
	ins := sandboxIns("ach", "k1")
	ins.Payment.Destination = "021000022:123456789" // checksum failure
	for range 10 {                                  // more than the breaker's default threshold
		d := s.Execute(context.Background(), ins)
		if d.Outcome != rails.Failed || d.ErrorCode != rails.CodeValidationFailed || d.Field != payment.FieldDestination || d.RailCalled {
			t.Fatalf("got %+v", d)
		}
	}
	if n := sbx.Stats().Calls; n != 0 {
		t.Fatalf("transport called %d times for an invalid instruction", n)
	}
	if s.State("ach") != rails.BreakerClosed {
		t.Fatal("validation failures must not trip the breaker")
	}
	// The same instruction with a valid destination does reach the rail.
	ins.Payment.Destination = "021000021:123456789"
	if d := s.Execute(context.Background(), ins); d.Outcome != rails.Dispatched || sbx.Stats().Calls != 1 {
		t.Fatalf("valid instruction: %+v, calls %d", d, sbx.Stats().Calls)
	}
}

func TestSetUnknownRail(t *testing.T) {
	t.Parallel()
	s := newSet(t, rails.Options{Type: "sandbox", Profile: payment.Generic{}, Transport: rails.NewSandbox(rails.SandboxOptions{})})
	d := s.Execute(context.Background(), sandboxIns("ach", "k1"))
	if d.Outcome != rails.Retryable || d.ErrorCode != rails.CodeRailNotConfigured {
		t.Fatalf("got %+v", d)
	}
}

// gate is a transport double that holds every call until released and
// records the highest number of calls in flight at once.
type gate struct {
	release chan struct{}

	mu                sync.Mutex
	inFlight, maxSeen int
	calls             int
}

func (g *gate) Send(ctx context.Context, _ payment.Instruction) (rails.Result, error) {
	g.mu.Lock()
	g.calls++
	g.inFlight++
	g.maxSeen = max(g.maxSeen, g.inFlight)
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		g.inFlight--
		g.mu.Unlock()
	}()
	select {
	case <-g.release:
		return rails.Result{Code: rails.SandboxAccepted}, nil
	case <-ctx.Done():
		return rails.Result{}, ctx.Err()
	}
}

func (g *gate) snapshot() (inFlight, maxSeen, calls int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.inFlight, g.maxSeen, g.calls
}

func TestSetMaxConcurrency(t *testing.T) {
	t.Parallel()
	const limit, calls = 3, 12
	g := &gate{release: make(chan struct{})}
	s := newSet(t, rails.Options{Type: "r", Profile: payment.Generic{}, Transport: g, Codes: rails.SandboxCodes, MaxConcurrency: limit})

	decisions := make(chan rails.Decision, calls)
	for i := range calls {
		go func() { decisions <- s.Execute(context.Background(), sandboxIns("r", fmt.Sprint(i))) }()
	}
	waitFor(t, "the rail's slots to fill", func() bool { in, _, _ := g.snapshot(); return in >= limit })
	// Give a broken cap the chance to let more calls through; with a
	// working one nothing changes, so this cannot make the test flaky.
	time.Sleep(20 * time.Millisecond)
	if in, _, n := g.snapshot(); in != limit || n != limit {
		t.Fatalf("%d calls in flight, %d started; want %d", in, n, limit)
	}
	close(g.release)
	for range calls {
		if d := <-decisions; d.Outcome != rails.Dispatched {
			t.Fatalf("got %+v", d)
		}
	}
	if _, maxSeen, n := g.snapshot(); maxSeen != limit || n != calls {
		t.Fatalf("max in flight %d (want %d), calls %d (want %d)", maxSeen, limit, n, calls)
	}
}

func TestSetSlotWaitCancelled(t *testing.T) {
	t.Parallel()
	g := &gate{release: make(chan struct{})}
	defer close(g.release)
	s := newSet(t, rails.Options{Type: "r", Profile: payment.Generic{}, Transport: g, Codes: rails.SandboxCodes, MaxConcurrency: 1})
	go s.Execute(context.Background(), sandboxIns("r", "holder"))
	waitFor(t, "the only slot to be taken", func() bool { in, _, _ := g.snapshot(); return in == 1 })

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	d := s.Execute(ctx, sandboxIns("r", "waiter"))
	if d.Outcome != rails.Retryable || d.ErrorCode != rails.CodeReleased || d.RailCalled {
		t.Fatalf("got %+v", d)
	}
	if _, _, n := g.snapshot(); n != 1 {
		t.Fatalf("transport called %d times, want 1", n)
	}
}

func TestSetTimeout(t *testing.T) {
	t.Parallel()
	sbx := rails.NewSandbox(rails.SandboxOptions{HangRate: 1})
	s := newSet(t, rails.Options{Type: "r", Profile: payment.Generic{}, Transport: sbx, Timeout: 50 * time.Millisecond})
	if s.Timeout("r") != 50*time.Millisecond {
		t.Fatalf("Timeout = %v", s.Timeout("r"))
	}
	d := s.Execute(context.Background(), sandboxIns("r", "k1"))
	if d.Outcome != rails.Retryable || d.ErrorCode != rails.CodeRailTimeout || !d.RailCalled {
		t.Fatalf("got %+v", d)
	}
	if st := sbx.Stats(); st.Hangs != 1 || st.Payments != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestSetTimeoutNeedsATransportThatHonoursIt guards the documented
// contract of Options.Timeout and Transport: the timeout is the deadline
// of the transport's context, and the Set never abandons a running Send
// (a call left running could pay after its attempt was retried). A
// transport that ignores its context therefore holds Execute until it
// returns, its late answer is classified as given, and Overruns counts
// it; one that honours its context ends at the timeout, not counted.
func TestSetTimeoutNeedsATransportThatHonoursIt(t *testing.T) {
	t.Parallel()
	const timeout, blocks = 50 * time.Millisecond, 50*time.Millisecond + 2*rails.OverrunGrace
	stubborn := transportFunc(func(context.Context, payment.Instruction) (rails.Result, error) {
		time.Sleep(blocks) // a blocking client call that takes no context
		return rails.Result{Code: rails.SandboxAccepted}, nil
	})
	s := newSet(t,
		rails.Options{Type: "stubborn", Profile: payment.Generic{}, Transport: stubborn, Codes: rails.SandboxCodes, Timeout: timeout},
		rails.Options{Type: "honest", Profile: payment.Generic{}, Transport: rails.NewSandbox(rails.SandboxOptions{HangRate: 1}), Timeout: timeout})

	start := time.Now()
	d := s.Execute(context.Background(), sandboxIns("stubborn", "k1"))
	if took := time.Since(start); took < blocks || d.Outcome != rails.Dispatched {
		t.Errorf("stubborn transport: Execute returned after %v with %+v; want it to wait the %v the call took and keep its answer", took, d, blocks)
	}
	if n := s.Overruns("stubborn"); n != 1 {
		t.Errorf("stubborn transport: Overruns = %d, want 1", n)
	}

	d = s.Execute(context.Background(), sandboxIns("honest", "k2"))
	if d.ErrorCode != rails.CodeRailTimeout {
		t.Errorf("honest transport: %+v, want RAIL_TIMEOUT", d)
	}
	if n := s.Overruns("honest"); n != 0 {
		t.Errorf("honest transport: Overruns = %d, want 0", n)
	}
}

// TestSetTimeoutThenRetry: the rail paid but the answer was lost; the retry
// with the same key is answered DUPLICATE and nothing is paid twice.
func TestSetTimeoutThenRetry(t *testing.T) {
	t.Parallel()
	sbx := rails.NewSandbox(rails.SandboxOptions{TimeoutRate: 1})
	s := newSet(t, rails.Options{Type: "r", Profile: payment.Generic{}, Transport: sbx, Timeout: 50 * time.Millisecond})
	ins := sandboxIns("r", "k1")
	if d := s.Execute(context.Background(), ins); d.ErrorCode != rails.CodeRailTimeout {
		t.Fatalf("first attempt: %+v", d)
	}
	ins.AttemptNo = 2
	d := s.Execute(context.Background(), ins)
	if d.Outcome != rails.Dispatched || d.RailCode != rails.SandboxDuplicate || d.Reference == "" {
		t.Fatalf("retry: %+v", d)
	}
	if st := sbx.Stats(); st.Payments != 1 || st.Replays != 1 || st.EffectiveDuplicates != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestSetBreaker(t *testing.T) {
	t.Parallel()
	const failures = 3
	sbx := rails.NewSandbox(rails.SandboxOptions{})
	var (
		mu          sync.Mutex
		transitions []string
	)
	s := newSet(t,
		rails.Options{
			Type: "flaky", Profile: payment.Generic{}, Transport: sbx,
			// Long enough that the checks right after tripping finish while
			// it is still open, even under the race detector.
			Breaker: rails.BreakerOptions{ConsecutiveFailures: failures, OpenFor: 200 * time.Millisecond},
			OnBreakerChange: func(rail string, from, to rails.BreakerState) {
				mu.Lock()
				transitions = append(transitions, rail+":"+from.String()+">"+to.String())
				mu.Unlock()
			},
		},
		rails.Options{Type: "steady", Profile: payment.Generic{}, Transport: rails.NewSandbox(rails.SandboxOptions{})},
	)
	sbx.SetDown(rails.ErrUnavailable)
	for i := range failures {
		if s.State("flaky") != rails.BreakerClosed {
			t.Fatalf("breaker open after %d failures", i)
		}
		d := s.Execute(context.Background(), sandboxIns("flaky", fmt.Sprint("k", i)))
		if d.ErrorCode != rails.CodeRailUnavailable || d.RailCalled {
			t.Fatalf("call %d: %+v", i, d)
		}
	}
	if s.State("flaky") != rails.BreakerOpen {
		t.Fatalf("state %v after %d failures", s.State("flaky"), failures)
	}
	if closed, halfOpen := s.Claimable(); !slices.Equal(closed, []string{"steady"}) || len(halfOpen) != 0 {
		t.Fatalf("Claimable = %v, %v", closed, halfOpen)
	}
	d := s.Execute(context.Background(), sandboxIns("flaky", "refused"))
	if d.Outcome != rails.Retryable || d.ErrorCode != rails.CodeCircuitOpen || d.RailCalled {
		t.Fatalf("open breaker: %+v", d)
	}
	if n := sbx.Stats().Calls; n != failures {
		t.Fatalf("transport called %d times, want %d", n, failures)
	}

	sbx.SetDown(nil)
	waitFor(t, "half-open", func() bool { return s.State("flaky") == rails.BreakerHalfOpen })
	if closed, halfOpen := s.Claimable(); !slices.Equal(closed, []string{"steady"}) || !slices.Equal(halfOpen, []string{"flaky"}) {
		t.Fatalf("Claimable = %v, %v", closed, halfOpen)
	}
	if d := s.Execute(context.Background(), sandboxIns("flaky", "probe")); d.Outcome != rails.Dispatched {
		t.Fatalf("probe: %+v", d)
	}
	if s.State("flaky") != rails.BreakerClosed {
		t.Fatalf("state %v after a successful probe", s.State("flaky"))
	}
	mu.Lock()
	defer mu.Unlock()
	want := []string{"flaky:closed>open", "flaky:open>half-open", "flaky:half-open>closed"}
	if !slices.Equal(transitions, want) {
		t.Fatalf("transitions %v, want %v", transitions, want)
	}
}

// TestSetBreakerIgnoresRejections: a rail rejecting single instructions is
// healthy; only failures of the rail itself trip the breaker.
func TestSetBreakerIgnoresRejections(t *testing.T) {
	t.Parallel()
	sbx := rails.NewSandbox(rails.SandboxOptions{TerminalRate: 1})
	s := newSet(t, rails.Options{Type: "r", Profile: payment.Generic{}, Transport: sbx,
		Breaker: rails.BreakerOptions{ConsecutiveFailures: 1}})
	for i := range 5 {
		if d := s.Execute(context.Background(), sandboxIns("r", fmt.Sprint(i))); d.ErrorCode != rails.CodeRailRejected {
			t.Fatalf("got %+v", d)
		}
	}
	if s.State("r") != rails.BreakerClosed {
		t.Fatal("rejections tripped the breaker")
	}
}

// transportFunc adapts a function to rails.Transport.
type transportFunc func(ctx context.Context, ins payment.Instruction) (rails.Result, error)

func (f transportFunc) Send(ctx context.Context, ins payment.Instruction) (rails.Result, error) {
	return f(ctx, ins)
}

// cancelKey holds, in a call's context, the test's cancel function, so a
// transport can cancel its caller once the call has reached it.
type cancelKey struct{}

// cancelCaller cancels the caller's context from inside the transport and
// returns once the call's context has ended.
func cancelCaller(ctx context.Context) error {
	ctx.Value(cancelKey{}).(context.CancelFunc)()
	<-ctx.Done()
	return ctx.Err()
}

// TestSetBreakerCounts: which dispatch endings count towards opening the
// breaker. An answer the code table does not know (a misconfigured endpoint
// answering 404 to everything) does, and so does a server error whose
// outcome is unknown (RAIL_UPSTREAM_ERROR); a call cancelled by the caller (the
// relayer's hard stop) does not, though it stays retryable.
func TestSetBreakerCounts(t *testing.T) {
	t.Parallel()
	const failures = 3
	for _, tc := range []struct {
		name  string
		send  transportFunc
		codes rails.CodeTable // rails.SandboxCodes when nil
		code  rails.ErrorCode
		trips bool
	}{
		{
			name: "unknown rail code",
			send: func(context.Context, payment.Instruction) (rails.Result, error) {
				return rails.Result{Code: "HTTP_404"}, nil
			},
			code:  rails.CodeUnknownRailCode,
			trips: true,
		},
		{
			name: "unavailable",
			send: func(context.Context, payment.Instruction) (rails.Result, error) {
				return rails.Result{}, rails.ErrUnavailable
			},
			code:  rails.CodeRailUnavailable,
			trips: true,
		},
		{
			// An HTTP 504 behind a gateway: outcome unknown, but still the
			// rail in trouble.
			name: "upstream error",
			send: func(context.Context, payment.Instruction) (rails.Result, error) {
				return rails.Result{Code: "HTTP_504"}, nil
			},
			codes: rails.WebhookCodes,
			code:  rails.CodeRailUpstreamError,
			trips: true,
		},
		{
			name: "cancelled by the caller",
			send: func(ctx context.Context, _ payment.Instruction) (rails.Result, error) {
				return rails.Result{}, cancelCaller(ctx)
			},
			code: rails.CodeRailTransport,
		},
		{
			name: "cancelled by the caller, error wrapped by the transport",
			send: func(ctx context.Context, _ payment.Instruction) (rails.Result, error) {
				return rails.Result{}, fmt.Errorf("webhook: Post %q: %w", "https://rail.example", cancelCaller(ctx))
			},
			code: rails.CodeRailTransport,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			codes := tc.codes
			if codes == nil {
				codes = rails.SandboxCodes
			}
			s := newSet(t, rails.Options{Type: "r", Profile: payment.Generic{}, Transport: tc.send, Codes: codes,
				Breaker: rails.BreakerOptions{ConsecutiveFailures: failures, OpenFor: time.Hour}})
			for i := range failures {
				ctx, cancel := context.WithCancel(context.Background())
				ctx = context.WithValue(ctx, cancelKey{}, cancel)
				d := s.Execute(ctx, sandboxIns("r", fmt.Sprint("k", i)))
				cancel()
				if d.Outcome != rails.Retryable || d.ErrorCode != tc.code {
					t.Fatalf("call %d: %+v, want retryable %s", i, d, tc.code)
				}
			}
			want := rails.BreakerClosed
			if tc.trips {
				want = rails.BreakerOpen
			}
			if got := s.State("r"); got != want {
				t.Fatalf("breaker %v after %d such calls, want %v", got, failures, want)
			}
		})
	}
}

// halfOpenSet returns a set whose rail "r" is half-open: its transport
// failed once (opening the breaker) and now blocks every call until
// release is closed or the call's context ends.
func halfOpenSet(t *testing.T, probes uint32) (s *rails.Set, calls func() int, release chan struct{}) {
	t.Helper()
	release = make(chan struct{})
	var (
		mu sync.Mutex
		n  int
	)
	send := func(ctx context.Context, _ payment.Instruction) (rails.Result, error) {
		mu.Lock()
		n++
		first := n == 1
		mu.Unlock()
		if first {
			return rails.Result{}, rails.ErrUnavailable
		}
		select {
		case <-release:
			return rails.Result{Code: rails.SandboxAccepted}, nil
		case <-ctx.Done():
			return rails.Result{}, ctx.Err()
		}
	}
	s = newSet(t, rails.Options{Type: "r", Profile: payment.Generic{}, Transport: transportFunc(send), Codes: rails.SandboxCodes,
		Breaker: rails.BreakerOptions{ConsecutiveFailures: 1, OpenFor: 20 * time.Millisecond, HalfOpenProbes: probes}})
	if d := s.Execute(context.Background(), sandboxIns("r", "trip")); d.ErrorCode != rails.CodeRailUnavailable {
		t.Fatalf("tripping call: %+v", d)
	}
	waitFor(t, "half-open", func() bool { return s.State("r") == rails.BreakerHalfOpen })
	calls = func() int { mu.Lock(); defer mu.Unlock(); return n - 1 } // probes that reached the transport
	return s, calls, release
}

// TestSetClaimableHalfOpenProbes: a half-open rail is claimable only while
// fewer probes are in flight than the breaker lets through; otherwise every
// claim pass would claim a "probe" the breaker then refuses (CIRCUIT_OPEN).
func TestSetClaimableHalfOpenProbes(t *testing.T) {
	t.Parallel()
	for _, probes := range []uint32{1, 2} {
		t.Run(fmt.Sprint(probes, " probes"), func(t *testing.T) {
			t.Parallel()
			s, calls, release := halfOpenSet(t, probes)
			decisions := make(chan rails.Decision, probes)
			for i := range probes {
				if _, halfOpen := s.Claimable(); !slices.Equal(halfOpen, []string{"r"}) {
					t.Fatalf("with %d of %d probes in flight: half-open claimable %v, want [r]", i, probes, halfOpen)
				}
				go func() { decisions <- s.Execute(context.Background(), sandboxIns("r", fmt.Sprint("probe", i))) }()
				waitFor(t, "the probe to reach the transport", func() bool { return calls() == int(i)+1 })
			}
			if closed, halfOpen := s.Claimable(); len(closed)+len(halfOpen) != 0 {
				t.Fatalf("with all %d probes in flight: Claimable = %v, %v, want nothing", probes, closed, halfOpen)
			}
			// This is what the relayer would claim otherwise: refused.
			// Its archive row says what refused it: the breaker is
			// half-open, not open (it said "circuit breaker open").
			if d := s.Execute(context.Background(), sandboxIns("r", "extra")); d.ErrorCode != rails.CodeCircuitOpen ||
				!strings.Contains(d.Message, "half-open") || strings.Contains(d.Message, "breaker open") {
				t.Fatalf("extra probe: %+v, want CIRCUIT_OPEN saying the breaker is half-open", d)
			}
			close(release)
			for range probes {
				if d := <-decisions; d.Outcome != rails.Dispatched {
					t.Fatalf("probe: %+v", d)
				}
			}
			if closed, halfOpen := s.Claimable(); !slices.Equal(closed, []string{"r"}) || len(halfOpen) != 0 {
				t.Fatalf("after the probes: Claimable = %v, %v, want closed [r]", closed, halfOpen)
			}
		})
	}
}

// TestSetHalfOpenProbeCancelled: a probe cut off by the caller's stop
// neither closes nor re-opens the breaker, and frees its probe slot.
func TestSetHalfOpenProbeCancelled(t *testing.T) {
	t.Parallel()
	s, calls, release := halfOpenSet(t, 1)
	defer close(release)
	ctx, cancel := context.WithCancel(context.Background())
	decision := make(chan rails.Decision, 1)
	go func() { decision <- s.Execute(ctx, sandboxIns("r", "probe")) }()
	waitFor(t, "the probe to reach the transport", func() bool { return calls() == 1 })
	if _, halfOpen := s.Claimable(); len(halfOpen) != 0 {
		t.Fatalf("half-open claimable %v with the probe in flight", halfOpen)
	}
	cancel()
	if d := <-decision; d.Outcome != rails.Retryable || !d.RailCalled {
		t.Fatalf("cancelled probe: %+v", d)
	}
	if calls() != 1 {
		t.Fatalf("%d probes reached the transport, want 1", calls())
	}
	if got := s.State("r"); got != rails.BreakerHalfOpen {
		t.Fatalf("breaker %v after a cancelled probe, want half-open", got)
	}
	if _, halfOpen := s.Claimable(); !slices.Equal(halfOpen, []string{"r"}) {
		t.Fatalf("half-open claimable %v after a cancelled probe, want [r]", halfOpen)
	}
}

// TestSetReleasesACallItsLeaseCannotCover: ExecuteBefore does not call the
// rail when less than the rail's timeout is left of the claim's lease (the
// call could outlive the lease, and the reaper would hand the instruction
// to another relayer mid-call): the decision is a retryable RELEASED that
// says the rail was not called. With the timeout left, or no lease given,
// the rail is called. The margins are minutes, so no clock can blur them.
func TestSetReleasesACallItsLeaseCannotCover(t *testing.T) {
	t.Parallel()
	const timeout = time.Minute
	g := &gate{release: make(chan struct{})}
	close(g.release) // every call answers at once
	s := newSet(t, rails.Options{Type: "r", Profile: payment.Generic{}, Transport: g, Codes: rails.SandboxCodes, Timeout: timeout})

	d := s.ExecuteBefore(context.Background(), sandboxIns("r", "short"), time.Now().Add(timeout/2))
	if d.Outcome != rails.Retryable || d.ErrorCode != rails.CodeReleased || d.RailCalled {
		t.Fatalf("half the timeout left of the lease: %+v, want RELEASED without calling the rail", d)
	}
	if _, _, n := g.snapshot(); n != 0 {
		t.Fatalf("the transport was called %d times for a lease too short for the call", n)
	}
	for _, until := range []time.Time{time.Now().Add(10 * timeout), {}} {
		if d := s.ExecuteBefore(context.Background(), sandboxIns("r", fmt.Sprint("long-", until.IsZero())), until); d.Outcome != rails.Dispatched {
			t.Fatalf("lease until %v: %+v, want the rail called and the payment dispatched", until, d)
		}
	}
	if _, _, n := g.snapshot(); n != 2 {
		t.Fatalf("the transport was called %d times, want 2", n)
	}
}

// TestSetCancelledBeforeSendingReleases: a call its caller cancels (the
// relayer's hard stop) whose transport then says nothing was sent
// (ErrUnavailable) is a RELEASED that never reached the rail, which uses
// up no attempt; one whose transport may have sent something stays
// retryable with the rail called (outcome unknown). Before, the first was
// a RAIL_UNAVAILABLE, an attempt of the instruction's budget.
func TestSetCancelledBeforeSendingReleases(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		err        error
		code       rails.ErrorCode
		railCalled bool
	}{
		{"nothing sent", rails.ErrUnavailable, rails.CodeReleased, false},
		{"maybe sent", context.Canceled, rails.CodeRailTransport, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			started := make(chan struct{})
			s := newSet(t, rails.Options{Type: "r", Profile: payment.Generic{}, Codes: rails.SandboxCodes,
				Transport: transportFunc(func(ctx context.Context, _ payment.Instruction) (rails.Result, error) {
					close(started)
					<-ctx.Done()
					return rails.Result{}, fmt.Errorf("connecting: %w", tc.err)
				})})
			ctx, cancel := context.WithCancel(context.Background())
			decision := make(chan rails.Decision, 1)
			go func() { decision <- s.Execute(ctx, sandboxIns("r", "k")) }()
			<-started
			cancel()
			if d := <-decision; d.Outcome != rails.Retryable || d.ErrorCode != tc.code || d.RailCalled != tc.railCalled {
				t.Fatalf("decision %s/%s railCalled=%v, want %s/%s railCalled=%v", d.Outcome, d.ErrorCode, d.RailCalled,
					rails.Retryable, tc.code, tc.railCalled)
			}
			if got := s.State("r"); got != rails.BreakerClosed {
				t.Fatalf("breaker %v after a cancelled call, want closed", got)
			}
		})
	}
}

// TestSetHalfOpenProbeRefusedByTransport: a half-open probe whose
// transport refuses the instruction before sending anything (a
// validation error of its own) proves nothing about the rail: the breaker
// stays half-open and the next claim can probe. Before, the refusal
// counted as a success and closed the breaker, letting a full batch (up
// to the rail's concurrency) through to a rail that was still down.
func TestSetHalfOpenProbeRefusedByTransport(t *testing.T) {
	t.Parallel()
	s := newSet(t, rails.Options{Type: "r", Profile: payment.Generic{}, Codes: rails.SandboxCodes,
		Breaker: rails.BreakerOptions{ConsecutiveFailures: 1, OpenFor: 20 * time.Millisecond},
		Transport: transportFunc(func(_ context.Context, ins payment.Instruction) (rails.Result, error) {
			if ins.IdempotencyKey == "unsendable" {
				return rails.Result{}, payment.Invalid(payment.FieldIdempotencyKey, payment.ReasonInvalid, "cannot be sent")
			}
			return rails.Result{}, rails.ErrUnavailable // the rail is still down
		})})
	if d := s.Execute(context.Background(), sandboxIns("r", "trip")); d.ErrorCode != rails.CodeRailUnavailable {
		t.Fatalf("tripping call: %+v", d)
	}
	waitFor(t, "half-open", func() bool { return s.State("r") == rails.BreakerHalfOpen })
	if d := s.Execute(context.Background(), sandboxIns("r", "unsendable")); d.ErrorCode != rails.CodeValidationFailed || d.RailCalled {
		t.Fatalf("refused probe: %+v, want VALIDATION_FAILED, rail not called", d)
	}
	if got := s.State("r"); got != rails.BreakerHalfOpen {
		t.Fatalf("breaker %v after a probe its transport refused, want still half-open", got)
	}
	if _, halfOpen := s.Claimable(); !slices.Equal(halfOpen, []string{"r"}) {
		t.Fatalf("half-open claimable %v after a refused probe, want [r]", halfOpen)
	}
	// The next probe reaches the rail, still down: the breaker opens again.
	if d := s.Execute(context.Background(), sandboxIns("r", "probe")); d.ErrorCode != rails.CodeRailUnavailable {
		t.Fatalf("probe: %+v", d)
	}
	if got := s.State("r"); got != rails.BreakerOpen {
		t.Fatalf("breaker %v after a failed probe, want open", got)
	}
}

// TestSetProbeClaimedCountsFromTheClaim: a probe the relayer claimed
// (ProbeClaimed) counts as in flight from its claim, so Claimable does not
// offer the half-open rail for another probe before the first one's call
// begins; its Execute takes the hold over, and once its answer closes the
// breaker nothing is left counted. A hold whose instruction never reaches
// Execute (its relayer stopped) lapses after the rail's timeout.
func TestSetProbeClaimedCountsFromTheClaim(t *testing.T) {
	t.Parallel()
	s, calls, release := halfOpenSet(t, 1)
	s.ProbeClaimed("r")
	if _, halfOpen := s.Claimable(); len(halfOpen) != 0 || s.ProbesInFlight("r") != 1 {
		t.Fatalf("a claimed probe before its call: half-open claimable %v, %d probes in flight; want none offered, 1", halfOpen, s.ProbesInFlight("r"))
	}
	decision := make(chan rails.Decision, 1)
	go func() { decision <- s.Execute(context.Background(), sandboxIns("r", "probe")) }()
	waitFor(t, "the probe to reach the transport", func() bool { return calls() == 1 })
	if _, halfOpen := s.Claimable(); len(halfOpen) != 0 || s.ProbesInFlight("r") != 1 {
		t.Fatalf("the probe in its call: half-open claimable %v, %d probes in flight; want none offered, 1", halfOpen, s.ProbesInFlight("r"))
	}
	close(release)
	if d := <-decision; d.Outcome != rails.Dispatched {
		t.Fatalf("probe: %+v", d)
	}
	if closed, _ := s.Claimable(); !slices.Equal(closed, []string{"r"}) || s.ProbesInFlight("r") != 0 {
		t.Fatalf("after the probe: closed %v, %d probes in flight", closed, s.ProbesInFlight("r"))
	}

	// A hold that is never dispatched lapses after the rail's timeout.
	lapse := newSet(t, rails.Options{Type: "r", Profile: payment.Generic{}, Codes: rails.SandboxCodes, Timeout: 50 * time.Millisecond,
		Transport: transportFunc(func(context.Context, payment.Instruction) (rails.Result, error) {
			return rails.Result{}, rails.ErrUnavailable
		}),
		Breaker: rails.BreakerOptions{ConsecutiveFailures: 1, OpenFor: 20 * time.Millisecond}})
	lapse.Execute(context.Background(), sandboxIns("r", "trip"))
	waitFor(t, "half-open", func() bool { return lapse.State("r") == rails.BreakerHalfOpen })
	lapse.ProbeClaimed("r")
	if _, halfOpen := lapse.Claimable(); len(halfOpen) != 0 {
		t.Fatalf("held: half-open claimable %v", halfOpen)
	}
	waitFor(t, "the hold to lapse", func() bool { _, halfOpen := lapse.Claimable(); return slices.Equal(halfOpen, []string{"r"}) })
}

// TestSetProbeHoldOfALongTimeout: a probe's hold (ProbeClaimed) lasts the
// rail's timeout by this process's monotonic clock, whatever that timeout.
// The hold's end was kept as wall-clock Unix nanoseconds: a timeout that
// took it past 2262 wrapped it into the past, so the hold lapsed at once
// and a second probe was claimed beside the first, for the breaker to
// refuse (CIRCUIT_OPEN, an attempt archived for nothing); and a step of
// the host's clock moved it as much (back: the half-open rail offered for
// no probe until the clock caught up).
func TestSetProbeHoldOfALongTimeout(t *testing.T) {
	t.Parallel()
	s := newSet(t, rails.Options{Type: "r", Profile: payment.Generic{}, Codes: rails.SandboxCodes, Timeout: 2_500_000 * time.Hour,
		Transport: transportFunc(func(context.Context, payment.Instruction) (rails.Result, error) {
			return rails.Result{}, rails.ErrUnavailable
		}),
		Breaker: rails.BreakerOptions{ConsecutiveFailures: 1, OpenFor: 20 * time.Millisecond}})
	s.Execute(context.Background(), sandboxIns("r", "trip"))
	waitFor(t, "half-open", func() bool { return s.State("r") == rails.BreakerHalfOpen })
	s.ProbeClaimed("r")
	if _, halfOpen := s.Claimable(); len(halfOpen) != 0 || s.ProbesInFlight("r") != 1 {
		t.Fatalf("a claimed probe of a rail with a %v timeout: half-open claimable %v, %d probes in flight; want none offered, 1",
			2_500_000*time.Hour, halfOpen, s.ProbesInFlight("r"))
	}
}
