// Package engine is the relayer: it wakes on NOTIFY (adaptively) or on a
// poll, claims due instructions, dispatches them to their rails with bounded
// concurrency and hard timeouts, and records outcomes in batches: retries
// with backoff, dead letters, strict per-participant ordering. Stop is
// graceful: claiming stops, dispatches finish up to a deadline, outcomes are
// flushed. A call the deadline cuts off before the rail answered is recorded
// by the stopping relayer itself, as a RETRYABLE attempt with error code
// CUT_OFF_AT_STOP (outcome unknown, not claimed again before its lease
// ends); one whose transport had sent nothing yet is RELEASED. Only what
// the stop cannot record (the database unreachable) stays leased for the
// reaper.
package engine

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/ledgerline/outbox/internal/lifecycle"
	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/rails"
)

// Defaults of Config.
const (
	DefaultBatchSize      = 100
	DefaultMaxConcurrency = 256
	DefaultPollInterval   = 500 * time.Millisecond
	DefaultDebounce       = 2 * time.Millisecond
	DefaultLeaseGrace     = 10 * time.Second
	DefaultBackoffBase    = time.Second
	DefaultBackoffCap     = 5 * time.Minute
	DefaultMaxAttempts    = 10
	DefaultMaxErrorLength = 2000
	DefaultFlushSize      = DefaultMaxConcurrency
	DefaultOutcomeWriters = 2
	DefaultIdleRefresh    = 3 * time.Second
	DefaultReconnectDelay = time.Second
	DefaultStopTimeout    = 30 * time.Second
)

// MinLeaseGrace is the shortest Config.LeaseGrace accepted. A rail call
// may run until its lease less half the grace, and the other half is
// what its outcome has to be written in before the lease ends and the
// reaper may hand the instruction to another relayer, which sends it
// again: a write held up behind another (see OutcomeWriters), a slow
// durable commit or a synchronous standby takes hundreds of
// milliseconds. Half a second is the least that leaves room for them.
const MinLeaseGrace = time.Second

// MaxPollInterval is the longest Config.PollInterval accepted. The poll
// is what finds the instructions a notification missed (and all of them
// with PollOnly): an hour is already a long time for a payment to wait,
// and a longer interval is a unit given wrong. Far past it the jitter
// wrapped: about 240 years polled without pause.
const MaxPollInterval = time.Hour

// MaxMinRetryDelay is the largest MinRetryDelay: as a rail's own
// Retry-After (rails.MaxRetryAfter), a floor must not park payments, and
// with ordering their participants' later ones, for longer than an hour.
const MaxMinRetryDelay = time.Hour

// claimBackoffCap is the longest wait between failed claims: long enough
// that a relayer fleet does not hammer a database that is down (or refusing
// logins), short enough to resume soon after it is back.
const claimBackoffCap = 5 * time.Second

// StopRecordTimeout is how long Stop keeps trying to record outcomes after
// the dispatches ended before it leaves them to the reaper.
const StopRecordTimeout = 10 * time.Second

// idleFreshness is how old a relayer_idle registration may be for the
// pending trigger to still notify (the interval in notify_pending()).
const idleFreshness = 10 * time.Second

// maxRailTextLength bounds the rail reference and rail code stored per
// attempt.
const maxRailTextLength = 1000

// ErrInvalidConfig is wrapped by the errors [New] returns for a Config it
// refuses: no rails, an invalid schema, a negative count or duration, a
// duration out of its range (LeaseGrace below MinLeaseGrace, PollInterval
// past MaxPollInterval), or values that contradict each other (Debounce
// longer than PollInterval).
var ErrInvalidConfig = errors.New("engine: invalid config")

// ErrNoPool is wrapped by the error [Relayer.Start] (and so [Relayer.Run])
// returns for a relayer made without a pool. Such a relayer is valid for
// [Relayer.RelayOnce], which runs on the caller's transaction, but it has
// nothing to claim, listen or record on of its own.
var ErrNoPool = errors.New("engine: relayer has no pool")

// ErrAlreadyStarted is wrapped by the error [Relayer.Start] returns on a
// running relayer. It is the value every long-running outbox service
// returns for that (reaper.ErrAlreadyStarted and relay.ErrAlreadyStarted
// are the same), exported here because the start/stop contract's own
// package is internal.
var ErrAlreadyStarted = lifecycle.ErrAlreadyStarted

// Config configures a [Relayer]. Zero values mean the defaults above;
// negative ones are refused.
type Config struct {
	// Schema holding the outbox tables; "" means the default.
	Schema string
	// RelayerID names this relayer in attempt rows and logs; default
	// host-pid-random. It must name one running relayer: after a claim
	// whose commit reply was lost, the relayer takes its id's in-flight
	// rows of one claim transaction after the last claim it heard of for
	// that claim's and records them RELEASED (store.LostClaims), and the
	// claim of another process running under the same id (or a RelayOnce
	// pass under it) looks the same. Each run registers under its id
	// (relayer_runs), so the look leaves the rows to the reaper while
	// another run of the id may have made them, and a relayer that finds
	// another live run of its id says so: an ERROR line naming both,
	// Stats.IDConflicts, Health.SharedID. It still starts (a restart
	// under a fixed id finds the killed run's registration).
	RelayerID string
	// Rails are the rails this relayer dispatches to (required). Only
	// instructions of these rail types are claimed.
	Rails *rails.Set

	// BatchSize is the most instructions one claim takes.
	BatchSize int
	// MaxConcurrency caps the instructions this relayer holds: claimed and
	// not yet recorded (each rail's own cap limits concurrent calls on
	// top). A slot goes back when the outcome is recorded, or carries the
	// participant's next instruction (hand-off).
	MaxConcurrency int
	// PollInterval is the fallback poll (jittered by ±20%); polling is the
	// source of truth, NOTIFY only shortens the wait. At most
	// MaxPollInterval (an hour).
	PollInterval time.Duration
	// Debounce is the shortest time between two claims prompted by
	// notifications (a burst within it collapses into one claim at its
	// end; the first claims at once) and the first hot poll after a claim
	// that found work (see the claim loop). Like River's fetch cooldown.
	// At most PollInterval.
	Debounce time.Duration
	// PollOnly disables LISTEN (e.g. behind a transaction-pooling proxy).
	PollOnly bool
	// IdleRefresh is how often an idle relayer refreshes its registration
	// in relayer_idle. The trigger ignores registrations older than 10 s,
	// so at most 5 s is accepted (room for a slow refresh).
	IdleRefresh time.Duration
	// ReconnectDelay is the wait before the listener reconnects.
	ReconnectDelay time.Duration

	// LeaseGrace is added to a rail's timeout to form the lease; a call
	// may run until half of it is left, which is for recording its
	// outcome. At least MinLeaseGrace (1 s); 0 means the default (10 s).
	LeaseGrace time.Duration
	// BackoffBase, BackoffCap and MaxAttempts shape retries: full-jitter
	// exponential backoff; the MaxAttempts-th failed attempt is terminal.
	BackoffBase time.Duration
	BackoffCap  time.Duration
	MaxAttempts int
	// MinRetryDelay is the least time an instruction waits before it is
	// tried again after an attempt that did not settle it, whatever the
	// backoff drew (full jitter draws from zero up) or the rail asked for:
	// a floor under every retry, at most MaxMinRetryDelay. A release (a
	// claim handed back without calling the rail, as a stopping relayer
	// does) is not an attempt and stays due at once. 0, the default, is
	// no floor.
	MinRetryDelay time.Duration
	// Seed seeds the backoff jitter (0: random).
	Seed uint64

	// MaxErrorLength truncates stored error text (after secrets are
	// stripped).
	MaxErrorLength int
	// FlushSize is the most outcomes one write records. Writes are a group
	// commit: one starts as soon as an outcome arrives if none is in
	// progress, and takes everything that arrived meanwhile. The default
	// is DefaultMaxConcurrency: a relayer draining a backlog records all
	// it has in flight in one write, whose fixed cost (starting a dozen
	// statement nodes, a durable commit) is then paid once, not three
	// times.
	FlushSize int
	// OutcomeWriters is how many outcome writes may be in progress at
	// once, each on its own connection of the pool. A write that is not
	// full waits for the one in progress (what arrives meanwhile joins
	// it); a full one (FlushSize outcomes) starts at once if a writer is
	// free, and so does any once the one in progress is held up (it has
	// run four times as long as writes have been taking, and at least
	// 100 ms): a write held up by a lock or a slow commit then holds up at
	// most one more write's worth of outcomes. One makes every write wait
	// for the one before it.
	OutcomeWriters int
	// StopTimeout is Run's grace period for in-flight dispatches on stop.
	StopTimeout time.Duration

	// Logger receives one line per claim batch and per failed attempt.
	Logger *slog.Logger
	// OnRecorded, if set, is called after each outcome batch is committed,
	// for one batch at a time (never concurrently; keep it fast: the
	// writer that committed the batch waits for it).
	OnRecorded func([]Recorded)
}

// Outcome is how one claimed attempt ended, as the relayer records it: the
// instruction's identity, the attempt, and the rail's answer. Its State is
// one of the archive's states ([github.com/ledgerline/outbox/attempts.State]:
// Dispatched, Retryable or Failed).
type Outcome = store.Outcome

// Identity is who an instruction is and what it asks of its rail, as
// every [Outcome] repeats it.
type Identity = store.Identity

// Recorded is an outcome as committed, for observers (demo, benchmarks,
// metrics).
type Recorded struct {
	// Outcome is named here by its alias so that a program can build a
	// Recorded (to test its observer) without the internal package.
	Outcome
	// EnqueuedAt is the instruction's first enqueue and RecordedAt when
	// the outcome committed, both on the database's clock: RecordedAt is
	// reckoned from a recent claim of the relayer (its claimed_at plus the
	// time since by the relayer's clock, within half the shortest claim
	// round trip of the last minute), so that RecordedAt - EnqueuedAt
	// holds when the relayer host's clock is apart from the database's.
	EnqueuedAt, RecordedAt time.Time
	// Late is true when the lease had been reaped before the outcome was
	// recorded.
	Late bool
	// Absorbed is true (with Late) when the outcome was not archived: its
	// claim had an outcome already, under another outcome id (migration
	// 050). The relayer logs it at Error; nothing of the queue changed.
	Absorbed bool
}

// Result is what a recorded outcome meant for its instruction, as the
// relayer's counters, logs and metrics count it.
type Result string

// The results of a recorded outcome.
const (
	ResultDispatched Result = "dispatched" // the rail accepted it
	ResultRetried    Result = "retried"    // back to pending, after a backoff
	ResultDead       Result = "dead"       // a dead letter
	ResultReleased   Result = "released"   // handed back unsent (stopping relayer)
	ResultLate       Result = "late"       // its lease had been reaped: archived only
)

// Result classifies the outcome.
func (r Recorded) Result() Result {
	switch {
	case r.Late:
		return ResultLate
	case r.State == store.Dispatched:
		return ResultDispatched
	case r.State == store.Failed:
		return ResultDead
	case r.ErrorCode == string(rails.CodeReleased):
		return ResultReleased
	}
	return ResultRetried
}

func (c *Config) setDefaults() error {
	if err := c.validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if c.RelayerID == "" {
		c.RelayerID = lifecycle.ProcessID()
	}
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	defDur := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.BatchSize, DefaultBatchSize)
	def(&c.MaxConcurrency, DefaultMaxConcurrency)
	def(&c.MaxAttempts, DefaultMaxAttempts)
	def(&c.MaxErrorLength, DefaultMaxErrorLength)
	def(&c.FlushSize, DefaultFlushSize)
	def(&c.OutcomeWriters, DefaultOutcomeWriters)
	defDur(&c.PollInterval, DefaultPollInterval)
	defDur(&c.Debounce, DefaultDebounce)
	defDur(&c.IdleRefresh, DefaultIdleRefresh)
	defDur(&c.ReconnectDelay, DefaultReconnectDelay)
	defDur(&c.LeaseGrace, DefaultLeaseGrace)
	defDur(&c.BackoffBase, DefaultBackoffBase)
	defDur(&c.BackoffCap, DefaultBackoffCap)
	defDur(&c.StopTimeout, DefaultStopTimeout)
	if c.PollInterval > MaxPollInterval {
		return fmt.Errorf("%w: PollInterval %v is past %v: instructions a notification missed would wait that long", ErrInvalidConfig, c.PollInterval, MaxPollInterval)
	}
	if c.Debounce > c.PollInterval {
		// A woken relayer would wait longer than the poll it stands in
		// for. (Within MaxPollInterval, the hot polls' doubling of it,
		// 20 times at most, cannot wrap.)
		return fmt.Errorf("%w: Debounce %v is longer than PollInterval %v", ErrInvalidConfig, c.Debounce, c.PollInterval)
	}
	if c.LeaseGrace < MinLeaseGrace {
		return fmt.Errorf("%w: LeaseGrace %v is below %v: half of it is the time a call's outcome has to be recorded in before its lease ends and the instruction may be claimed again", ErrInvalidConfig, c.LeaseGrace, MinLeaseGrace)
	}
	if c.IdleRefresh > idleFreshness/2 {
		return fmt.Errorf("%w: IdleRefresh %v is too long: the trigger ignores registrations older than %v, so refresh at least every %v",
			ErrInvalidConfig, c.IdleRefresh, idleFreshness, idleFreshness/2)
	}
	for _, t := range c.Rails.Types() {
		// A lease past time.Duration's range would wrap to a negative one.
		if c.Rails.Timeout(t) > math.MaxInt64-c.LeaseGrace {
			return fmt.Errorf("%w: rail %q: its timeout %v plus LeaseGrace %v, the lease, is beyond %v",
				ErrInvalidConfig, t, c.Rails.Timeout(t), c.LeaseGrace, time.Duration(math.MaxInt64))
		}
	}
	if c.MinRetryDelay > MaxMinRetryDelay {
		return fmt.Errorf("%w: MinRetryDelay %v is past %v: every retry, and with ordering its participant's later instructions, would wait that long", ErrInvalidConfig, c.MinRetryDelay, MaxMinRetryDelay)
	}
	if c.BackoffCap < c.BackoffBase {
		return fmt.Errorf("%w: BackoffCap %v is below BackoffBase %v", ErrInvalidConfig, c.BackoffCap, c.BackoffBase)
	}
	if c.BatchSize > c.MaxConcurrency {
		c.BatchSize = c.MaxConcurrency
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// validate refuses what no default can stand for: no rails, an invalid
// schema, a negative count or duration. A negative value is a mistake (a
// flipped sign, a flag parsed as -1); turning it into the default would
// hide it.
func (c *Config) validate() error {
	if c.Rails == nil || len(c.Rails.Types()) == 0 {
		return errors.New("no rails: Config.Rails must configure at least one")
	}
	if err := store.ValidateSchema(c.Schema); err != nil {
		return err
	}
	for _, f := range []struct {
		name string
		v    int
	}{
		{"BatchSize", c.BatchSize}, {"MaxConcurrency", c.MaxConcurrency}, {"MaxAttempts", c.MaxAttempts},
		{"MaxErrorLength", c.MaxErrorLength}, {"FlushSize", c.FlushSize}, {"OutcomeWriters", c.OutcomeWriters},
	} {
		if f.v < 0 {
			return fmt.Errorf("%s %d is negative (0 means the default)", f.name, f.v)
		}
	}
	for _, f := range []struct {
		name string
		v    time.Duration
	}{
		{"PollInterval", c.PollInterval}, {"Debounce", c.Debounce}, {"IdleRefresh", c.IdleRefresh},
		{"ReconnectDelay", c.ReconnectDelay}, {"LeaseGrace", c.LeaseGrace}, {"BackoffBase", c.BackoffBase},
		{"BackoffCap", c.BackoffCap}, {"MinRetryDelay", c.MinRetryDelay}, {"StopTimeout", c.StopTimeout},
	} {
		if f.v < 0 {
			return fmt.Errorf("%s %v is negative (0 means the default)", f.name, f.v)
		}
	}
	return nil
}
