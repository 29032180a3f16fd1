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
