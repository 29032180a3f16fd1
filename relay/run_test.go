package relay_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ledgerline/outbox/engine"
	"github.com/ledgerline/outbox/reaper"
	"github.com/ledgerline/outbox/relay"
)

// TestRunReturnsWhenStoppedElsewhere: a Run of the relayer, the reaper or
// the service that another goroutine stops (a program's shutdown hook
// calling Stop) returns, nil, once that Stop has ended. It went on
// waiting for its context, so a program that ran one with a context never
// cancelled kept the Run goroutine after Stop for good, and a later
// cancellation stopped it again if it had been restarted meanwhile.
func TestRunReturnsWhenStoppedElsewhere(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for name, s := range b.services(t) {
		runner := s.(interface {
			Run(ctx context.Context) error
			Stop(ctx context.Context) error
			Start(ctx context.Context) error
		})
		// Cancelled only if Run fails to return, so that the test ends.
		runCtx, cancel := context.WithCancel(context.Background())
		ran := make(chan error, 1)
		go func() { ran <- runner.Run(runCtx) }()
		for !started(s) {
			select {
			case err := <-ran:
				t.Fatalf("%s: Run returned before it was stopped: %v", name, err)
			case <-time.After(10 * time.Millisecond):
			}
		}
		if err := runner.Stop(b.ctx); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		select {
		case err := <-ran:
			if err != nil {
				t.Errorf("%s: Run stopped elsewhere: %v, want nil", name, err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("%s: Run did not return after it was stopped", name)
			cancel()
			<-ran
		}
		cancel()
	}
}

// started reports whether s runs (the reaper: once it made a pass).
func started(s startStopper) bool {
	switch s := s.(type) {
	case *engine.Relayer:
		return s.Health().Running
	case *reaper.Reaper:
		return s.Stats().Passes > 0
	case *relay.Service:
		return s.Relayer().Health().Running
	}
	panic(fmt.Sprintf("%T", s))
}
