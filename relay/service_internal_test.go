package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
)

// TestRunReportsTheReapersStopError: Run forgives the relayer's hard stop
// deadline (a dispatch cut off is left for the reaper), but not the
// reaper's failure to stop, which is a deadline exceeded too: it was
// dropped whenever the relayer's stop had hit its deadline.
func TestRunReportsTheReapersStopError(t *testing.T) {
	t.Parallel()
	reaperErr := fmt.Errorf("reaper: stop: %w", context.DeadlineExceeded)
	relayerErr := fmt.Errorf("relayer: %w", context.DeadlineExceeded)
	for _, c := range []struct {
		name string
		err  error
		want error
	}{
		{"nothing", nil, nil},
		{"relayer cut off", &stopError{relayer: relayerErr}, nil},
		{"reaper late", &stopError{reaper: reaperErr}, reaperErr},
		{"both", &stopError{relayer: relayerErr, reaper: reaperErr}, reaperErr},
		{"relayer failed", &stopError{relayer: io.ErrUnexpectedEOF}, io.ErrUnexpectedEOF},
	} {
		got := runStopError(c.err)
		if (got == nil) != (c.want == nil) || c.want != nil && !errors.Is(got, c.want) {
			t.Errorf("%s: Run reports %v, want %v", c.name, got, c.want)
		}
	}
}
