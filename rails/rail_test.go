package rails_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"testing"
	"time"

	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/rails"
)

func TestDecideSandboxCodes(t *testing.T) {
	t.Parallel()
	// Spelled out rather than read from SandboxCodes, so a changed table
	// fails here.
	want := map[string]struct {
		outcome rails.Outcome
		code    rails.ErrorCode
	}{
		rails.SandboxAccepted:    {rails.Dispatched, ""},
		rails.SandboxDuplicate:   {rails.Dispatched, ""},
		rails.SandboxUnavailable: {rails.Retryable, rails.CodeRailUnavailable},
		rails.SandboxRateLimited: {rails.Retryable, rails.CodeRateLimited},
		rails.SandboxRejected:    {rails.Failed, rails.CodeRailRejected},
	}
	if len(want) != len(rails.SandboxCodes) {
		t.Fatalf("SandboxCodes has %d entries, the test knows %d", len(rails.SandboxCodes), len(want))
	}
	for code := range rails.SandboxCodes {
		w, ok := want[code]
		if !ok {
			t.Fatalf("SandboxCodes entry %q is not covered", code)
		}
		res := rails.Result{Code: code, Reference: "ref-1", Message: "m", RetryAfter: time.Second}
		d := rails.SandboxCodes.Decide(res, nil)
		if d.Outcome != w.outcome || d.ErrorCode != w.code {
			t.Errorf("%s: got %s/%q, want %s/%q", code, d.Outcome, d.ErrorCode, w.outcome, w.code)
		}
		if d.RailCode != code || d.Reference != "ref-1" || d.RetryAfter != time.Second || !d.RailCalled || !d.Answered {
			t.Errorf("%s: answer not carried into the decision: %+v", code, d)
		}
	}
}

func TestDecideUnknownCode(t *testing.T) {
	t.Parallel()
	for _, code := range []string{"PENDING_REVIEW", "", "accepted"} { // codes are case-sensitive
		d := rails.SandboxCodes.Decide(rails.Result{Code: code}, nil)
		if d.Outcome != rails.Retryable || d.ErrorCode != rails.CodeUnknownRailCode || d.RailCode != code || !d.RailCalled || !d.Answered {
			t.Errorf("code %q: got %+v", code, d)
		}
	}
}

// refusedDial returns a real connection-refused error by dialling a local
// port that was just closed.
func refusedDial(t *testing.T) error {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Skipf("no loopback: %v", err)
	}
	addr := ln.Addr().String()
	ln.Close()
	conn, err := net.Dial("tcp", addr)
	if err == nil {
		conn.Close()
		t.Skip("closed port was reused")
	}
	return err
}

func TestDecideErrors(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 0)
	defer cancel()
	<-ctx.Done()
	refused := refusedDial(t)
	for _, tc := range []struct {
		name       string
		err        error
		outcome    rails.Outcome
		code       rails.ErrorCode
		railCalled bool
		field      string
	}{
		{"deadline", context.DeadlineExceeded, rails.Retryable, rails.CodeRailTimeout, true, ""},
		{"wrapped deadline", fmt.Errorf("post: %w", context.DeadlineExceeded), rails.Retryable, rails.CodeRailTimeout, true, ""},
		{"context deadline", ctx.Err(), rails.Retryable, rails.CodeRailTimeout, true, ""},
		{"unavailable", rails.ErrUnavailable, rails.Retryable, rails.CodeRailUnavailable, false, ""},
		{"wrapped unavailable", fmt.Errorf("sandbox: %w", rails.ErrUnavailable), rails.Retryable, rails.CodeRailUnavailable, false, ""},
		{"connection refused", refused, rails.Retryable, rails.CodeRailUnavailable, false, ""},
		{"wrapped connection refused", fmt.Errorf("webhook: %w", refused), rails.Retryable, rails.CodeRailUnavailable, false, ""},
		{"dns", &net.DNSError{Err: "no such host", Name: "rail.invalid", IsNotFound: true}, rails.Retryable, rails.CodeRailUnavailable, false, ""},
		{"circuit open", fmt.Errorf("rail %q: %w", "ach", rails.ErrCircuitOpen), rails.Retryable, rails.CodeCircuitOpen, false, ""},
		{"validation", &payment.ValidationError{Field: payment.FieldCurrency, Reason: payment.ReasonUnknownCurrency, Message: "DEM"}, rails.Failed, rails.CodeValidationFailed, false, payment.FieldCurrency},
		{"wrapped validation", fmt.Errorf("ach: %w", payment.ValidateABA("021000022")), rails.Failed, rails.CodeValidationFailed, false, payment.FieldDestination},
		{"other", errors.New("unexpected EOF"), rails.Retryable, rails.CodeRailTransport, true, ""},
		{"reset", &net.OpError{Op: "read", Net: "tcp", Err: errors.New("connection reset by peer")}, rails.Retryable, rails.CodeRailTransport, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// An answer code next to an error is ignored: no answer was obtained.
			d := rails.SandboxCodes.Decide(rails.Result{Code: rails.SandboxAccepted}, tc.err)
			if d.Outcome != tc.outcome || d.ErrorCode != tc.code || d.RailCalled != tc.railCalled || d.Field != tc.field || d.Answered {
				t.Fatalf("got %s/%s railCalled=%v field=%q answered=%v, want %s/%s railCalled=%v field=%q, not answered",
					d.Outcome, d.ErrorCode, d.RailCalled, d.Field, d.Answered, tc.outcome, tc.code, tc.railCalled, tc.field)
			}
		})
	}
}

// TestDecideIgnoresText: errors and messages that merely say "timeout",
// "refused" or "accepted" decide nothing.
func TestDecideIgnoresText(t *testing.T) {
	t.Parallel()
	for _, text := range []string{
		"i/o timeout",
		"context deadline exceeded",
		"dial tcp 10.0.0.1:443: connect: connection refused",
		rails.ErrUnavailable.Error(),
		rails.ErrCircuitOpen.Error(),
		"invalid currency: validation failed",
	} {
		d := rails.SandboxCodes.Decide(rails.Result{}, errors.New(text))
		if d.ErrorCode != rails.CodeRailTransport || d.Outcome != rails.Retryable || !d.RailCalled {
			t.Errorf("%q: got %+v, want a retryable RAIL_TRANSPORT_ERROR", text, d)
		}
	}
	for _, res := range []rails.Result{
		{Code: rails.SandboxRejected, Message: "ACCEPTED"},
		{Code: "UNKNOWN", Message: "payment accepted"},
		{Code: rails.SandboxAccepted, Message: "rejected: insufficient funds"},
	} {
		d := rails.SandboxCodes.Decide(res, nil)
		want := rails.SandboxCodes[res.Code].Outcome
		if want == "" {
			want = rails.Retryable
		}
		if d.Outcome != want {
			t.Errorf("%+v: outcome %s, want %s", res, d.Outcome, want)
		}
	}
}

// TestDecideCapsRetryAfter: whatever the transport, a rail's requested
// delay is kept within [0, MaxRetryAfter]; before, a Go transport's was
// taken whole, however large or negative.
func TestDecideCapsRetryAfter(t *testing.T) {
	t.Parallel()
	for asked, want := range map[time.Duration]time.Duration{
		-time.Hour:                   0,
		0:                            0,
		90 * time.Second:             90 * time.Second,
		rails.MaxRetryAfter:          rails.MaxRetryAfter,
		1000 * time.Hour:             rails.MaxRetryAfter,
		time.Duration(math.MaxInt64): rails.MaxRetryAfter,
	} {
		d := rails.SandboxCodes.Decide(rails.Result{Code: rails.SandboxRateLimited, RetryAfter: asked}, nil)
		if d.RetryAfter != want {
			t.Errorf("RetryAfter %s decided as %s, want %s", asked, d.RetryAfter, want)
		}
	}
}
