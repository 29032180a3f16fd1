package admin

import (
	"fmt"
	"testing"
	"time"
)

// TestThrottleTableIsBounded: failures from more addresses than the table
// holds (a guesser with many addresses) leave it at its bound, and the
// addresses of one IPv6 /64 count as one source.
func TestThrottleTableIsBounded(t *testing.T) {
	t.Parallel()
	var g guesses
	now := time.Now()
	for i := range 3 * maxThrottledSources {
		g.fail(fmt.Sprintf("10.%d.%d.%d:4000", i>>16&255, i>>8&255, i&255), now)
	}
	if n := g.len(); n > maxThrottledSources {
		t.Fatalf("%d sources kept, want at most %d", n, maxThrottledSources)
	}
	var h guesses
	for i := range AuthFailureLimit {
		h.fail(fmt.Sprintf("[2001:db8::%x]:4000", i+1), now)
	}
	if _, throttled := h.throttled("[2001:db8::ffff]:1", now); !throttled {
		t.Error("one /64's addresses are counted apart")
	}
	if _, throttled := h.throttled("[2001:db8:0:1::1]:1", now); throttled {
		t.Error("another /64 is throttled")
	}
}
