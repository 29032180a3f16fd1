package engine

import (
	"testing"

	"github.com/ledgerline/outbox/internal/store"
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
