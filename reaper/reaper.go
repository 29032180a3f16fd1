// Package reaper repairs zombies: instructions whose relayer died while
// dispatching them (OOM kill, node loss). Such an instruction stays in the
// in-flight table with a lease (claim time + rail timeout + grace) that
// nobody will ever renew or close; once the lease has expired the reaper
// puts it back into pending with the same identity and appends a
// ZOMBIE_REQUEUE attempt that closes the dead relayer's DISPATCHING attempt.
//
// A pass reads only the in-flight table (the whole of it: it has no lease
// index since migration 014), so its cost grows with the work in flight,
// never with the size of the archive.
// Several reapers may run at once: rows one of them is requeuing are locked
// and skipped by the others.
package reaper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/internal/lifecycle"
	"github.com/ledgerline/outbox/internal/retry"
	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/migrations"
)

// Defaults and limits of [Config].
const (
	// DefaultInterval is the time between two background passes.
	DefaultInterval = 60 * time.Second
	// MinInterval is the shortest interval accepted: a pass is cheap, but
	// leases are seconds long, so reaping more often than this buys nothing.
	MinInterval = time.Second
	// MaxInterval is the longest interval accepted: a dead relayer's
	// claims wait for their lease and up to an interval more before a
	// pass requeues them, and an hour is already long for a payment to
	// be stuck; a longer one is a unit given wrong. Far past it the retry
	// backoff's doubling wrapped (about 146 years retried without pause).
	MaxInterval = time.Hour
	// DefaultBatchSize is the number of instructions requeued per
	// transaction.
	DefaultBatchSize = 500
	// DefaultZombieLimit is how many times an instruction may be requeued
	// after its relayer died before the reaper dead-letters it instead (a
	// poison instruction: one that kills every relayer that takes it).
	DefaultZombieLimit = 3
	// DefaultCheckpointInterval is the least time between two checkpoints
	// of the archive (docs/audit.md).
	DefaultCheckpointInterval = time.Minute
	// partitionMonthsAhead is how many monthly archive partitions each
	// background pass makes sure exist beyond the current month.
	partitionMonthsAhead = 3
	// roundTripDeadline bounds each statement of a pass but the
	// checkpoint: the partition upkeep and each requeue batch. On a
	// connection that went silent (a black-holed network, a primary that
	// died without resetting its connections) nothing else ends the wait
	// before TCP gives up, about 15 minutes on Linux, and a reaper stuck
	// there requeues nothing meanwhile. The deadline makes pgx drop the
	// connection, so the next pass gets a fresh one.
	roundTripDeadline = 30 * time.Second
	// staleIdleAfter is how long an idle registration (relayer_idle) may
	// go unrefreshed before a background pass removes it: its relayer is
	// gone (a live idle one refreshes it every few seconds, and the
	// pending trigger ignores rows older than 10 s), and killed relayers'
	// rows would otherwise stay for good (store.ForgetStaleIdle).
	staleIdleAfter = time.Hour
	// endedRunsAfter is how long past its claims_until a relayer run's
	// registration (relayer_runs) stays before a background pass removes
	// it, once no claim in flight may be one it covers
	// (store.ForgetEndedRuns): its run was killed, or stopped leaving
	// claims in flight, and runs under ids no relayer takes again would
	// otherwise stay for good.
	endedRunsAfter = time.Hour
	// checkpointDeadline bounds a checkpoint, which first waits up to 30 s
	// for the transactions running when it began, then digests its period.
	checkpointDeadline = 2 * time.Minute
)

// ErrInvalidConfig is wrapped by the errors [New] returns for a bad Config.
var ErrInvalidConfig = errors.New("reaper: invalid config")

// ErrAlreadyStarted is wrapped by the error [Reaper.Start] returns on a
// running reaper. It is the one value every long-running outbox service
// returns for that (engine.ErrAlreadyStarted and relay.ErrAlreadyStarted
// are the same), exported here
// because the start/stop contract's own package is internal.
var ErrAlreadyStarted = lifecycle.ErrAlreadyStarted

// Config configures a [Reaper].
type Config struct {
	// Schema holding the outbox tables; "" means the default.
	Schema string
	// Interval between background passes; 0 means DefaultInterval.
	// Anything below MinInterval or past MaxInterval is rejected.
	Interval time.Duration
	// BatchSize is the most instructions requeued per transaction; 0 means
	// DefaultBatchSize. Small batches keep row locks short.
	BatchSize int
	// ReaperID names this reaper in the ZOMBIE_REQUEUE rows' error message
	// and in logs; the rows' relayer_id stays the dead relayer's, so the
	// trail says whose attempt was abandoned. "" means host-pid-random.
	ReaperID string
	// ZombieLimit is how many times an instruction may be requeued after
	// its lease expired; the next expiry makes it a dead letter marked
	// outcome unknown (error code ZOMBIE_LIMIT) and, with ordering on, lets
	// its participant move on. 0 means DefaultZombieLimit, negative means
	// no limit.
	ZombieLimit int
	// CheckpointInterval is the least time between two checkpoints of the
	// archive, taken by the background passes; 0 means
	// DefaultCheckpointInterval, negative turns checkpointing off (another
	// process must take them: a period without one is a period in which a
	// deleted instruction goes unseen).
	CheckpointInterval time.Duration
	// Logger receives one line per pass that requeued anything (Warn:
	// how many, per dead relayer, a few outbox ids), and one per requeued
	// instruction at Debug; nil discards.
	Logger *slog.Logger
}

func (c *Config) setDefaults() error {
	if err := store.ValidateSchema(c.Schema); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	switch {
	case c.Interval == 0:
		c.Interval = DefaultInterval
	case c.Interval < MinInterval:
		return fmt.Errorf("%w: interval %s is below the minimum %s", ErrInvalidConfig, c.Interval, MinInterval)
	case c.Interval > MaxInterval:
		return fmt.Errorf("%w: interval %s is past the maximum %s", ErrInvalidConfig, c.Interval, MaxInterval)
	}
	switch {
	case c.BatchSize == 0:
		c.BatchSize = DefaultBatchSize
	case c.BatchSize < 0:
		return fmt.Errorf("%w: batch size %d is negative", ErrInvalidConfig, c.BatchSize)
	}
	if c.ZombieLimit == 0 {
		c.ZombieLimit = DefaultZombieLimit
	}
	if c.CheckpointInterval == 0 {
		c.CheckpointInterval = DefaultCheckpointInterval
	}
	if c.ReaperID == "" {
		c.ReaperID = lifecycle.ProcessID()
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Requeued is one instruction a pass put back into pending. LeaseUntil and
// RequeuedAt (both database clock) let callers measure how long a zombie
// waited after its lease ran out.
type Requeued = store.Requeued

// Stats are a reaper's counters since it was created.
type Stats struct {
	// Passes counts completed passes (RunOnce calls and background passes).
	Passes int64
	// Errors counts passes that stopped on an error.
	Errors int64
	// Requeued counts instructions requeued (committed).
	Requeued int64
	// DeadLettered counts poison instructions: reaped past the zombie
	// limit, they became dead letters instead of being requeued.
	DeadLettered int64
	// Checkpoints counts archive checkpoints this reaper took.
	Checkpoints int64
	// LastPass is when the last completed pass ended; zero before the first.
	LastPass time.Time
}

// Reaper requeues in-flight instructions whose lease expired. Create it
// with [New]; call [Reaper.RunOnce] for one pass, or run it in the
// background with [Reaper.Start] and [Reaper.Stop] (or [Reaper.Run]).
type Reaper struct {
	cfg   Config
	pool  *pgxpool.Pool
	store *store.Store
	log   *slog.Logger

	statsMu sync.Mutex
	stats   Stats

	lc lifecycle.Lifecycle

	// schemaReady is set once a pass found the schema at this build's
	// version: the check costs a query, once per reaper.
	schemaReady atomic.Bool

	// testRoundTrip replaces the statement deadlines in tests.
	testRoundTrip time.Duration
}

// New validates cfg and returns a reaper that is not yet running.
func New(pool *pgxpool.Pool, cfg Config) (*Reaper, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: nil pool", ErrInvalidConfig)
	}
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	st, err := store.New(cfg.Schema)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return &Reaper{
		cfg:   cfg,
		pool:  pool,
		store: st,
		log:   cfg.Logger.With("reaper", cfg.ReaperID),
	}, nil
}

// ID returns the reaper's id.
func (r *Reaper) ID() string { return r.cfg.ReaperID }

// Stats returns a snapshot of the counters.
func (r *Reaper) Stats() Stats {
	r.statsMu.Lock()
	defer r.statsMu.Unlock()
	return r.stats
}

// RunOnce makes one pass: it requeues expired in-flight instructions in
// batches of Config.BatchSize, one transaction each, until a batch comes
// back short (every expired row not locked by another reaper is done, but
// for one whose claim committed after its batch locked the participants,
// with its lease already over, which waits for the next pass). It
// returns what it requeued, oldest lease first per batch; on error, what the
// batches before the error committed.
//
// The first pass of a reaper checks the schema as Start does: one not
// migrated or older than this build is refused with a
// [*github.com/ledgerline/outbox/migrations.SchemaError] and nothing is
// done (its statements would fail on it, and zombies stay in flight).
func (r *Reaper) RunOnce(ctx context.Context) ([]Requeued, error) {
	if err := r.checkSchema(ctx); err != nil {
		r.countPass(0, err)
		return nil, err
	}
	var all []Requeued
	for {
		batch, err := r.reapBatch(ctx)
		all = append(all, batch...)
		if err != nil {
			r.countPass(countRequeued(all), err)
			r.logPass(all)
			return all, err
		}
		if len(batch) < r.cfg.BatchSize {
			break
		}
	}
	r.countPass(countRequeued(all), nil)
	r.logPass(all)
	return all, nil
}

// passExamples is how many outbox ids a pass's line names for example.
const passExamples = 5

// logPass logs what a pass requeued (the batches it committed) in one
// line: how many, how many per dead relayer, and a few outbox ids to
// start from (each is a Debug line, and in the archive). A line per
// instruction at Info was thousands at once when a relayer died holding
// thousands of claims.
func (r *Reaper) logPass(all []Requeued) {
	byRelayer := map[string]int{}
	var examples []string
	for _, q := range all {
		if q.DeadLettered {
			continue // each is an Error line of its own (reapBatch)
		}
		byRelayer[q.RelayerID]++
		if len(examples) < passExamples {
			examples = append(examples, q.OutboxID.String())
		}
	}
	if len(byRelayer) == 0 {
		return
	}
	relayers := make([]string, 0, len(byRelayer))
	for id := range byRelayer {
		relayers = append(relayers, id)
	}
	slices.Sort(relayers)
	count := 0
	for i, id := range relayers {
		count += byRelayer[id]
		relayers[i] = fmt.Sprintf("%s=%d", id, byRelayer[id])
	}
	r.log.Warn("requeued zombie instructions", "count", count, "by_dead_relayer", strings.Join(relayers, " "),
		"examples", strings.Join(examples, " "))
}

// checkSchema refuses a schema older than this build, once per reaper
// until it finds it ready.
func (r *Reaper) checkSchema(ctx context.Context) error {
	if r.schemaReady.Load() {
		return nil
	}
	ctx, cancel := r.bounded(ctx, roundTripDeadline)
	defer cancel()
	if _, err := migrations.Ready(ctx, r.pool, r.cfg.Schema); err != nil {
		if retry.Permanent(err) {
			err = retry.Explain(err)
		}
		return fmt.Errorf("reaper: %w", err)
	}
	r.schemaReady.Store(true)
	return nil
}

// countRequeued counts the instructions put back into pending (not the
// dead-lettered poison ones).
func countRequeued(all []Requeued) int {
	n := 0
	for _, q := range all {
		if !q.DeadLettered {
			n++
		}
	}
	return n
}

func (r *Reaper) countPass(requeued int, err error) {
	r.statsMu.Lock()
	defer r.statsMu.Unlock()
	r.stats.Requeued += int64(requeued)
	if err != nil {
		r.stats.Errors++
		return
	}
	r.stats.Passes++
	r.stats.LastPass = time.Now()
}

// bounded derives from ctx the context of one statement with deadline d
// (see roundTripDeadline), or the test's.
func (r *Reaper) bounded(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if r.testRoundTrip > 0 {
		d = r.testRoundTrip
	}
	return context.WithTimeout(ctx, d)
}

// reapBatch requeues one batch (one statement, see [store.Store.Reap]).
func (r *Reaper) reapBatch(ctx context.Context) ([]Requeued, error) {
	ctx, cancel := r.bounded(ctx, roundTripDeadline)
	defer cancel()
	batch, err := r.store.Reap(ctx, r.pool, r.cfg.BatchSize, r.cfg.ReaperID, r.cfg.ZombieLimit)
	if err != nil {
		return nil, fmt.Errorf("reaper: requeue expired leases: %w", err)
	}
	for _, q := range batch {
		if q.DeadLettered {
			r.statsMu.Lock()
			r.stats.DeadLettered++
			r.statsMu.Unlock()
			r.log.Error("poison instruction dead-lettered: its relayer died on it more often than the zombie limit allows; outcome unknown",
				"outbox_id", q.OutboxID, "instruction_id", q.InstructionID, "participant", q.ParticipantID,
				"sequence_id", q.SequenceID, "attempt_no", q.AttemptNo, "dead_relayer", q.RelayerID,
				"zombie_limit", r.cfg.ZombieLimit)
			continue
		}
		r.log.Debug("requeued zombie instruction", "outbox_id", q.OutboxID, "instruction_id", q.InstructionID,
			"participant", q.ParticipantID, "sequence_id", q.SequenceID, "attempt_no", q.AttemptNo,
			"dead_relayer", q.RelayerID, "claimed_at", q.ClaimedAt, "lease_until", q.LeaseUntil)
	}
	return batch, nil
}

// Start starts the background loop and returns: a pass right away, then
// one every Config.Interval, each also making sure the archive's monthly
// partitions exist and removing the idle registrations of relayers gone
// without removing them (staleIdleAfter); beside the passes, so that one
// held up never holds up requeues, the archive's checkpoint is taken
// when it is due, looked for as often. The loop runs until Stop (ctx is for start-up only, as
// for every long-running outbox service: Start on a running reaper is an
// error wrapping [ErrAlreadyStarted], Stop on a stopped one a no-op, and a
// stopped reaper can be started again). Stop cancels the batch in
// progress: it rolls back, which is safe because the next pass does the
// same work, or, if it committed before the cancel reached it, its requeue
// stands and the pass counts as failed.
//
// Like a relayer's, Start first checks the database and returns errors no
// retry can fix (refused credentials, a missing database or privilege, a
// schema not migrated or older than this build: a
// [*github.com/ledgerline/outbox/migrations.SchemaError]) at once, with
// nothing started; an unreachable database is not one of them.
func (r *Reaper) Start(ctx context.Context) error {
	_, err := r.start(ctx)
	return err
}

// start is Start; it also returns a channel closed once this start's loop
// has been stopped, by whichever Stop, for Run to return on.
func (r *Reaper) start(ctx context.Context) (<-chan struct{}, error) {
	stopped, err := r.lc.StartDone(ctx, func(ctx context.Context) (lifecycle.StopFunc, error) {
		// Its statements need this build's schema: on an older one every
		// pass would fail, and zombies stay in flight.
		// Not checked (unreachable): each pass checks until it is
		// (checkSchema).
		if _, err := retry.Preflight(ctx, r.pool, r.cfg.Schema, r.log, "reaper"); err != nil {
			return nil, err
		}
		runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		done := make(chan struct{})
		go r.loop(runCtx, done)
		r.log.Info("reaper started", "interval", r.cfg.Interval, "batch_size", r.cfg.BatchSize)
		return func(ctx context.Context) error {
			cancel()
			select {
			case <-done:
			case <-ctx.Done():
				// The pass in progress was cancelled and rolls back; the
				// loop ends on its own soon.
				return fmt.Errorf("reaper: stop: %w", ctx.Err())
			}
			st := r.Stats()
			r.log.Info("reaper stopped", "passes", st.Passes, "requeued", st.Requeued, "errors", st.Errors)
			return nil
		}, nil
	})
	if err != nil {
		return nil, fmt.Errorf("reaper: %w", err)
	}
	return stopped, nil
}

// Stop stops the background loop, cancelling a pass in progress, and waits
// for it to return or for ctx to be done (then it returns ctx's error; the
// reaper is stopped either way). Stop on a reaper that is not running
// returns nil.
func (r *Reaper) Stop(ctx context.Context) error { return r.lc.Stop(ctx) }

// Run starts the reaper, waits until ctx is cancelled, then stops it,
// waiting up to 10 s for the pass in progress to roll back (Stop's
// error if it did not). A reaper stopped meanwhile by [Reaper.Stop] ends
// Run too, once that Stop has ended: Run returns nil, and that Stop
// reports its own errors.
func (r *Reaper) Run(ctx context.Context) error {
	stopped, err := r.start(ctx)
	if err != nil {
		return err
	}
	select {
	case <-ctx.Done():
	case <-stopped:
		return nil
	}
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	return r.Stop(stopCtx)
}

// loop makes a pass now and then one per interval until ctx ends, and
// takes the archive's checkpoints beside the passes (checkpointLoop).
func (r *Reaper) loop(ctx context.Context, done chan struct{}) {
	defer close(done)
	checkpoints := make(chan struct{})
	go r.checkpointLoop(ctx, checkpoints)
	defer func() { <-checkpoints }()
	ticker := time.NewTicker(r.cfg.Interval)
	defer ticker.Stop()
	// Failing passes are logged once per change of state, not once per
	// interval; the next pass is the retry.
	failures := &retry.Loop{Log: r.log, What: "reaper pass", Min: r.cfg.Interval, Max: r.cfg.Interval}
	for {
		r.pass(ctx, failures)
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

// checkpointLoop takes the archive's checkpoints (checkpoint) now and
// then once per interval until ctx ends, then closes done. A checkpoint
// may wait long (for another reaper's, for the archive's writers, up to
// checkpointDeadline for a backlog's steps): in the passes' goroutine it
// held up the next requeue of zombies by as much, past the interval that
// relay.Config.HealBound counts on.
func (r *Reaper) checkpointLoop(ctx context.Context, done chan struct{}) {
	defer close(done)
	if r.cfg.CheckpointInterval < 0 {
		return
	}
	ticker := time.NewTicker(r.cfg.Interval)
	defer ticker.Stop()
	failures := &retry.Loop{Log: r.log, What: "archive checkpoint", Min: r.cfg.Interval, Max: r.cfg.Interval}
	for {
		err := r.checkpoint(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			failures.Failed(err)
		default:
			failures.Succeeded()
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

// pass is one background pass. Errors are logged, not returned: the next
// pass retries, and a reaper that gave up would leave zombies for good.
func (r *Reaper) pass(ctx context.Context, failures *retry.Loop) {
	// Partition upkeep failing (it needs a lock on the archive) must not
	// stop the reaping: both run, either failing counts.
	pctx, cancel := r.bounded(ctx, roundTripDeadline)
	perr := r.store.EnsurePartitions(pctx, r.pool, partitionMonthsAhead)
	cancel()
	_, err := r.RunOnce(ctx)
	err = errors.Join(err, perr, r.forgetStaleIdle(ctx), r.forgetEndedRuns(ctx))
	switch {
	case ctx.Err() != nil:
	case err != nil:
		failures.Failed(err)
	default:
		failures.Succeeded()
	}
}

// forgetStaleIdle removes the idle registrations of relayers that are
// gone (see staleIdleAfter).
func (r *Reaper) forgetStaleIdle(ctx context.Context) error {
	ctx, cancel := r.bounded(ctx, roundTripDeadline)
	defer cancel()
	n, err := r.store.ForgetStaleIdle(ctx, r.pool, staleIdleAfter)
	if err != nil {
		return fmt.Errorf("reaper: %w", err)
	}
	if n > 0 {
		r.log.Info("removed the idle registrations of relayers gone without removing them", "count", n, "unrefreshed_for", staleIdleAfter)
	}
	return nil
}

// forgetEndedRuns removes the registrations of relayer runs that ended
// without removing them (see endedRunsAfter).
func (r *Reaper) forgetEndedRuns(ctx context.Context) error {
	ctx, cancel := r.bounded(ctx, roundTripDeadline)
	defer cancel()
	n, err := r.store.ForgetEndedRuns(ctx, r.pool, endedRunsAfter)
	if err != nil {
		return fmt.Errorf("reaper: %w", err)
	}
	if n > 0 {
		r.log.Info("removed the registrations of relayer runs that ended without removing them", "count", n, "claims_ended_more_than", endedRunsAfter)
	}
	return nil
}

// checkpoint takes the archive's next checkpoint once the last one is
// CheckpointInterval old (another relayer's reaper may have taken it),
// and the ones after it while one comes back cut short (at a month's end,
// or at the most rows one checkpoint digests, migration 043): hours
// without a checkpoint are closed in steps, each in a statement of its
// own. It starts no new one after checkpointDeadline; the next pass goes
// on from there.
func (r *Reaper) checkpoint(ctx context.Context) error {
	if r.cfg.CheckpointInterval < 0 {
		return nil
	}
	start := time.Now()
	for taken := 0; ; taken++ {
		if taken > 0 && time.Since(start) >= checkpointDeadline {
			r.log.Info("archive checkpoints behind; the next pass takes the rest", "taken", taken)
			return nil
		}
		cctx, cancel := r.bounded(ctx, checkpointDeadline)
		cp, more, err := r.store.TakeCheckpointStep(cctx, r.pool, store.DefaultCheckpointSettle, r.cfg.CheckpointInterval)
		cancel()
		if err != nil || cp == nil {
			return err
		}
		r.statsMu.Lock()
		r.stats.Checkpoints++
		r.statsMu.Unlock()
		r.log.Debug("archive checkpoint", "period_start", cp.PeriodStart, "period_end", cp.PeriodEnd, "rows", cp.Rows)
		if !more {
			return nil
		}
	}
}

// Interval returns the time between two background passes.
func (r *Reaper) Interval() time.Duration { return r.cfg.Interval }
