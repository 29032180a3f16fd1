package engine

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/rails"
)

// TestBusyRelayerRegistersIdle: a relayer with a dispatch in flight (a
// slow rail) whose polls find nothing more registers idle all the same,
// so a new instruction of another participant is dispatched by NOTIFY at
// once, not at its 10 s poll (before, only a relayer with nothing in
// flight registered, and busy relayers heard of new work only by polling).
func TestBusyRelayerRegistersIdle(t *testing.T) {
	t.Parallel()
	b := setup(t, rails.SandboxOptions{})
	release := make(chan struct{})
	b.useTransport(t, funcTransport(func(ctx context.Context, ins payment.Instruction) (rails.Result, error) {
		if ins.ParticipantID == "slow" {
			select {
			case <-release:
			case <-ctx.Done():
				return rails.Result{}, ctx.Err()
			}
		}
		return rails.Result{Code: rails.SandboxAccepted, Reference: "ref-" + ins.IdempotencyKey}, nil
	}), time.Minute)
	defer close(release)
	cfg := b.config("busy")
	cfg.PollInterval = 10 * time.Second
	if _, err := b.producer.Enqueue(b.ctx, b.pool, instruction("slow", 1)); err != nil {
		t.Fatal(err)
	}
	r := b.start(t, cfg)
	b.waitInFlight(t, 1)
	b.waitRegisteredIdle(t, "busy")

	if _, err := b.producer.Enqueue(b.ctx, b.pool, instruction("fast", 1)); err != nil {
		t.Fatal(err)
	}
	b.waitDispatched(t, 1, 8*time.Second)
	if st := r.Stats(); st.Notifications == 0 || st.Polls != 0 {
		t.Fatalf("stats %+v: want dispatch by notification, before any poll", st)
	}
}

// TestSteadyStreamNeedsNoNotify: while claims keep finding work the
// relayer polls shortly after each (hot polls) and stays unregistered, so
// producers of a steady stream send no NOTIFY (its commit takes a
// cluster-wide lock) and are still picked up within milliseconds.
func TestSteadyStreamNeedsNoNotify(t *testing.T) {
	t.Parallel()
	b := setup(t, rails.SandboxOptions{})
	cfg := b.config("steady")
	cfg.PollInterval = 10 * time.Second
	cfg.Debounce = 20 * time.Millisecond // hot polls of 20, 40, 80 ms: room for a slow machine
	r := b.start(t, cfg)
	b.waitRegisteredIdle(t, "steady")
	// One instruction every 10 ms: the first is notified, the rest must be
	// found by hot polls with the relayer unregistered.
	const n = 100
	for i := range n {
		if _, err := b.producer.Enqueue(b.ctx, b.pool, instruction(fmt.Sprintf("p%d", i), 1)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	b.waitDispatched(t, n, 30*time.Second)
	st := r.Stats()
	t.Logf("stats %+v", st)
	if st.HotPolls == 0 || st.Polls != 0 {
		t.Fatalf("stats %+v: want the stream found by hot polls, with no fallback poll", st)
	}
	// A few registrations may slip in when the machine stalls the stream
	// for longer than three hot polls; one per instruction would mean the
	// producers paid NOTIFY throughout.
	if st.Notifications > n/4 {
		t.Fatalf("%d notifications for %d instructions: the relayer kept registering idle during a steady stream", st.Notifications, n)
	}
}

// TestIdleRegistrationWaitsForItsTimeOfNothing: a relayer registers idle
// (and every producer's commit then sends a NOTIFY, one notifying commit
// at a time in the whole cluster) only once its claims have found nothing
// for as long as three hot polls take (Debounce + 2 × Debounce + 4 ×
// Debounce). Claims prompted by freed slots come as fast as outcome
// writes, and counted as those hot polls, three of them in a few
// milliseconds registered a relayer whose stream had not stopped: at a
// steady 1,000/s, two registrations in three came sooner than that, half
// of them within 8-11 ms (docs/performance.md). Here a burst's outcomes
// come back over 150 ms in several writes, each prompting a claim that
// finds nothing.
func TestIdleRegistrationWaitsForItsTimeOfNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, rails.SandboxOptions{Seed: 1, LatencyMin: time.Millisecond, LatencyMax: 150 * time.Millisecond})
	cfg := b.config("nothing")
	cfg.PollInterval = 10 * time.Second
	cfg.IdleRefresh = 5 * time.Second // no refresh of a registration in between
	cfg.Debounce = 50 * time.Millisecond
	nothing := 7 * cfg.Debounce
	r, err := New(b.pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var registered []time.Time
	r.testHooks.beforeRegister = func() {
		mu.Lock()
		registered = append(registered, time.Now())
		mu.Unlock()
	}
	if err := r.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = r.Stop(ctx)
	})
	b.waitRegisteredIdle(t, "nothing")

	start := time.Now() // before the burst's commit, so before any claim that found it
	const n = 30
	b.enqueue(t, n, n)
	b.waitDispatched(t, n, 20*time.Second)
	// The first registration after the burst began, waited for (bounded)
	// rather than looked for after a fixed time: on a loaded machine the
	// claims that make up its time of nothing can come late.
	var first time.Time
	waitFor(t, 20*time.Second, "the relayer to register idle again after the burst", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, at := range registered {
			if at.After(start) {
				first = at
				return true
			}
		}
		return false
	})
	if d := first.Sub(start); d < nothing {
		t.Errorf("stats %+v: registered idle %s after the burst was enqueued, want at least %s of claims finding nothing",
			r.Stats(), d.Round(time.Millisecond), nothing)
	}
}
