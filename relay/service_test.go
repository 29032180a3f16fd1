package relay_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ledgerline/outbox/attempts"
	"github.com/ledgerline/outbox/engine"
	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/pending"
	"github.com/ledgerline/outbox/rails"
	"github.com/ledgerline/outbox/reaper"
	"github.com/ledgerline/outbox/relay"
)

// startStopper is the contract the relayer, the reaper and the service
// share.
type startStopper interface {
	Start(ctx context.Context) error
	Stop(ctx context.Context) error
}

type bundle struct {
	ctx  context.Context
	pool *pgxpool.Pool
	set  *rails.Set
}

func setup(t *testing.T) *bundle {
	t.Helper()
	set, err := rails.NewSet(rails.Options{Type: "sandbox", Profile: payment.Generic{}, Transport: rails.NewSandbox(rails.SandboxOptions{})})
	if err != nil {
		t.Fatal(err)
	}
	return &bundle{ctx: t.Context(), pool: testdb.New(t), set: set}
}

// services returns one of each kind of service on the bundle's database.
func (b *bundle) services(t *testing.T) map[string]startStopper {
	t.Helper()
	r, err := engine.New(b.pool, engine.Config{Rails: b.set, PollInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rp, err := reaper.New(b.pool, reaper.Config{Interval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := relay.New(b.pool, relay.Config{Relayer: engine.Config{Rails: b.set, PollInterval: 50 * time.Millisecond},
		Reaper: reaper.Config{Interval: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	return map[string]startStopper{"relayer": r, "reaper": rp, "service": svc}
}

// TestStartStopContract: the same answers from the relayer, the reaper and
// the service: stop before start is a no-op, a second start is
// relay.ErrAlreadyStarted (the sentinel a program can name: the contract's
// own lives in an internal package), double stop is a no-op, start after stop runs again
// (and does work: an instruction enqueued after the restart is
// dispatched).
func TestStartStopContract(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for name, s := range b.services(t) {
		if err := s.Stop(b.ctx); err != nil {
			t.Errorf("%s: stop before start: %v", name, err)
		}
		if err := s.Start(b.ctx); err != nil {
			t.Fatalf("%s: start: %v", name, err)
		}
		if err := s.Start(b.ctx); !errors.Is(err, relay.ErrAlreadyStarted) {
			t.Errorf("%s: second start: %v, want ErrAlreadyStarted", name, err)
		}
		if err := s.Stop(b.ctx); err != nil {
			t.Errorf("%s: stop: %v", name, err)
		}
		if err := s.Stop(b.ctx); err != nil {
			t.Errorf("%s: double stop: %v", name, err)
		}
		if err := s.Start(b.ctx); err != nil {
			t.Errorf("%s: start after stop: %v", name, err)
		}
		if name != "reaper" {
			waitDispatched(t, b, name)
		}
		if err := s.Stop(b.ctx); err != nil {
			t.Errorf("%s: final stop: %v", name, err)
		}
	}
}

// waitDispatched enqueues one instruction and waits until it is
// dispatched: the restarted service does work.
func waitDispatched(t *testing.T, b *bundle, key string) {
	t.Helper()
	rc, err := pending.Enqueue(b.ctx, b.pool, pending.Instruction{InstructionID: key, ParticipantID: key, IdempotencyKey: key,
		RailType: "sandbox", AmountMinor: 100, Currency: "USD", Destination: "acct-1"})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox.attempts WHERE outbox_id = $1 AND state = 'DISPATCHED'`, rc.OutboxID).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the instruction enqueued after the restart was not dispatched", key)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestStartStopStress starts and stops the relayer, the reaper and the
// service from many goroutines at once (run under the race detector), while
// instructions are enqueued: nothing panics or deadlocks, every answer is
// one the contract allows, and after the final stops nothing is left in
// flight and the invariants hold (goroutine leaks fail the package, see
// testdb.Main).
func TestStartStopStress(t *testing.T) {
	t.Parallel()
	b := setup(t)
	svcs := b.services(t)
	var wg sync.WaitGroup
	for name, s := range svcs {
		for g := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 15 {
					var err error
					if (g+i)%2 == 0 {
						err = s.Start(b.ctx)
						if errors.Is(err, relay.ErrAlreadyStarted) {
							err = nil
						}
					} else {
						ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
						err = s.Stop(ctx)
						cancel()
					}
					if err != nil {
						t.Errorf("%s: %v", name, err)
						return
					}
				}
			}()
		}
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range 50 {
			key := "stress-" + string(rune('a'+i%26)) + time.Now().Format("150405.000000")
			if _, err := pending.Enqueue(b.ctx, b.pool, pending.Instruction{InstructionID: key, ParticipantID: "p",
				IdempotencyKey: key, RailType: "sandbox", AmountMinor: 100, Currency: "USD", Destination: "acct-1"}); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	wg.Wait()
	for name, s := range svcs {
		if err := s.Stop(b.ctx); err != nil {
			t.Errorf("%s: final stop: %v", name, err)
		}
	}
	// Every stop let its dispatches finish and recorded them: nothing is
	// left in flight, and the invariants hold.
	archive, _ := attempts.New("")
	rep, err := archive.Verify(b.ctx, b.pool, attempts.VerifyOptions{Ordered: true})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() || rep.InFlight != 0 {
		t.Fatalf("after the stress: %d in flight, violations %v", rep.InFlight, rep.Violations)
	}
}

// TestStopWithDoneContextStopsEverything: a program that stops the service
// with the context whose cancellation told it to stop gets every part of
// it stopped (dispatches in progress cut off, as at a deadline). Before,
// the service's Stop and then the relayer's raced the done context for
// their start/stop token, and most such Stops returned the context's error
// with the service or its relayer still running.
func TestStopWithDoneContextStopsEverything(t *testing.T) {
	t.Parallel()
	b := setup(t)
	svc, err := relay.New(b.pool, relay.Config{Relayer: engine.Config{Rails: b.set, PollInterval: 50 * time.Millisecond},
		Reaper: reaper.Config{Interval: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	done, cancel := context.WithCancel(b.ctx)
	cancel()
	for i := range 20 {
		if err := svc.Start(b.ctx); err != nil {
			t.Fatalf("start %d: %v", i, err)
		}
		_ = svc.Stop(done)
		if svc.Relayer().Health().Running {
			t.Fatalf("stop %d with a done context left the relayer running", i)
		}
	}
}

// TestNewRefusesABadConfig: New answers a configuration the service cannot
// run with an error wrapping relay.ErrInvalidConfig, before anything runs.
// A nil pool with NoReaper was accepted, and Start then panicked inside
// pgxpool; the relayer's own refusals (no rails, a bad schema) could not be
// told from other errors.
func TestNewRefusesABadConfig(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for name, c := range map[string]struct {
		pool *pgxpool.Pool
		cfg  relay.Config
	}{
		"nil pool":            {nil, relay.Config{Relayer: engine.Config{Rails: b.set}}},
		"nil pool, no reaper": {nil, relay.Config{Relayer: engine.Config{Rails: b.set}, NoReaper: true}},
		"no rails":            {b.pool, relay.Config{}},
		"bad schema":          {b.pool, relay.Config{Relayer: engine.Config{Rails: b.set, Schema: "public"}}},
		"reaper interval":     {b.pool, relay.Config{Relayer: engine.Config{Rails: b.set}, Reaper: reaper.Config{Interval: time.Millisecond}}},
		"backoff cap too low": {b.pool, relay.Config{Relayer: engine.Config{Rails: b.set, BackoffBase: time.Minute, BackoffCap: time.Second}}},
		// Negative values were taken for the defaults, hiding the mistake.
		"negative batch size":   {b.pool, relay.Config{Relayer: engine.Config{Rails: b.set, BatchSize: -1}}},
		"negative stop timeout": {b.pool, relay.Config{Relayer: engine.Config{Rails: b.set, StopTimeout: -time.Second}}},
		"negative gauge age":    {b.pool, relay.Config{Relayer: engine.Config{Rails: b.set}, QueueGaugesMaxAge: -time.Second}},
	} {
		svc, err := relay.New(c.pool, c.cfg)
		if !errors.Is(err, relay.ErrInvalidConfig) || svc != nil {
			t.Errorf("%s: New returned %v, %v; want an error wrapping ErrInvalidConfig", name, svc, err)
		}
		if c.pool != nil && c.cfg.QueueGaugesMaxAge == 0 && c.cfg.Reaper.Interval == 0 && !errors.Is(err, engine.ErrInvalidConfig) {
			t.Errorf("%s: New = %v; want the relayer's refusal, engine.ErrInvalidConfig, in it too", name, err)
		}
		if c.cfg.Reaper.Interval != 0 && !errors.Is(err, reaper.ErrInvalidConfig) {
			t.Errorf("%s: New = %v; want the reaper's refusal, reaper.ErrInvalidConfig, in it too", name, err)
		}
		// Said once: it read "relay: invalid config: engine: invalid config: ...".
		if err != nil && strings.Count(err.Error(), "invalid config") != 1 {
			t.Errorf("%s: New = %q; want it to say invalid config once", name, err)
		}
	}
}

// TestNewRegistersAllOrNothing: a New that fails to register its
// collectors on Config.Metrics (a name the program's registry already has)
// leaves none of them there. It left those registered before the clash,
// so a program that fixed the clash and called New again failed on its
// own earlier registration.
func TestNewRegistersAllOrNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	registry := prometheus.NewRegistry()
	clash := prometheus.NewCounter(prometheus.CounterOpts{Name: "outbox_claimed_total", Help: "Instructions claimed."})
	registry.MustRegister(clash)
	cfg := relay.Config{Relayer: engine.Config{Rails: b.set}, Metrics: registry}
	if _, err := relay.New(b.pool, cfg); err == nil {
		t.Fatal("New registered a collector whose name the registry has")
	}
	registry.Unregister(clash)
	if _, err := relay.New(b.pool, cfg); err != nil {
		t.Fatalf("New after the clash was removed: %v", err)
	}
}
