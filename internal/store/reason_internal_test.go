package store

import (
	"strings"
	"testing"
	"time"
)

// TestReasonCountsAttemptsInWords: the participant view's reason says "1
// attempt", not "1 attempts": operators read it on the console.
func TestReasonCountsAttemptsInWords(t *testing.T) {
	t.Parallel()
	next := time.Date(2026, 11, 29, 2, 6, 44, 0, time.UTC)
	for n, want := range map[int]string{1: "after 1 attempt ", 2: "after 2 attempts "} {
		got := reason(&Queued{State: "retry_wait", SequenceID: 1, AttemptCount: n, NextAttempt: &next}, "RAIL_TIMEOUT")
		if !strings.Contains(got, want) {
			t.Errorf("%d attempts: %q, want %q in it", n, got, want)
		}
	}
}

// TestReasonTimesAsTheConsoleShowsThem: the reason's times read as the
// console's other times (UTC, to the millisecond, zone named): a lease of
// a few hundred milliseconds no longer shows as claimed and run out at
// the same second.
func TestReasonTimesAsTheConsoleShowsThem(t *testing.T) {
	t.Parallel()
	claimed := time.Date(2026, 11, 29, 0, 56, 11, 189_000_000, time.UTC)
	until := claimed.Add(300 * time.Millisecond)
	got := reason(&Queued{State: "stuck", SequenceID: 1, RelayerID: "r1", ClaimedAt: &claimed, LeaseUntil: &until}, "")
	for _, want := range []string{"2026-11-29 00:56:11.189 UTC", "2026-11-29 00:56:11.489 UTC"} {
		if !strings.Contains(got, want) {
			t.Errorf("%q lacks %q", got, want)
		}
	}
}
