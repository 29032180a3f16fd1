package engine

import (
	"errors"
	"testing"
	"time"

	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/rails"
)

// sandboxSet is a one-rail set for tests that need no database.
func sandboxSet(t *testing.T) *rails.Set {
	t.Helper()
	set, err := rails.NewSet(rails.Options{Type: "sandbox", Profile: payment.Generic{}, Transport: rails.NewSandbox(rails.SandboxOptions{})})
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// TestConfigRefusesNegatives: a negative count or duration is a mistake
// (a sign flipped, an unset flag parsed as -1), not a request for the
// default, so New refuses it with ErrInvalidConfig; zero still means the
// default. Before, every negative value silently became the default.
func TestConfigRefusesNegatives(t *testing.T) {
	t.Parallel()
	set := sandboxSet(t)
	for name, negate := range map[string]func(*Config){
		"BatchSize":      func(c *Config) { c.BatchSize = -1 },
		"MaxConcurrency": func(c *Config) { c.MaxConcurrency = -1 },
		"PollInterval":   func(c *Config) { c.PollInterval = -time.Second },
		"Debounce":       func(c *Config) { c.Debounce = -time.Millisecond },
		"IdleRefresh":    func(c *Config) { c.IdleRefresh = -time.Second },
		"ReconnectDelay": func(c *Config) { c.ReconnectDelay = -time.Second },
		"LeaseGrace":     func(c *Config) { c.LeaseGrace = -time.Second },
		"BackoffBase":    func(c *Config) { c.BackoffBase = -time.Second },
		"BackoffCap":     func(c *Config) { c.BackoffCap = -time.Second },
		"MaxAttempts":    func(c *Config) { c.MaxAttempts = -1 },
		"MaxErrorLength": func(c *Config) { c.MaxErrorLength = -1 },
		"FlushSize":      func(c *Config) { c.FlushSize = -1 },
		"OutcomeWriters": func(c *Config) { c.OutcomeWriters = -1 },
		"StopTimeout":    func(c *Config) { c.StopTimeout = -time.Second },
	} {
		cfg := Config{Rails: set}
		negate(&cfg)
		if _, err := New(nil, cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("negative %s: New = %v, want an error wrapping ErrInvalidConfig", name, err)
		}
	}
	r, err := New(nil, Config{Rails: set})
	if err != nil {
		t.Fatalf("zero config: %v", err)
	}
	if r.cfg.BatchSize != DefaultBatchSize || r.cfg.StopTimeout != DefaultStopTimeout {
		t.Errorf("zero config got %d, %v; want the defaults", r.cfg.BatchSize, r.cfg.StopTimeout)
	}
}

// TestConfigErrorsAreTyped: every configuration New refuses wraps
// ErrInvalidConfig, so a caller can tell a bad Config from anything else.
func TestConfigErrorsAreTyped(t *testing.T) {
	t.Parallel()
	set := sandboxSet(t)
	longSet, err := rails.NewSet(rails.Options{Type: "sandbox", Profile: payment.Generic{}, Transport: rails.NewSandbox(rails.SandboxOptions{}),
		Timeout: 2_000_000 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	for name, cfg := range map[string]Config{
		"no rails":           {},
		"invalid schema":     {Rails: set, Schema: "no such; schema"},
		"stale IdleRefresh":  {Rails: set, IdleRefresh: 8 * time.Second},
		"cap below the base": {Rails: set, BackoffBase: time.Minute, BackoffCap: time.Second},
		// A lease (the rail's timeout plus the grace) past time.Duration's
		// range wrapped to a negative one: every claim was over before it
		// began, released unsent and reaped, again and again.
		"lease beyond a Duration": {Rails: longSet, LeaseGrace: 1_000_000 * time.Hour},
	} {
		if _, err := New(nil, cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: New = %v, want an error wrapping ErrInvalidConfig", name, err)
		}
	}
}

// TestConfigRefusesALeaseGraceBelowItsFloor: the grace is what is left,
// after a rail call's deadline, to record its outcome before the lease
// ends and the reaper may hand the instruction to another relayer (half
// of it: the call may run to the lease less half the grace). A grace of a
// few milliseconds was accepted: a call that ran to its deadline had its
// outcome written after the lease had ended, a live relayer's claim was
// reaped while it wrote, and the instruction was sent again. Below
// MinLeaseGrace it is refused; 0 still means the default.
func TestConfigRefusesALeaseGraceBelowItsFloor(t *testing.T) {
	t.Parallel()
	set := sandboxSet(t)
	for _, grace := range []time.Duration{time.Nanosecond, time.Millisecond, MinLeaseGrace - 1} {
		if _, err := New(nil, Config{Rails: set, LeaseGrace: grace}); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("LeaseGrace %v: New = %v, want an error wrapping ErrInvalidConfig", grace, err)
		}
	}
	for _, grace := range []time.Duration{0, MinLeaseGrace} {
		if _, err := New(nil, Config{Rails: set, LeaseGrace: grace}); err != nil {
			t.Errorf("LeaseGrace %v: %v", grace, err)
		}
	}
}

// TestConfigRefusesAPollIntervalPastItsCeiling: a poll interval past
// MaxPollInterval is refused. Past about 240 years the ±20% jitter
// wrapped to a negative wait, and the relayer polled without pause, the
// opposite of what was asked; well before that, an interval given in the
// wrong unit leaves instructions a NOTIFY missed undispatched for days.
func TestConfigRefusesAPollIntervalPastItsCeiling(t *testing.T) {
	t.Parallel()
	set := sandboxSet(t)
	for _, d := range []time.Duration{MaxPollInterval + 1, 250 * 365 * 24 * time.Hour} {
		if _, err := New(nil, Config{Rails: set, PollInterval: d}); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("PollInterval %v: New = %v, want an error wrapping ErrInvalidConfig", d, err)
		}
	}
	if _, err := New(nil, Config{Rails: set, PollInterval: MaxPollInterval}); err != nil {
		t.Errorf("PollInterval %v: %v", MaxPollInterval, err)
	}
}

// TestConfigRefusesADebounceLongerThanThePoll: Debounce is how long a
// notification's claim waits after the last one, and the first hot poll;
// past the poll interval it made a woken relayer wait longer than the
// poll it stood in for (the poll is the source of truth), and, shifted
// left by each empty claim, a long one wrapped to a negative hot poll:
// claims without pause. It is refused; equal to the poll is accepted.
func TestConfigRefusesADebounceLongerThanThePoll(t *testing.T) {
	t.Parallel()
	set := sandboxSet(t)
	for _, c := range []Config{
		{Rails: set, Debounce: DefaultPollInterval + 1},
		{Rails: set, PollInterval: time.Second, Debounce: time.Minute},
		{Rails: set, Debounce: 10 * 24 * time.Hour},
	} {
		if _, err := New(nil, c); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("Debounce %v, PollInterval %v: New = %v, want an error wrapping ErrInvalidConfig", c.Debounce, c.PollInterval, err)
		}
	}
	if _, err := New(nil, Config{Rails: set, PollInterval: time.Second, Debounce: time.Second}); err != nil {
		t.Errorf("Debounce equal to PollInterval: %v", err)
	}
}

// TestStartWithoutPool: New accepts a nil pool (RelayOnce runs on the
// caller's transaction), but a relayer without one cannot run: Start and
// Run refuse with ErrNoPool and nothing runs. Before, Start panicked
// inside pgx.
func TestStartWithoutPool(t *testing.T) {
	t.Parallel()
	r, err := New(nil, Config{Rails: sandboxSet(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(t.Context()); !errors.Is(err, ErrNoPool) {
		t.Errorf("Start without a pool = %v, want an error wrapping ErrNoPool", err)
	}
	if r.lc.Running() || r.current.Load() != nil {
		t.Error("running after Start refused")
	}
	if err := r.Run(t.Context()); !errors.Is(err, ErrNoPool) {
		t.Errorf("Run without a pool = %v, want an error wrapping ErrNoPool", err)
	}
	if err := r.Stop(t.Context()); err != nil {
		t.Errorf("Stop after a refused Start: %v", err)
	}
}

// TestStartTwice: Start on a running relayer wraps the exported
// ErrAlreadyStarted, the name a program can test for.
func TestStartTwice(t *testing.T) {
	t.Parallel()
	b := setup(t, rails.SandboxOptions{})
	r := b.start(t, b.config("twice"))
	if err := r.Start(b.ctx); !errors.Is(err, ErrAlreadyStarted) {
		t.Errorf("second Start = %v, want an error wrapping ErrAlreadyStarted", err)
	}
}
