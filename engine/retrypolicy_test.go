package engine

import (
	"errors"
	"testing"
	"time"

	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/rails"
)

// TestRecordedRailCalled guards which outcomes outbox_rail_call_seconds
// observes: every attempt that went to the transport, whatever its
// answer, and none that never reached it (their latency is no call's).
func TestRecordedRailCalled(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		code   rails.ErrorCode
		called bool
	}{
		{"", true}, // dispatched
		{rails.CodeRailRejected, true},
		{rails.CodeRailUnavailable, true},
		{rails.CodeRailUpstreamError, true},
		{rails.CodeRailTimeout, true},
		{rails.CodeMaxAttemptsExceeded, true},
		{rails.CodeCircuitOpen, false},
		{rails.CodeReleased, false},
		{rails.CodeRailNotConfigured, false},
		{rails.CodeValidationFailed, false},
		{rails.CodeCutOffAtStop, true},
	} {
		r := Recorded{Outcome: store.Outcome{ErrorCode: string(tt.code)}}
		if got := r.RailCalled(); got != tt.called {
			t.Errorf("error code %q: RailCalled() = %t, want %t", tt.code, got, tt.called)
		}
	}
}

// TestMinRetryDelayIsAFloorUnderEveryRetry: full jitter draws a retry's
// delay from zero up, so without a floor a failing rail could be called
// again at once (and outboxtest.Drain on a pool sent such a retry twice).
// With MinRetryDelay every retry waits at least that long, whatever the
// backoff drew, a rail's shorter Retry-After or the fixed second of an
// uncounted failure; a longer Retry-After still wins; a release stays due
// at once; a terminal outcome has no delay.
func TestMinRetryDelayIsAFloorUnderEveryRetry(t *testing.T) {
	t.Parallel()
	set, err := rails.NewSet(rails.Options{Type: "sandbox", Profile: payment.Generic{}, Transport: rails.NewSandbox(rails.SandboxOptions{})})
	if err != nil {
		t.Fatal(err)
	}
	const floor = 10 * time.Minute
	r, err := New(nil, Config{Rails: set, MinRetryDelay: floor, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		d    rails.Decision
		want time.Duration
	}{
		{"backoff", rails.Decision{Outcome: rails.Retryable, ErrorCode: rails.CodeRailUnavailable, RailCalled: true}, floor},
		{"short Retry-After", rails.Decision{Outcome: rails.Retryable, ErrorCode: rails.CodeRailUnavailable, RailCalled: true, RetryAfter: time.Second}, floor},
		{"long Retry-After", rails.Decision{Outcome: rails.Retryable, ErrorCode: rails.CodeRailUnavailable, RailCalled: true, RetryAfter: time.Hour}, time.Hour},
		{"breaker open", rails.Decision{Outcome: rails.Retryable, ErrorCode: rails.CodeCircuitOpen}, floor},
		{"released", rails.Decision{Outcome: rails.Retryable, ErrorCode: rails.CodeReleased}, 0},
		{"dispatched", rails.Decision{Outcome: rails.Dispatched, RailCalled: true}, 0},
	} {
		for range 50 { // the backoff's draws: each under the floor (base 1 s)
			o := r.outcome(store.Claimed{AttemptNo: 1}, tt.d, time.Millisecond)
			if o.RetryDelay != tt.want {
				t.Fatalf("%s: retry delay %v, want %v", tt.name, o.RetryDelay, tt.want)
			}
		}
	}
	if _, err := New(nil, Config{Rails: set, MinRetryDelay: MaxMinRetryDelay + 1}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("MinRetryDelay past %v: %v, want ErrInvalidConfig", MaxMinRetryDelay, err)
	}
	if _, err := New(nil, Config{Rails: set, MinRetryDelay: -time.Second}); err == nil {
		t.Fatal("a negative MinRetryDelay was accepted")
	}
}

// TestOutcomeOfDecisionsThatSpendNoBudget: without a floor, an uncounted
// failure that is neither a release nor a cut-off (the breaker open, a
// rail not configured) waits a fixed second, not zero (a relayer would
// claim it again at once, over and over); a call cut off at stop waits
// until its claim's lease ends, counted from the claim (the lease less
// the call's latency: the outcome is recorded when the call ended), its
// outcome unknown (the rail may have acted on it); and a
// dispatched outcome keeps no error message, whatever the rail's answer
// said.
func TestOutcomeOfDecisionsThatSpendNoBudget(t *testing.T) {
	t.Parallel()
	set, err := rails.NewSet(rails.Options{Type: "sandbox", Profile: payment.Generic{}, Transport: rails.NewSandbox(rails.SandboxOptions{})})
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(nil, Config{Rails: set, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	claimedAt := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	c := store.Claimed{AttemptNo: 1, ClaimedAt: claimedAt, LeaseUntil: claimedAt.Add(30 * time.Second)}
	for _, tt := range []struct {
		name    string
		d       rails.Decision
		latency time.Duration
		state   store.State
		delay   time.Duration
		unknown bool
	}{
		{"breaker open", rails.Decision{Outcome: rails.Retryable, ErrorCode: rails.CodeCircuitOpen}, 0, store.Retryable, time.Second, false},
		{"rail not configured", rails.Decision{Outcome: rails.Retryable, ErrorCode: rails.CodeRailNotConfigured}, 0, store.Retryable, time.Second, false},
		{"cut off at stop", rails.Decision{Outcome: rails.Retryable, ErrorCode: rails.CodeCutOffAtStop, RailCalled: true},
			10 * time.Second, store.Retryable, 20 * time.Second, true},
		{"cut off past its lease", rails.Decision{Outcome: rails.Retryable, ErrorCode: rails.CodeCutOffAtStop, RailCalled: true},
			time.Minute, store.Retryable, 0, true},
		{"dispatched with a message", rails.Decision{Outcome: rails.Dispatched, RailCalled: true, Reference: "ref-1", Message: "accepted, note 7"},
			time.Millisecond, store.Dispatched, 0, false},
	} {
		o := r.outcome(c, tt.d, tt.latency)
		if o.State != tt.state || o.RetryDelay != tt.delay {
			t.Errorf("%s: %s after %v, want %s after %v", tt.name, o.State, o.RetryDelay, tt.state, tt.delay)
		}
		if o.OutcomeUnknown != tt.unknown {
			t.Errorf("%s: outcome unknown %v, want %v", tt.name, o.OutcomeUnknown, tt.unknown)
		}
		if o.State == store.Dispatched && o.ErrorMessage != "" {
			t.Errorf("%s: dispatched with error message %q", tt.name, o.ErrorMessage)
		}
	}
}
