// Package reaper repairs zombies: instructions whose relayer died while
// dispatching them (OOM kill, node loss). Such an instruction stays in the
// in-flight table with a lease (claim time + rail timeout + grace) that
// nobody will ever renew or close; once the lease has expired the reaper
// puts it back into pending with the same identity and appends a
// ZOMBIE_REQUEUE attempt that closes the dead relayer's DISPATCHING attempt.
//
// A pass reads only the in-flight table (through its lease index), so its
// cost grows with the work in flight, never with the size of the archive.
// Several reapers may run at once: rows one of them is requeuing are locked
// and skipped by the others.
package reaper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/attempts"
	"github.com/ledgerline/outbox/internal/retry"
	"github.com/ledgerline/outbox/migrations"
)

// Defaults and limits of [Config].
const (
	// DefaultInterval is the time between two background passes.
	DefaultInterval = 60 * time.Second
	// MinInterval is the shortest interval accepted: a pass is cheap, but
	// leases are seconds long, so reaping more often than this buys nothing.
	MinInterval = time.Second
	// DefaultBatchSize is the number of instructions requeued per
	// transaction.
	DefaultBatchSize = 500
	// partitionMonthsAhead is how many monthly archive partitions each
	// background pass makes sure exist beyond the current month.
	partitionMonthsAhead = 3
)

// ErrInvalidConfig is wrapped by the errors [New] returns for a bad Config.
var ErrInvalidConfig = errors.New("reaper: invalid config")

// Config configures a [Reaper].
type Config struct {
	// Schema holding the outbox tables; "" means the default.
	Schema string
	// Interval between background passes; 0 means DefaultInterval.
	// Anything below MinInterval is rejected.
	Interval time.Duration
	// BatchSize is the most instructions requeued per transaction; 0 means
	// DefaultBatchSize. Small batches keep row locks short.
	BatchSize int
	// ReaperID names this reaper in the ZOMBIE_REQUEUE rows' error message
	// and in logs; the rows' relayer_id stays the dead relayer's, so the
	// trail says whose attempt was abandoned. "" means host-pid-random.
	ReaperID string
	// Logger receives one line per requeued instruction and one per pass
	// that requeued anything; nil discards.
	Logger *slog.Logger
}

func (c *Config) setDefaults() error {
	if err := migrations.ValidateSchema(c.Schema); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	switch {
	case c.Interval == 0:
		c.Interval = DefaultInterval
	case c.Interval < MinInterval:
		return fmt.Errorf("%w: interval %s is below the minimum %s", ErrInvalidConfig, c.Interval, MinInterval)
	}
	switch {
	case c.BatchSize == 0:
		c.BatchSize = DefaultBatchSize
	case c.BatchSize < 0:
		return fmt.Errorf("%w: batch size %d is negative", ErrInvalidConfig, c.BatchSize)
	}
	if c.ReaperID == "" {
		host, err := os.Hostname()
		if err != nil || host == "" {
			host = "unknown"
		}
		c.ReaperID = fmt.Sprintf("%s-%d-%08x", host, os.Getpid(), rand.Uint32())
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Requeued is one instruction a pass put back into pending. LeaseUntil and
// RequeuedAt (both database clock) let callers measure how long a zombie
// waited after its lease ran out.
type Requeued struct {
	OutboxID      uuid.UUID
	InstructionID string
	ParticipantID string
	SequenceID    int64
	// AttemptNo is the abandoned attempt's number; the next claim gets the
	// same number again, because a zombie does not use up the retry budget.
	AttemptNo int
	// RelayerID is the dead relayer that held the lease.
	RelayerID  string
	ClaimedAt  time.Time
	LeaseUntil time.Time
	RequeuedAt time.Time
}

// Stats are a reaper's counters since it was created.
type Stats struct {
	// Passes counts completed passes (RunOnce calls and background passes).
	Passes int64
	// Errors counts passes that stopped on an error.
	Errors int64
	// Requeued counts instructions requeued (committed).
	Requeued int64
	// LastPass is when the last completed pass ended; zero before the first.
	LastPass time.Time
}

// Reaper requeues in-flight instructions whose lease expired. Create it
// with [New]; call [Reaper.RunOnce] for one pass, or run it in the
// background with [Reaper.Start] and [Reaper.Stop] (or [Reaper.Run]).
type Reaper struct {
	cfg     Config
	pool    *pgxpool.Pool
	archive *attempts.Archive
	log     *slog.Logger
	sql     string

	statsMu sync.Mutex
	stats   Stats

	// mu guards the background loop's lifecycle.
	mu     sync.Mutex
	cancel context.CancelFunc // stops the running loop; nil when not running
	done   chan struct{}      // closed when the running loop returned
}

// New validates cfg and returns a reaper that is not yet running.
func New(pool *pgxpool.Pool, cfg Config) (*Reaper, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: nil pool", ErrInvalidConfig)
	}
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	archive, err := attempts.New(cfg.Schema)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return &Reaper{
		cfg:     cfg,
		pool:    pool,
		archive: archive,
		log:     cfg.Logger.With("reaper", cfg.ReaperID),
		sql:     migrations.Qualify(cfg.Schema, reapSQL),
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

// reapSQL is one batch in one statement, so one implicit transaction: lock
// up to $1 expired in-flight rows (skipping rows another reaper, or a
// relayer recording a late outcome, holds), delete them, put each back into
// pending with its identity, payload, first-enqueue time and attempt count
// (attempt_no - 1: the abandoned attempt does not use up the retry budget,
// and the next claim gets the same attempt number) marked with the
// abandoned attempt's id (so only that attempt's late outcome may withdraw
// this copy), and append one
// ZOMBIE_REQUEUE attempt that closes the dead relayer's DISPATCHING attempt.
//
// Only inflight is read (through inflight_lease_idx); attempts is only
// inserted into, so the cost does not grow with the archive. A row requeued
// once is no longer in flight, which makes the pass idempotent.
const reapSQL = `
WITH expired AS (
  SELECT outbox_id FROM {schema}.inflight
  WHERE lease_until < now()
  ORDER BY lease_until
  LIMIT $1
  FOR UPDATE SKIP LOCKED
), reaped AS (
  DELETE FROM {schema}.inflight f USING expired e
  WHERE f.outbox_id = e.outbox_id
  RETURNING f.*
), requeued AS (
  INSERT INTO {schema}.pending (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
                                tenant_id, correlation_id, payload, attempt_count, next_attempt_at, created_at,
                                zombie_attempt_id)
  SELECT outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
         tenant_id, correlation_id, payload, attempt_no - 1, now(), created_at, attempt_id
  FROM reaped
), zombie AS (
  INSERT INTO {schema}.attempts (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
                                 tenant_id, correlation_id, attempt_no, state, relayer_id, claim_attempt_id,
                                 claimed_at, completed_at, next_attempt_at, error_code, error_message)
  SELECT outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
         tenant_id, correlation_id, attempt_no, 'ZOMBIE_REQUEUE', relayer_id, attempt_id,
         claimed_at, now(), now(), 'ZOMBIE_REQUEUE',
         format('lease of relayer %s expired at %s (claimed at %s); requeued by reaper %s',
                relayer_id, lease_until, claimed_at, $2::text)
  FROM reaped
)
SELECT outbox_id, instruction_id, participant_id, sequence_id, attempt_no, relayer_id, claimed_at, lease_until, now()
FROM reaped
ORDER BY lease_until, outbox_id`

// RunOnce makes one pass: it requeues expired in-flight instructions in
// batches of Config.BatchSize, one transaction each, until a batch comes
// back short (every expired row not locked by another reaper is done). It
// returns what it requeued, oldest lease first per batch; on error, what the
// batches before the error committed.
func (r *Reaper) RunOnce(ctx context.Context) ([]Requeued, error) {
	var all []Requeued
	for {
		batch, err := r.reapBatch(ctx)
		all = append(all, batch...)
		if err != nil {
			r.countPass(len(all), err)
			return all, err
		}
		if len(batch) < r.cfg.BatchSize {
			break
		}
	}
	r.countPass(len(all), nil)
	if len(all) > 0 {
		r.log.Warn("requeued zombie instructions", "count", len(all))
	}
	return all, nil
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

// reapBatch runs reapSQL once.
func (r *Reaper) reapBatch(ctx context.Context) ([]Requeued, error) {
	rows, err := r.pool.Query(ctx, r.sql, r.cfg.BatchSize, r.cfg.ReaperID)
	if err != nil {
		return nil, fmt.Errorf("reaper: requeue expired leases: %w", err)
	}
	batch, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Requeued, error) {
		var q Requeued
		err := row.Scan(&q.OutboxID, &q.InstructionID, &q.ParticipantID, &q.SequenceID, &q.AttemptNo,
			&q.RelayerID, &q.ClaimedAt, &q.LeaseUntil, &q.RequeuedAt)
		return q, err
	})
	if err != nil {
		return nil, fmt.Errorf("reaper: requeue expired leases: %w", err)
	}
	for _, q := range batch {
		r.log.Info("requeued zombie instruction", "outbox_id", q.OutboxID, "instruction_id", q.InstructionID,
			"participant", q.ParticipantID, "sequence_id", q.SequenceID, "attempt_no", q.AttemptNo,
			"dead_relayer", q.RelayerID, "claimed_at", q.ClaimedAt, "lease_until", q.LeaseUntil)
	}
	return batch, nil
}

// Start starts the background loop and returns: a pass right away, then one
// every Config.Interval, each also making sure the archive's monthly
// partitions exist. The loop runs until Stop or until ctx is cancelled; a
// pass cut off by either rolls back as a whole, which is safe because the
// next pass does the same work. Start after Stop starts a new loop.
func (r *Reaper) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cancel != nil {
		return errors.New("reaper: already started")
	}
	runCtx, cancel := context.WithCancel(ctx)
	r.cancel, r.done = cancel, make(chan struct{})
	go r.loop(runCtx, r.done)
	r.log.Info("reaper started", "interval", r.cfg.Interval, "batch_size", r.cfg.BatchSize)
	return nil
}

// Stop stops the background loop, cancelling a pass in progress, and waits
// for it to return or for ctx to be done (then it returns ctx's error and a
// later Stop may wait again).
func (r *Reaper) Stop(ctx context.Context) error {
	r.mu.Lock()
	cancel, done := r.cancel, r.done
	r.mu.Unlock()
	if cancel == nil {
		return errors.New("reaper: not started")
	}
	cancel()
	select {
	case <-done:
	case <-ctx.Done():
		return fmt.Errorf("reaper: stop: %w", ctx.Err())
	}
	r.mu.Lock()
	if r.done == done {
		r.cancel, r.done = nil, nil
	}
	r.mu.Unlock()
	st := r.Stats()
	r.log.Info("reaper stopped", "passes", st.Passes, "requeued", st.Requeued, "errors", st.Errors)
	return nil
}

// Run starts the reaper, waits until ctx is cancelled, then stops it.
func (r *Reaper) Run(ctx context.Context) error {
	if err := r.Start(ctx); err != nil {
		return err
	}
	<-ctx.Done()
	// The loop already saw ctx end; Stop only waits for it to return.
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	return r.Stop(stopCtx)
}

// loop makes a pass now and then one per interval until ctx ends.
func (r *Reaper) loop(ctx context.Context, done chan struct{}) {
	defer close(done)
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

// pass is one background pass. Errors are logged, not returned: the next
// pass retries, and a reaper that gave up would leave zombies for good.
func (r *Reaper) pass(ctx context.Context, failures *retry.Loop) {
	// Partition upkeep failing (it needs a lock on the archive) must not
	// stop the reaping: both run, either failing counts.
	perr := r.archive.EnsurePartitions(ctx, r.pool, partitionMonthsAhead)
	_, err := r.RunOnce(ctx)
	err = errors.Join(err, perr)
	switch {
	case ctx.Err() != nil:
	case err != nil:
		failures.Failed(err)
	default:
		failures.Succeeded()
	}
}
