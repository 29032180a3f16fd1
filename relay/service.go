// Package relay is the relay service a Go program embeds, the way River
// users embed a river.Client: a relayer (package engine: claim, dispatch,
// record), the zombie reaper that heals work of relayers that died
// (package reaper; it also keeps the archive's monthly partitions ahead),
// and, optionally, Prometheus collectors registered on the program's own
// registry. One [Config] with documented defaults, one start/stop contract.
// `outbox relay` is flags, then this Config, then [Service.Run].
package relay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ledgerline/outbox/engine"
	"github.com/ledgerline/outbox/internal/lifecycle"
	"github.com/ledgerline/outbox/reaper"
)

// ErrAlreadyStarted is wrapped by the error [Service.Start] returns on a
// running service. It is the one value every long-running outbox service
// returns for that: [engine.Relayer.Start] and [reaper.Reaper.Start] wrap
// it too (it is [engine.ErrAlreadyStarted] and [reaper.ErrAlreadyStarted]),
// so errors.Is with it answers for any of them. The start/stop contract's own package is internal, so this
// is the name a program can use.
var ErrAlreadyStarted = reaper.ErrAlreadyStarted

// ErrInvalidConfig is wrapped by the errors [New] returns for a
// configuration the service cannot run with: a nil pool, a negative
// QueueGaugesMaxAge, or a Config the relayer or the reaper refuses (no
// rails, an invalid schema, a negative count or duration, a reaper
// interval below [reaper.MinInterval], ...); errors.Is also finds the
// refusing package's own sentinel ([engine.ErrInvalidConfig],
// [reaper.ErrInvalidConfig]).
var ErrInvalidConfig = errors.New("invalid config")

// invalidConfigError is the relayer's or the reaper's refusal of its
// Config, which is also ErrInvalidConfig. It reads as that refusal, which
// already says "invalid config" ("relay: engine: invalid config: ..."),
// rather than saying it twice.
type invalidConfigError struct{ err error }

func (e invalidConfigError) Error() string   { return "relay: " + e.err.Error() }
func (e invalidConfigError) Unwrap() []error { return []error{ErrInvalidConfig, e.err} }

// Config configures a [Service]. Zero values are the documented defaults
// of the packages the fields come from.
type Config struct {
	// Relayer configures the relayer; Rails is required. Its Schema,
	// RelayerID and Logger are the reaper's too.
	Relayer engine.Config
	// Reaper configures the zombie reaper (default interval
	// [reaper.DefaultInterval], batch [reaper.DefaultBatchSize]). Its
	// Schema, ReaperID and Logger are taken from Relayer.
	Reaper reaper.Config
	// NoReaper leaves reaping (and partition upkeep) to other processes.
	// Some process must reap, or instructions of relayers that died stay in
	// flight forever.
	NoReaper bool
	// Metrics, if set, gets the service's collectors (see
	// [Service.Collectors]) registered by [New].
	Metrics prometheus.Registerer
	// QueueGaugesMaxAge is how old the queue gauges (outbox_pending_depth
	// and the others read from the queue snapshot) may be at a scrape
	// (0: 5 s; negative is refused). The snapshot counts the whole queue,
	// so one read serves every scrape of this process in that time.
	QueueGaugesMaxAge time.Duration
}

// Service runs a relayer and its reaper. Create it with [New]; run it with
// [Service.Start] and [Service.Stop] or [Service.Run]. Start, Stop and a
// restart follow the contract of every long-running outbox service: Start
// on a running service is an error wrapping [ErrAlreadyStarted], Stop on a
// stopped one a no-op, and a stopped service can be started again.
type Service struct {
	relayer *engine.Relayer
	reaper  *reaper.Reaper // nil with NoReaper
	metrics *Metrics
	cfg     Config
	lc      lifecycle.Lifecycle
}

// New validates cfg, builds the relayer and the reaper (nothing runs yet)
// and registers the collectors on cfg.Metrics if set: all of them, or, if
// one fails (a name the registry has already), none. A configuration it
// refuses is an error wrapping [ErrInvalidConfig].
func New(pool *pgxpool.Pool, cfg Config) (*Service, error) {
	if pool == nil {
		// The relayer would only find out at Start, inside pgxpool.
		return nil, fmt.Errorf("relay: %w: nil pool", ErrInvalidConfig)
	}
	if cfg.QueueGaugesMaxAge < 0 {
		return nil, fmt.Errorf("relay: %w: QueueGaugesMaxAge %v is negative (0 means the default)", ErrInvalidConfig, cfg.QueueGaugesMaxAge)
	}
	s := &Service{cfg: cfg}
	user := cfg.Relayer.OnRecorded
	cfg.Relayer.OnRecorded = func(recs []engine.Recorded) {
		s.metrics.observe(recs)
		if user != nil {
			user(recs)
		}
	}
	var err error
	if s.relayer, err = engine.New(pool, cfg.Relayer); err != nil {
		// engine.New fails on its Config only.
		return nil, invalidConfigError{err}
	}
	if !cfg.NoReaper {
		rc := cfg.Reaper
		rc.Schema, rc.ReaperID, rc.Logger = cfg.Relayer.Schema, s.relayer.ID(), cfg.Relayer.Logger
		if s.reaper, err = reaper.New(pool, rc); err != nil {
			return nil, invalidConfigError{err}
		}
	}
	if s.metrics, err = newMetrics(pool, s.relayer, s.reaper, cfg); err != nil {
		return nil, fmt.Errorf("relay: %w", err)
	}
	if cfg.Metrics != nil {
		for i, c := range s.Collectors() {
			if err := cfg.Metrics.Register(c); err != nil {
				// All or nothing: the ones registered already would make
				// the program's next New fail on them.
				for _, done := range s.Collectors()[:i] {
					cfg.Metrics.Unregister(done)
				}
				return nil, fmt.Errorf("relay: register metrics: %w", err)
			}
		}
	}
	return s, nil
}

// Relayer returns the service's relayer.
func (s *Service) Relayer() *engine.Relayer { return s.relayer }

// Reaper returns the service's reaper, nil with Config.NoReaper.
func (s *Service) Reaper() *reaper.Reaper { return s.reaper }

// Collectors returns the service's Prometheus collectors (see [Metrics]),
// for a program that registers them itself instead of through
// Config.Metrics.
func (s *Service) Collectors() []prometheus.Collector { return s.metrics.collectors() }

// HealBound is the longest a zombie (an instruction whose relayer died)
// can stay in flight before this configuration's reaper puts it back: the
// longest lease (a rail's timeout plus the lease grace) plus one reaper
// interval, defaults applied. Zero with NoReaper (another process's reaper
// decides) or without rails.
func (c Config) HealBound() time.Duration {
	if c.NoReaper || c.Relayer.Rails == nil {
		return 0
	}
	var longest time.Duration
	for _, t := range c.Relayer.Rails.Types() {
		longest = max(longest, c.Relayer.Rails.Timeout(t))
	}
	grace := c.Relayer.LeaseGrace
	if grace <= 0 {
		grace = engine.DefaultLeaseGrace
	}
	interval := c.Reaper.Interval
	if interval <= 0 {
		interval = reaper.DefaultInterval
	}
	return longest + grace + interval
}

// Start starts the relayer (which first checks the database and refuses
// errors no retry can fix) and then the reaper. ctx is for start-up only.
func (s *Service) Start(ctx context.Context) error {
	_, err := s.start(ctx)
	return err
}

// start is Start; it also returns a channel closed once this start's
// service has been stopped, by whichever Stop, for Run to return on.
func (s *Service) start(ctx context.Context) (<-chan struct{}, error) {
	stopped, err := s.lc.StartDone(ctx, func(ctx context.Context) (lifecycle.StopFunc, error) {
		if err := s.relayer.Start(ctx); err != nil {
			return nil, err
		}
		if s.reaper != nil {
			if err := s.reaper.Start(ctx); err != nil {
				return nil, errors.Join(err, s.relayer.Stop(context.WithoutCancel(ctx)))
			}
		}
		return s.stop, nil
	})
	if err != nil {
		return nil, fmt.Errorf("relay: %w", err)
	}
	return stopped, nil
}

// stop stops the relayer gracefully (ctx is its hard deadline, see
// [engine.Relayer.Stop]), then the reaper.
func (s *Service) stop(ctx context.Context) error {
	e := &stopError{relayer: s.relayer.Stop(ctx)}
	if s.reaper != nil {
		// The reaper's pass is cut off and rolls back; it needs no grace.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		e.reaper = s.reaper.Stop(rctx)
	}
	if e.relayer == nil && e.reaper == nil {
		return nil
	}
	return e
}

// stopError keeps the relayer's and the reaper's stop errors apart, so
// that Run can forgive the relayer's hard deadline without dropping the
// reaper's error, which is a deadline exceeded too when the reaper did not
// stop in time.
type stopError struct{ relayer, reaper error }

func (e *stopError) Error() string { return errors.Join(e.relayer, e.reaper).Error() }

// Unwrap lets errors.Is and errors.As see both errors.
func (e *stopError) Unwrap() []error {
	var errs []error
	for _, err := range []error{e.relayer, e.reaper} {
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// Stop stops the service: the relayer gracefully, with ctx as the hard
// deadline for dispatches in progress, then the reaper. Stop on a service
// that is not running returns nil.
func (s *Service) Stop(ctx context.Context) error { return s.lc.Stop(ctx) }

// Run starts the service, runs until ctx is cancelled, then stops it with
// the relayer's StopTimeout (default [engine.DefaultStopTimeout]) as the
// hard deadline. A dispatch cut off at that deadline is not an error (the
// relayer records it as a CUT_OFF_AT_STOP retry, or leaves it leased for
// the reaper); a reaper that did not stop in time is. A service stopped
// meanwhile by [Service.Stop] (a program's shutdown hook) ends Run too,
// once that Stop has ended: Run returns nil, and that Stop reports its own
// errors.
func (s *Service) Run(ctx context.Context) error {
	stopped, err := s.start(ctx)
	if err != nil {
		return err
	}
	select {
	case <-ctx.Done():
	case <-stopped:
		// Without this, the goroutine running Run outlived the service,
		// and a later cancellation stopped it again if it had been
		// restarted meanwhile.
		return nil
	}
	timeout := s.cfg.Relayer.StopTimeout
	if timeout <= 0 {
		timeout = engine.DefaultStopTimeout
	}
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	return runStopError(s.Stop(stopCtx))
}

// runStopError is what Run reports of Stop's error: all of it but a
// dispatch cut off at the relayer's hard deadline.
func runStopError(err error) error {
	var e *stopError
	if errors.As(err, &e) {
		if errors.Is(e.relayer, context.DeadlineExceeded) {
			return e.reaper
		}
		return err
	}
	if errors.Is(err, context.DeadlineExceeded) {
		// Stop's wait for a concurrent Start or Stop ran out: that one
		// goes on.
		return nil
	}
	return err
}
