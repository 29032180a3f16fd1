package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/semaphore"

	"github.com/ledgerline/outbox/attempts"
	"github.com/ledgerline/outbox/internal/retry"
	"github.com/ledgerline/outbox/migrations"
	"github.com/ledgerline/outbox/pending"
	"github.com/ledgerline/outbox/rails"
)

// Stats are a relayer's counters since it started.
type Stats struct {
	Claims        int64 // claim statements run, including those that found nothing
	ClaimBatches  int64 // claims that returned work
	Claimed       int64
	Dispatched    int64
	Retried       int64 // RETRYABLE outcomes (back to pending)
	Dead          int64 // FAILED outcomes (dead letters)
	Released      int64 // handed back without calling the rail
	Late          int64 // outcomes recorded after the lease was reaped
	LeftInFlight  int64 // cut off at stop, or unrecordable: left for the reaper
	Notifications int64 // wakeups by NOTIFY
	Polls         int64 // wakeups by the poll timer
}

// Relayer claims, dispatches and records. Create it with [New], run it with
// [Relayer.Start] and [Relayer.Stop] (or [Relayer.Run]).
type Relayer struct {
	cfg     Config
	pool    *pgxpool.Pool
	claimer *pending.Claimer
	archive *attempts.Archive
	log     *slog.Logger
	backoff Backoff
	idle    idleSQL

	slots    *semaphore.Weighted
	inFlight atomic.Int64 // dispatches in progress
	wake     chan struct{}
	outcomes chan pendingOutcome

	listening atomic.Bool
	// listenRecovered is set by listen before it connects.
	listenRecovered func()
	// recordFailures belongs to the recording goroutine (flushLoop).
	recordFailures *retry.Loop
	rndMu          sync.Mutex
	rnd            *rand.Rand

	stats struct {
		claims, claimBatches, claimed, dispatched, retried, dead, released, late, leftInFlight, notifications, polls atomic.Int64
	}

	// Lifecycle.
	startOnce    sync.Once
	stopOnce     sync.Once
	started      atomic.Bool
	stopping     chan struct{}      // closed when Stop begins
	dispatchCtx  context.Context    // cancelled at the hard deadline
	hardStop     context.CancelFunc // cancels dispatchCtx
	listenCancel context.CancelFunc
	loopDone     chan struct{}
	listenDone   chan struct{}
	// flushQuit is closed by Stop once dispatches are done (or abandoned):
	// the recorder flushes what it has and returns. outcomes itself is never
	// closed, so a dispatch that returns late cannot panic on a send.
	flushQuit chan struct{}
	flushDone chan struct{}
	// recordCtx is cancelled when Stop gives up on recording (the database
	// is unreachable): the recorder stops retrying, and what it could not
	// record stays in flight for the reaper.
	recordCtx      context.Context
	abandonRecords context.CancelFunc
	dispatches     sync.WaitGroup

	// testHooks let tests in this package act between protocol steps.
	testHooks struct {
		beforeRegister, afterIdleClaim func()
		// outcome may alter an outcome after it was made storable.
		outcome func(*attempts.Outcome)
		// abandonWait replaces the wait for dispatches after the hard
		// deadline.
		abandonWait time.Duration
	}
}

// New validates cfg and returns a relayer that is not yet running.
func New(pool *pgxpool.Pool, cfg Config) (*Relayer, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	claimer, err := pending.NewClaimer(cfg.Schema)
	if err != nil {
		return nil, err
	}
	archive, err := attempts.New(cfg.Schema)
	if err != nil {
		return nil, err
	}
	seed := cfg.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	r := &Relayer{
		cfg:        cfg,
		pool:       pool,
		claimer:    claimer,
		archive:    archive,
		log:        cfg.Logger.With("relayer", cfg.RelayerID),
		backoff:    Backoff{Base: cfg.BackoffBase, Cap: cfg.BackoffCap},
		idle:       newIdleSQL(cfg.Schema),
		slots:      semaphore.NewWeighted(int64(cfg.MaxConcurrency)),
		wake:       make(chan struct{}, 1),
		outcomes:   make(chan pendingOutcome, 2*cfg.MaxConcurrency),
		rnd:        rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		stopping:   make(chan struct{}),
		loopDone:   make(chan struct{}),
		flushQuit:  make(chan struct{}),
		flushDone:  make(chan struct{}),
		listenDone: make(chan struct{}),
	}
	r.recordFailures = &retry.Loop{Log: r.log, What: "record outcomes", Min: 20 * time.Millisecond, Max: 2 * time.Second}
	r.dispatchCtx, r.hardStop = context.WithCancel(context.Background())
	r.recordCtx, r.abandonRecords = context.WithCancel(context.Background())
	return r, nil
}

// ID returns the relayer id recorded in attempt rows.
func (r *Relayer) ID() string { return r.cfg.RelayerID }

// Stats returns a snapshot of the counters.
func (r *Relayer) Stats() Stats {
	s := &r.stats
	return Stats{
		Claims: s.claims.Load(), ClaimBatches: s.claimBatches.Load(), Claimed: s.claimed.Load(), Dispatched: s.dispatched.Load(),
		Retried: s.retried.Load(), Dead: s.dead.Load(), Released: s.released.Load(), Late: s.late.Load(),
		LeftInFlight: s.leftInFlight.Load(), Notifications: s.notifications.Load(), Polls: s.polls.Load(),
	}
}

// Start starts the relayer's goroutines and returns. The relayer runs until
// Stop; ctx is only used for start-up work (and its values are kept).
//
// Start first checks the database: errors that no retry can fix (the
// server refuses our credentials, the database does not exist, a missing
// privilege, a schema that is not migrated or behind this build) are
// returned at once, and nothing is started. A database that cannot be
// reached is not such an error: the relayer starts and keeps trying with
// capped backoff.
func (r *Relayer) Start(ctx context.Context) error {
	if err := r.preflight(ctx); err != nil {
		return err
	}
	err := errors.New("engine: relayer already started")
	r.startOnce.Do(func() {
		err = nil
		if perr := r.archive.EnsurePartitions(ctx, r.pool, 3); perr != nil {
			r.log.Warn("could not ensure attempt partitions", "err", perr)
		}
		runCtx := context.WithoutCancel(ctx)
		if r.cfg.PollOnly {
			close(r.listenDone)
		} else {
			var lctx context.Context
			lctx, r.listenCancel = context.WithCancel(runCtx)
			go r.listen(lctx)
		}
		go r.flushLoop()
		go r.claimLoop(runCtx)
		r.started.Store(true)
		r.log.Info("relayer started", "ordered", !r.cfg.Unordered, "rails", r.cfg.Rails.Types(),
			"poll_only", r.cfg.PollOnly, "max_concurrency", r.cfg.MaxConcurrency, "batch_size", r.cfg.BatchSize)
	})
	return err
}

// preflight refuses to start on permanent database errors (see Start).
func (r *Relayer) preflight(ctx context.Context) error {
	st, err := migrations.Ready(ctx, r.pool, r.cfg.Schema)
	switch {
	case err != nil && retry.Permanent(err):
		return fmt.Errorf("engine: relayer cannot start: %w", retry.Explain(err))
	case err != nil:
		r.log.Warn("database not reachable at start; the relayer starts anyway and keeps trying", "err", err)
	case st.Current > st.Latest:
		r.log.Warn("the schema is newer than this build (a newer version migrated it); upgrade this relayer",
			"schema", st.Schema, "version", st.Current, "build_version", st.Latest)
	}
	return nil
}

// Stop stops gracefully: no more claims; instructions claimed but not yet
// sent are handed back; dispatches in progress may finish until ctx is done
// (the hard deadline); outcomes are flushed; the listener closes. A dispatch
// still running at the deadline is abandoned without an outcome: its
// in-flight row stays leased and the reaper requeues it after the lease, and
// the rail sees the same idempotency key again. Stop returns
// context.DeadlineExceeded if that happened.
//
// Recording gets up to [StopRecordTimeout] after the dispatches ended; if
// the database cannot be reached by then, the unrecorded outcomes are
// abandoned the same way (left in flight for the reaper), so Stop returns
// even while the database is down.
func (r *Relayer) Stop(ctx context.Context) error {
	if !r.started.Load() {
		return errors.New("engine: relayer not started")
	}
	var result error
	r.stopOnce.Do(func() {
		close(r.stopping)
		<-r.loopDone

		done := make(chan struct{})
		go func() { r.dispatches.Wait(); close(done) }()
		select {
		case <-done:
		case <-ctx.Done():
			result = ctx.Err()
			r.hardStop()
			// Transports honour the cancelled context; give them a moment to
			// return so their goroutines do not outlive Stop.
			wait := 5 * time.Second
			if r.testHooks.abandonWait > 0 {
				wait = r.testHooks.abandonWait
			}
			select {
			case <-done:
			case <-time.After(wait):
				r.log.Error("dispatches did not return after cancellation; their instructions stay in flight for the reaper")
			}
		}
		close(r.flushQuit)
		select {
		case <-r.flushDone:
		case <-time.After(StopRecordTimeout):
			r.log.Error("could not record outcomes while stopping; they stay in flight and the reaper requeues them after their leases",
				"waited", StopRecordTimeout)
			r.abandonRecords()
			<-r.flushDone
		}
		r.hardStop()
		r.abandonRecords()

		cleanup, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		if err := r.unregisterIdle(cleanup); err != nil {
			r.log.Warn("could not unregister idle relayer", "err", err)
		}
		cancel()
		if r.listenCancel != nil {
			r.listenCancel()
		}
		<-r.listenDone
		st := r.Stats()
		r.log.Info("relayer stopped", "dispatched", st.Dispatched, "retried", st.Retried, "dead", st.Dead,
			"left_in_flight", st.LeftInFlight)
	})
	return result
}

// Run starts the relayer, runs until ctx is cancelled, then stops it
// gracefully with Config.StopTimeout as the hard deadline.
func (r *Relayer) Run(ctx context.Context) error {
	if err := r.Start(ctx); err != nil {
		return err
	}
	<-ctx.Done()
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.StopTimeout)
	defer cancel()
	if err := r.Stop(stopCtx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}

func (r *Relayer) isStopping() bool {
	select {
	case <-r.stopping:
		return true
	default:
		return false
	}
}

// signal wakes the claim loop (non-blocking; one pending wake is enough).
func (r *Relayer) signal() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// claimLoop claims while there is work and slots, and otherwise waits for a
// notification, a local wake (an outcome freed a participant) or the poll.
func (r *Relayer) claimLoop(ctx context.Context) {
	defer close(r.loopDone)
	stopCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-r.stopping:
			cancel()
		case <-stopCtx.Done():
		}
	}()

	registered := false
	var lastRefresh time.Time
	failures := &retry.Loop{Log: r.log, What: "claim", Min: 50 * time.Millisecond, Max: claimBackoffCap}
	idleFailures := &retry.Loop{Log: r.log, What: "idle registration", Min: r.cfg.IdleRefresh, Max: r.cfg.IdleRefresh}
	for !r.isStopping() {
		n, full, err := r.claimOnce(stopCtx)
		switch {
		case err != nil && stopCtx.Err() != nil:
			return
		case errors.Is(err, pending.ErrOrderingConflict):
			// A concurrent claim won a participant; try again shortly (not
			// at once: two relayers retrying in lockstep would spin).
			if !r.sleep(stopCtx, r.cfg.Debounce) {
				return
			}
			continue
		case err != nil:
			if !r.sleep(stopCtx, failures.Failed(err)) {
				return
			}
			continue
		}
		failures.Succeeded()
		if n > 0 && registered {
			if err := r.unregisterIdle(stopCtx); err == nil {
				registered = false
			}
		}
		if full {
			continue // drain mode: there is probably more
		}
		if n == 0 && r.shouldRegisterIdle() {
			if !registered || time.Since(lastRefresh) >= r.cfg.IdleRefresh {
				found, err := r.goIdle(stopCtx)
				if err != nil && stopCtx.Err() == nil {
					idleFailures.Failed(err)
				} else if err == nil {
					idleFailures.Succeeded()
					registered, lastRefresh = true, time.Now()
				}
				if found {
					if err := r.unregisterIdle(stopCtx); err == nil {
						registered = false
					}
					continue
				}
			}
		}
		if !r.waitForWork(stopCtx, registered) {
			return
		}
	}
}

// shouldRegisterIdle: only a relayer that listens and has nothing in
// flight registers; one with dispatches in progress is woken by its own
// outcomes anyway, and registering would make producers pay for NOTIFY.
func (r *Relayer) shouldRegisterIdle() bool {
	return r.listening.Load() && r.inFlight.Load() == 0
}

// waitForWork blocks until a notification (debounced), a local wake, the
// poll timer (or the idle refresh while registered), or stop. It reports
// false on stop.
func (r *Relayer) waitForWork(ctx context.Context, registered bool) bool {
	wait := r.pollDelay()
	if registered && r.cfg.IdleRefresh < wait {
		wait = r.cfg.IdleRefresh
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-r.wake:
		// Coalesce a burst into one claim.
		return r.sleep(ctx, r.cfg.Debounce)
	case <-t.C:
		r.stats.polls.Add(1)
		return true
	}
}

func (r *Relayer) pollDelay() time.Duration {
	r.rndMu.Lock()
	j := 0.8 + 0.4*r.rnd.Float64()
	r.rndMu.Unlock()
	return time.Duration(float64(r.cfg.PollInterval) * j)
}

func (r *Relayer) sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// claimOnce takes as many free dispatch slots as it can (waiting for at
// least one), claims up to that many instructions and starts their
// dispatches. full reports that every slot asked for was filled.
func (r *Relayer) claimOnce(ctx context.Context) (n int, full bool, err error) {
	if err := r.slots.Acquire(ctx, 1); err != nil {
		return 0, false, err
	}
	want := 1
	for want < r.cfg.BatchSize && r.slots.TryAcquire(1) {
		want++
	}
	// The claim itself must not be cancelled by Stop: a claim that commits
	// while its caller gives up would leave instructions in flight that
	// nobody dispatches (until the reaper). It is short, so it gets its own
	// timeout instead.
	claimCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	// Taken before the claim, so it is no later than the database's claim
	// time: leases measured from it by this process's clock end no later
	// than the database's, however the two clocks disagree.
	claimStart := time.Now()
	claimed, err := r.claim(claimCtx, want)
	cancel()
	r.slots.Release(int64(want - len(claimed)))
	if err != nil || len(claimed) == 0 {
		return 0, false, err
	}
	r.stats.claimBatches.Add(1)
	r.stats.claimed.Add(int64(len(claimed)))
	r.log.Info("claimed", "count", len(claimed), "asked", want)
	r.inFlight.Add(int64(len(claimed)))
	r.dispatches.Add(len(claimed))
	for _, c := range claimed {
		go r.dispatch(c, r.callDeadline(claimStart, c))
	}
	return len(claimed), len(claimed) == want, nil
}

// claim claims up to limit instructions of rails whose breaker admits
// calls; a half-open rail gets a claim of one, its probe.
func (r *Relayer) claim(ctx context.Context, limit int) ([]pending.Claimed, error) {
	closed, halfOpen := r.cfg.Rails.Claimable()
	p := pending.ClaimParams{RelayerID: r.cfg.RelayerID, Limit: limit, Ordered: !r.cfg.Unordered}
	var out []pending.Claimed
	if len(halfOpen) > 0 {
		p.Leases = r.leases(halfOpen)
		p.Limit = 1
		r.stats.claims.Add(1)
		probe, err := r.claimer.Claim(ctx, r.pool, p)
		if err != nil {
			return nil, err
		}
		out = probe
		p.Limit = limit - len(probe)
	}
	if len(closed) > 0 && p.Limit > 0 {
		p.Leases = r.leases(closed)
		r.stats.claims.Add(1)
		more, err := r.claimer.Claim(ctx, r.pool, p)
		if err != nil {
			return out, joinClaimErr(out, err)
		}
		out = append(out, more...)
	}
	return out, nil
}

// joinClaimErr keeps a successful probe claim when the second claim fails:
// the probe is ours and must be dispatched.
func joinClaimErr(claimed []pending.Claimed, err error) error {
	if len(claimed) > 0 {
		return nil
	}
	return err
}

func (r *Relayer) leases(types []string) map[string]time.Duration {
	m := make(map[string]time.Duration, len(types))
	for _, t := range types {
		m[t] = r.cfg.Rails.Timeout(t) + r.cfg.LeaseGrace
	}
	return m
}

// callDeadline is the latest moment, by this process's clock, at which a
// rail call for c may end: the lease measured from claimStart, less half the
// grace period, which is left for recording the outcome before the
// database's lease ends and the reaper may hand the instruction to another
// relayer.
func (r *Relayer) callDeadline(claimStart time.Time, c pending.Claimed) time.Time {
	return claimStart.Add(c.LeaseUntil.Sub(c.ClaimedAt) - r.cfg.LeaseGrace/2)
}

// dispatch sends one claimed instruction and queues its outcome.
func (r *Relayer) dispatch(c pending.Claimed, callDeadline time.Time) {
	defer r.dispatches.Done()
	defer r.inFlight.Add(-1)
	defer r.slots.Release(1)

	var d rails.Decision
	var latency time.Duration
	switch {
	case c.PayloadErr != nil:
		// Nothing any rail could be sent; retrying cannot help.
		d = rails.Decision{Outcome: rails.Failed, ErrorCode: rails.CodeValidationFailed, Field: rails.FieldPayload,
			Message: "stored payload cannot be decoded: " + c.PayloadErr.Error()}
	case r.isStopping():
		d = rails.Decision{Outcome: rails.Retryable, ErrorCode: rails.CodeReleased, Message: "released: relayer stopping"}
	default:
		start := time.Now()
		d = r.execute(c, callDeadline)
		latency = time.Since(start)
		if r.dispatchCtx.Err() != nil && d.RailCalled && d.Outcome == rails.Retryable {
			// Cut off at the hard deadline without an answer: no outcome is
			// recorded, the lease stands and the reaper will requeue it.
			r.stats.leftInFlight.Add(1)
			r.log.Warn("dispatch cut off at stop deadline; left in flight for the reaper",
				"outbox_id", c.OutboxID, "instruction_id", c.InstructionID, "participant", c.ParticipantID,
				"attempt_no", c.AttemptNo, "lease_until", c.LeaseUntil)
			return
		}
	}
	po := pendingOutcome{Outcome: r.outcome(c, d, latency), enqueuedAt: c.EnqueuedAt}
	if h := r.testHooks.outcome; h != nil {
		h(&po.Outcome)
	}
	select {
	case <-r.flushQuit:
	default:
		select {
		case r.outcomes <- po:
			return
		case <-r.flushQuit:
		}
	}
	// Stop stopped recording before this dispatch returned (it ignored the
	// hard deadline): the lease stands and the reaper requeues it.
	r.stats.leftInFlight.Add(1)
	r.log.Warn("outcome arrived after recording stopped; left in flight for the reaper",
		"outbox_id", c.OutboxID, "instruction_id", c.InstructionID, "participant", c.ParticipantID,
		"attempt_no", c.AttemptNo, "state", po.State)
}

// execute calls the rail, turning a panic in a rail (a transport registered
// by the embedding program) into a retryable transport error: whether the
// request left is unknown, so the retry carries the same idempotency key.
// A panic must not take the relayer, and every other instruction it holds,
// down with it.
func (r *Relayer) execute(c pending.Claimed, callDeadline time.Time) (d rails.Decision) {
	defer func() {
		if p := recover(); p != nil {
			r.log.Error("rail panicked", "rail", c.RailType, "outbox_id", c.OutboxID, "panic", p, "stack", string(debug.Stack()))
			d = rails.Decision{Outcome: rails.Retryable, ErrorCode: rails.CodeRailTransport, RailCalled: true,
				Message: fmt.Sprintf("rail %s panicked: %v", c.RailType, p)}
		}
	}()
	return r.cfg.Rails.ExecuteBefore(r.dispatchCtx, railInstruction(c), callDeadline)
}

// pendingOutcome is an outcome waiting to be recorded.
type pendingOutcome struct {
	attempts.Outcome
	enqueuedAt time.Time
}

func railInstruction(c pending.Claimed) rails.Instruction {
	ins := rails.Instruction{
		OutboxID: c.OutboxID, InstructionID: c.InstructionID, ParticipantID: c.ParticipantID,
		SequenceID: c.SequenceID, IdempotencyKey: c.IdempotencyKey, RailType: c.RailType,
		TenantID: c.TenantID, CorrelationID: c.CorrelationID, AttemptNo: c.AttemptNo,
		Metadata: c.Payload.Metadata,
	}
	if c.Payload.AmountMinor != 0 || c.Payload.Currency != "" || c.Payload.Destination != "" {
		ins.Payment = &rails.Payment{AmountMinor: c.Payload.AmountMinor, Currency: c.Payload.Currency, Destination: c.Payload.Destination}
	}
	return ins
}

// countsAgainstBudget: an attempt that never reached the rail for reasons of
// ours (open breaker, released, rail not loaded) does not use up retries.
func countsAgainstBudget(code rails.ErrorCode) bool {
	switch code {
	case rails.CodeCircuitOpen, rails.CodeReleased, rails.CodeRailNotConfigured:
		return false
	}
	return true
}

// outcome turns a decision into what is recorded: backoff for retries,
// MAX_ATTEMPTS_EXCEEDED on the last allowed attempt.
func (r *Relayer) outcome(c pending.Claimed, d rails.Decision, latency time.Duration) attempts.Outcome {
	id, _ := uuid.NewV7()
	o := attempts.Outcome{
		AttemptID: id, ClaimAttemptID: c.AttemptID, OutboxID: c.OutboxID, AttemptNo: c.AttemptNo,
		InstructionID: c.InstructionID, ParticipantID: c.ParticipantID, SequenceID: c.SequenceID,
		IdempotencyKey: c.IdempotencyKey, RailType: c.RailType, TenantID: c.TenantID,
		CorrelationID: c.CorrelationID, RelayerID: r.cfg.RelayerID, ClaimedAt: c.ClaimedAt,
		RailReference: storable(d.Reference, maxRailTextLength), RailCode: storable(d.RailCode, maxRailTextLength),
		ErrorCode:    string(d.ErrorCode),
		ErrorMessage: sanitize(d.Message, r.cfg.MaxErrorLength), LatencyMS: int(latency.Milliseconds()),
		CountAttempt: countsAgainstBudget(d.ErrorCode),
	}
	if d.Field != "" {
		o.ErrorMessage = sanitize(fmt.Sprintf("field %s: %s", d.Field, d.Message), r.cfg.MaxErrorLength)
	}
	switch d.Outcome {
	case rails.Dispatched:
		o.State, o.ErrorMessage = attempts.Dispatched, ""
	case rails.Failed:
		o.State = attempts.Failed
	default:
		o.State = attempts.Retryable
		switch {
		case o.CountAttempt && c.AttemptNo >= r.cfg.MaxAttempts:
			o.State, o.ErrorCode = attempts.Failed, string(rails.CodeMaxAttemptsExceeded)
			o.ErrorMessage = sanitize(fmt.Sprintf("attempt %d of %d failed with %s: %s", c.AttemptNo, r.cfg.MaxAttempts, d.ErrorCode, d.Message), r.cfg.MaxErrorLength)
		case o.CountAttempt:
			r.rndMu.Lock()
			o.RetryDelay = r.backoff.Delay(c.AttemptNo, r.rnd)
			r.rndMu.Unlock()
		case d.ErrorCode == rails.CodeReleased:
			o.RetryDelay = 0
		default:
			o.RetryDelay = time.Second
		}
		if d.RetryAfter > o.RetryDelay {
			o.RetryDelay = d.RetryAfter
		}
	}
	return o
}

// flushLoop records outcomes in batches until Stop closes flushQuit; then
// it records what is still queued and returns.
func (r *Relayer) flushLoop() {
	defer close(r.flushDone)
	var batch []pendingOutcome
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		select {
		case o := <-r.outcomes:
			if len(batch) == 0 {
				timer.Reset(r.cfg.FlushInterval)
			}
			batch = append(batch, o)
			if len(batch) >= r.cfg.FlushSize {
				timer.Stop()
				r.flush(batch)
				batch = nil
			}
		case <-timer.C:
			r.flush(batch)
			batch = nil
		case <-r.flushQuit:
			for drained := false; !drained; {
				select {
				case o := <-r.outcomes:
					batch = append(batch, o)
				default:
					drained = true
				}
			}
			r.flush(batch)
			return
		}
	}
}

// flush records outcomes in chunks of at most FlushSize.
func (r *Relayer) flush(batch []pendingOutcome) {
	for len(batch) > 0 {
		n := min(len(batch), r.cfg.FlushSize)
		r.flushChunk(batch[:n], false)
		batch = batch[n:]
	}
}

// flushChunk writes one batch in one transaction, retrying until it
// succeeds: an outcome is never dropped while the relayer runs. Only when
// Stop abandons recording does it give up; the unrecorded instructions then
// stay in flight and the reaper requeues them after their leases.
//
// A batch the database refuses for its content (a data or constraint
// error: retrying the same statement cannot succeed) is split until the
// offending outcome is alone, so one bad outcome cannot block the others.
// That one is recorded once more with the rail's text removed; if even that
// fails it is left in flight.
func (r *Relayer) flushChunk(batch []pendingOutcome, scrubbed bool) {
	if len(batch) == 0 {
		return
	}
	outcomes := make([]attempts.Outcome, len(batch))
	for i, p := range batch {
		outcomes[i] = p.Outcome
	}
	for {
		ctx, cancel := context.WithTimeout(r.recordCtx, 30*time.Second)
		recorded, err := r.archive.Record(ctx, r.pool, outcomes)
		cancel()
		if recorded != nil {
			r.recordFailures.Succeeded()
			// Archived; an error here is about withdrawing a requeued copy,
			// which then is dispatched again under the same key.
			if err != nil {
				r.log.Warn("outcomes recorded, but a late completion could not withdraw its requeued copy", "err", err)
			}
			r.afterFlush(batch, recorded)
			return
		}
		if code, ok := contentError(err); ok {
			r.unrecordable(batch, scrubbed, code, err)
			return
		}
		if r.recordCtx.Err() != nil {
			r.stats.leftInFlight.Add(int64(len(batch)))
			r.log.Error("gave up recording outcomes at stop; the reaper will requeue them", "count", len(batch), "err", err)
			return
		}
		select {
		case <-time.After(r.recordFailures.Failed(err)):
		case <-r.recordCtx.Done():
		}
	}
}

// unrecordable handles a batch the database refused for its content.
func (r *Relayer) unrecordable(batch []pendingOutcome, scrubbed bool, code string, err error) {
	if len(batch) > 1 {
		half := len(batch) / 2
		r.flushChunk(batch[:half], scrubbed)
		r.flushChunk(batch[half:], scrubbed)
		return
	}
	o := batch[0]
	if !scrubbed {
		r.log.Error("outcome refused by the database; recording it without the rail's text", "outbox_id", o.OutboxID,
			"attempt_no", o.AttemptNo, "sqlstate", code, "err", err)
		o.RailReference, o.RailCode = "", ""
		o.ErrorMessage = fmt.Sprintf("the rail's reference, code and message could not be stored (SQLSTATE %s) and were removed", code)
		r.flushChunk([]pendingOutcome{o}, true)
		return
	}
	r.stats.leftInFlight.Add(1)
	r.log.Error("outcome cannot be recorded; left in flight for the reaper", "outbox_id", o.OutboxID,
		"instruction_id", o.InstructionID, "attempt_no", o.AttemptNo, "state", o.State, "sqlstate", code, "err", err)
}

// contentError reports whether err is the database refusing the data
// itself (SQLSTATE class 22, data exception, or 23, integrity constraint
// violation), which no retry of the same statement can fix.
func contentError(err error) (string, bool) {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (strings.HasPrefix(pgErr.Code, "22") || strings.HasPrefix(pgErr.Code, "23")) {
		return pgErr.Code, true
	}
	return "", false
}

func (r *Relayer) afterFlush(batch []pendingOutcome, recorded []attempts.Recorded) {
	// Keyed by claim, not outbox id: one batch may hold a reaped attempt
	// and the newer attempt of the same instruction.
	late := make(map[uuid.UUID]attempts.Recorded)
	for _, rec := range recorded {
		if rec.Late {
			late[rec.ClaimAttemptID] = rec
		}
	}
	var observed []Recorded
	if r.cfg.OnRecorded != nil {
		observed = make([]Recorded, 0, len(batch))
	}
	now := time.Now()
	for _, p := range batch {
		o := p.Outcome
		rec, isLate := late[o.ClaimAttemptID]
		if observed != nil {
			observed = append(observed, Recorded{Outcome: o, EnqueuedAt: p.enqueuedAt, RecordedAt: now, Late: isLate})
		}
		if isLate {
			r.stats.late.Add(1)
			r.log.Warn("late outcome: lease was reaped", "outbox_id", o.OutboxID, "instruction_id", o.InstructionID,
				"participant", o.ParticipantID, "attempt_no", o.AttemptNo, "state", o.State, "withdrew_requeued_copy", rec.Withdrew)
			continue
		}
		switch {
		case o.State == attempts.Dispatched:
			r.stats.dispatched.Add(1)
		case o.State == attempts.Failed:
			r.stats.dead.Add(1)
			r.logFailure(o, "dead letter")
		case o.ErrorCode == string(rails.CodeReleased):
			r.stats.released.Add(1)
		default:
			r.stats.retried.Add(1)
			r.logFailure(o, "will retry")
		}
	}
	if observed != nil {
		r.cfg.OnRecorded(observed)
	}
	// Recorded outcomes free participants (ordering) and slots: claim again.
	r.signal()
}

func (r *Relayer) logFailure(o attempts.Outcome, what string) {
	args := []any{"outbox_id", o.OutboxID, "instruction_id", o.InstructionID, "participant", o.ParticipantID,
		"sequence_id", o.SequenceID, "attempt_no", o.AttemptNo, "rail", o.RailType, "error_code", o.ErrorCode,
		"rail_code", o.RailCode, "error", o.ErrorMessage}
	if o.State == attempts.Retryable {
		args = append(args, "retry_in", o.RetryDelay)
	}
	if o.TenantID != "" {
		args = append(args, "tenant_id", o.TenantID)
	}
	if o.CorrelationID != "" {
		args = append(args, "correlation_id", o.CorrelationID)
	}
	r.log.Warn("attempt failed: "+what, args...)
}
