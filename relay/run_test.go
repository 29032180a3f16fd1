package relay_test

import (
	"context"
	"testing"
	"time"

	"github.com/ledgerline/outbox/engine"
	"github.com/ledgerline/outbox/reaper"
	"github.com/ledgerline/outbox/relay"
)

// TestRunReturnsWhenStoppedElsewhere: a Run whose service another
// goroutine stops (a program's shutdown hook calling Stop) returns, nil,
// once that Stop has ended. It went on waiting for its context, so a
// program that ran the service with one never cancelled kept the Run
// goroutine after Stop for good, and a later cancellation stopped the
// service again if it had been restarted meanwhile.
func TestRunReturnsWhenStoppedElsewhere(t *testing.T) {
	t.Parallel()
	b := setup(t)
	svc, err := relay.New(b.pool, relay.Config{Relayer: engine.Config{Rails: b.set, PollInterval: 50 * time.Millisecond},
		Reaper: reaper.Config{Interval: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	// Cancelled only if Run fails to return, so that the test ends.
	runCtx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ran := make(chan error, 1)
	go func() { ran <- svc.Run(runCtx) }()
	for !svc.Relayer().Health().Running {
		select {
		case err := <-ran:
			t.Fatalf("Run returned before it was stopped: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	if err := svc.Stop(b.ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-ran:
		if err != nil {
			t.Fatalf("Run of a service stopped elsewhere: %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("Run did not return after its service was stopped")
		cancel()
		<-ran
	}
}
