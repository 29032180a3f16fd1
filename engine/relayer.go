package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/semaphore"

	"github.com/ledgerline/outbox/internal/lifecycle"
	"github.com/ledgerline/outbox/internal/retry"
	"github.com/ledgerline/outbox/internal/store"
)

// partitionMonthsAhead is how many monthly archive partitions a relayer
// makes sure exist beyond the current one when it starts.
const partitionMonthsAhead = 3

// Stats are a relayer's counters since it was created (across restarts).
type Stats struct {
	Claims        int64 // claim statements run, including those that found nothing
	ClaimBatches  int64 // claims that returned work
	Claimed       int64
	Handoffs      int64 // claimed by a transaction that recorded outcomes: freed participants' successors, then refills of freed slots
	OutcomeWrites int64 // outcome transactions committed (outcomes recorded / OutcomeWrites = outcomes per write)
	// OutcomeWriteTime is the time the committed outcome transactions
	// took, summed: each from sending its statements (hand-off included)
	// to its commit returning. OutcomeWriteTime / OutcomeWrites is the mean
	// write, which bounds how fast one participant's instructions follow
	// one another: with ordering on, its next one is claimed by the write
	// that records its outcome.
	OutcomeWriteTime time.Duration
	Dispatched       int64
	Retried          int64 // RETRYABLE outcomes (back to pending)
	Dead             int64 // FAILED outcomes (dead letters)
	Released         int64 // handed back without calling the rail
	Late             int64 // outcomes recorded after the lease was reaped
	Absorbed         int64 // late outcomes not archived: their claim had one already (counted in Late too)
	LeftInFlight     int64 // unrecordable, or not recorded by the end of a stop: left for the reaper
	Notifications    int64 // wakeups by NOTIFY
	Polls            int64 // wakeups by the fallback poll timer
	HotPolls         int64 // wakeups by a hot poll (shortly after a claim found work)
	// IDConflicts counts the refreshes of this relayer's run registration
	// that found another run of its relayer id live (refreshing its own):
	// two processes under one id (Config.RelayerID).
	IDConflicts int64
}

type counters struct {
	claims, claimBatches, claimed, handoffs, outcomeWrites, dispatched, retried, dead, released, late, absorbed, leftInFlight, notifications, polls, hotPolls, idConflicts atomic.Int64
	// outcomeWriteTime is in nanoseconds.
	outcomeWriteTime atomic.Int64
}

// count adds one recorded outcome to the counters.
func (c *counters) count(res Result) {
	switch res {
	case ResultDispatched:
		c.dispatched.Add(1)
	case ResultDead:
		c.dead.Add(1)
	case ResultReleased:
		c.released.Add(1)
	case ResultLate:
		c.late.Add(1)
	default:
		c.retried.Add(1)
	}
}

// Relayer claims, dispatches and records. Create it with [New]; run it
// with [Relayer.Start] and [Relayer.Stop] (or [Relayer.Run]), which follow
// the start/stop contract every long-running outbox service follows: Start
// on a running relayer is an error, Stop on a stopped one is a no-op, a
// stopped relayer can be started again.
type Relayer struct {
	cfg     Config
	pool    *pgxpool.Pool
	store   *store.Store
	log     *slog.Logger
	backoff Backoff
	lc      lifecycle.Lifecycle
	current atomic.Pointer[run] // the latest run (tests look at it)
	clock   atomic.Pointer[clockBase]

	rndMu sync.Mutex
	rnd   *rand.Rand
	stats counters
	// onceSchemaChecked is set once RelayOnce found the schema at this
	// build's version: it asks once per Relayer, not per pass.
	onceSchemaChecked atomic.Bool

	// testHooks let tests in this package act between protocol steps.
	testHooks struct {
		beforeRegister, afterIdleClaim func()
		// outcome may alter an outcome after it was made storable.
		outcome func(*store.Outcome)
		// abandonWait replaces the wait for dispatches after the hard
		// deadline.
		abandonWait time.Duration
		// persistentConflict replaces the constant of that name.
		persistentConflict time.Duration
		// statementDeadline replaces defaultRoundTripDeadline.
		statementDeadline time.Duration
		// listenCheck replaces listenCheckAfter.
		listenCheck time.Duration
		// wall replaces time.Now where the relayer reads its host's
		// wall clock (see wallNow): a host clock set apart from the
		// database's.
		wall func() time.Time
		// retryLogNow replaces time.Now for the retry log's windows,
		// and retryLogTick the constant of that name.
		retryLogNow  func() time.Time
		retryLogTick time.Duration
		// runRefresh replaces runRefreshInterval.
		runRefresh time.Duration
	}
}

// wallNow is the relayer host's clock (testHooks.wall in tests).
func (r *Relayer) wallNow() time.Time {
	if h := r.testHooks.wall; h != nil {
		return h()
	}
	return time.Now()
}

// clockBase pairs the database's time of a claim (its claimed_at) with
// this host's at the same moment, within window: the claim's round trip,
// from before it was sent to its answer, which the database's time falls
// in (the host's time is the window's middle).
type clockBase struct {
	db, host time.Time
	window   time.Duration
}

// clockBaseKeep is how long a base is kept over later claims whose round
// trip was longer (a claim that waited for a connection, a hand-off that
// waited for its write): the estimate of the database's clock is as good
// as the shortest round trip of the last minute.
const clockBaseKeep = time.Minute

// noteClaim keeps the database's time of a claim, dbAt, and the host's
// then, claimStart being this process's clock before the claim was sent,
// for dbNow.
func (r *Relayer) noteClaim(dbAt, claimStart time.Time) {
	now, window := r.wallNow(), time.Since(claimStart)
	if old := r.clock.Load(); old != nil && old.window < window && now.Sub(old.host) < clockBaseKeep {
		return
	}
	r.clock.Store(&clockBase{db: dbAt, host: now.Add(-window / 2), window: window})
}

// dbNow is the database's clock as this process reckons it: a recent
// claim's claimed_at plus the time since that claim by this process's
// clock (monotonic: a step of the host's clock does not move it), within
// half that claim's round trip (a RelayOnce in a transaction begun
// earlier stamps its claim with that transaction's start, and dbNow is
// then behind by as much). Times the relayer reports beside the
// database's own (Recorded.RecordedAt beside EnqueuedAt) must be on the
// database's clock: the host's may be minutes apart from it. Before any
// claim, the host's clock.
func (r *Relayer) dbNow() time.Time {
	now := r.wallNow()
	if b := r.clock.Load(); b != nil {
		return b.db.Add(now.Sub(b.host))
	}
	return now
}

// New validates cfg and returns a relayer that is not yet running. A
// Config it refuses is an error wrapping [ErrInvalidConfig]. pool may be
// nil for a relayer used only through [Relayer.RelayOnce]; [Relayer.Start]
// refuses to run one.
func New(pool *pgxpool.Pool, cfg Config) (*Relayer, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	st, err := store.New(cfg.Schema)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	seed := cfg.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	return &Relayer{
		cfg:     cfg,
		pool:    pool,
		store:   st,
		log:     cfg.Logger.With("relayer", cfg.RelayerID),
		backoff: Backoff{Base: cfg.BackoffBase, Cap: cfg.BackoffCap},
		rnd:     rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
	}, nil
}

// ID returns the relayer id recorded in attempt rows.
func (r *Relayer) ID() string { return r.cfg.RelayerID }

// Health is what a readiness probe needs to know about a relayer.
type Health struct {
	Running   bool // started, and no stop has begun
	Listening bool // its LISTEN connection is up
	PollOnly  bool // LISTEN is off by configuration (Config.PollOnly)
	// ReadOnly says the database refused the relayer's last claim as
	// read-only (SQLSTATE 25006): its connections reach a standby (a
	// pooler or a URL that still names the old primary after a
	// failover), so it cannot claim anything until they reach a primary.
	ReadOnly bool
	// ClaimError is why the relayer's last claim failed (nil once one
	// succeeds; an ordering conflict, a race another claim won, does not
	// count): the database refusing its connections (too many
	// connections, SQLSTATE 53300, for the server or for its role), a
	// lock or statement timeout, a database that does not answer. Its
	// LISTEN connection, opened earlier, and another pool (an admin
	// address's own) may still answer meanwhile, so neither tells.
	ClaimError error
	// RecordError is why an outcome write is failing: the last try of
	// one of the relayer's writers (OutcomeWriters) failed. It is nil
	// once each writer's last try succeeded (a write is retried until it
	// does), not when another writer's write does. While every
	// slot is held by an outcome waiting to be written the claim loop
	// does not claim, so ClaimError alone would not tell.
	RecordError error
	// SharedID names the other runs of this relayer's id that its last
	// registration refresh found live ("" if none): another process runs
	// under the same relayer id, which must name one running relayer
	// (Config.RelayerID). The relayer goes on; the readiness probe says
	// degraded.
	SharedID string
}

// Health reports whether the relayer runs and whether its listener is
// connected.
func (r *Relayer) Health() Health {
	h := Health{Running: r.lc.Serving(), PollOnly: r.cfg.PollOnly}
	if run := r.current.Load(); run != nil && h.Running {
		h.Listening = run.listening.Load()
		h.ReadOnly = run.readOnly.Load()
		h.ClaimError = run.claimFailure.get()
		h.RecordError = run.rec.lastFailure()
		if s := run.reg.shared.Load(); s != nil {
			h.SharedID = *s
		}
	}
	return h
}

// Stats returns a snapshot of the counters.
func (r *Relayer) Stats() Stats {
	s := &r.stats
	return Stats{
		Claims: s.claims.Load(), ClaimBatches: s.claimBatches.Load(), Claimed: s.claimed.Load(), Handoffs: s.handoffs.Load(), OutcomeWrites: s.outcomeWrites.Load(), Dispatched: s.dispatched.Load(),
		Retried: s.retried.Load(), Dead: s.dead.Load(), Released: s.released.Load(), Late: s.late.Load(), Absorbed: s.absorbed.Load(), IDConflicts: s.idConflicts.Load(),
		LeftInFlight: s.leftInFlight.Load(), Notifications: s.notifications.Load(), Polls: s.polls.Load(),
		HotPolls: s.hotPolls.Load(), OutcomeWriteTime: time.Duration(s.outcomeWriteTime.Load()),
	}
}

// Start starts the relayer's goroutines and returns; they run until Stop.
// ctx is used for start-up work only (its values are kept).
//
// Start first checks the database: errors that no retry can fix (the
// server refuses our credentials, the database does not exist, a missing
// privilege, a schema that is not migrated or behind this build) are
// returned at once, and nothing is started. A database that cannot be
// reached is not such an error: the relayer starts and keeps trying with
// capped backoff. Start on a running relayer returns an error wrapping
// [ErrAlreadyStarted]; on a relayer made without a pool, one wrapping
// [ErrNoPool].
func (r *Relayer) Start(ctx context.Context) error {
	_, err := r.start(ctx)
	return err
}

// start is Start; it also returns a channel closed once this start's run
// has been stopped, by whichever Stop, for Run to return on.
func (r *Relayer) start(ctx context.Context) (<-chan struct{}, error) {
	if r.pool == nil {
		// Nothing to claim, listen or record on: pgx would panic.
		return nil, fmt.Errorf("engine: relayer %s: %w", r.cfg.RelayerID, ErrNoPool)
	}
	stopped, err := r.lc.StartDone(ctx, func(ctx context.Context) (lifecycle.StopFunc, error) {
		checked, err := retry.Preflight(ctx, r.pool, r.cfg.Schema, r.log, "relayer")
		if err != nil {
			return nil, err
		}
		if err := r.store.EnsurePartitions(ctx, r.pool, partitionMonthsAhead); err != nil {
			r.log.Warn("could not ensure attempt partitions", "err", err)
		}
		ru := r.newRun()
		ru.schemaChecked.Store(checked)
		// Before the first claim (registration.go); if the database is
		// out of reach, the claim loop registers before it claims.
		if err := ru.register(ctx); err != nil {
			r.log.Warn("could not register this run; it is registered before its first claim", "err", err)
		}
		ru.start(context.WithoutCancel(ctx))
		r.current.Store(ru)
		r.log.Info("relayer started", "rails", r.cfg.Rails.Types(),
			"poll_only", r.cfg.PollOnly, "max_concurrency", r.cfg.MaxConcurrency, "batch_size", r.cfg.BatchSize)
		return ru.stop, nil
	})
	if err != nil {
		return nil, fmt.Errorf("engine: relayer %s: %w", r.cfg.RelayerID, err)
	}
	return stopped, nil
}

// Stop stops gracefully: no more claims; instructions claimed but not yet
// sent are handed back; dispatches in progress may finish until ctx is done
// (the hard deadline); outcomes are flushed; the listener closes. A rail
// call still running at the deadline is cancelled and recorded as a
// retryable CUT_OFF_AT_STOP attempt, outcome unknown: back to pending with
// the same idempotency key, not claimed again before its lease ends (the
// rail may still be acting), counted neither against the retry budget nor
// as a zombie. A dispatch that ignores the cancellation and returns after
// the flush is abandoned without an outcome: its in-flight row stays
// leased and the reaper requeues it after the lease. Stop returns
// context.DeadlineExceeded if the deadline cut anything off.
//
// Recording, and removing the relayer's idle registration, get up to
// [StopRecordTimeout] after the dispatches ended or ctx's deadline passed,
// whichever came first; if the database cannot
// be reached by then, the unrecorded outcomes are abandoned the same way
// (left in flight for the reaper), so Stop returns even while the
// database is down. A claim in progress when Stop begins is waited for,
// not cancelled (one that committed unheard would strand what it took):
// on a database that stopped answering, up to its 30 s round-trip
// deadline, before the rest. Stop on a relayer that is not running
// returns nil.
func (r *Relayer) Stop(ctx context.Context) error { return r.lc.Stop(ctx) }

// Run starts the relayer, runs until ctx is cancelled, then stops it
// gracefully with Config.StopTimeout as the hard deadline. A relayer
// stopped meanwhile by [Relayer.Stop] ends Run too, once that Stop has
// ended: Run returns nil, and that Stop reports its own errors.
func (r *Relayer) Run(ctx context.Context) error {
	stopped, err := r.start(ctx)
	if err != nil {
		return err
	}
	select {
	case <-ctx.Done():
	case <-stopped:
		return nil
	}
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.StopTimeout)
	defer cancel()
	if err := r.Stop(stopCtx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}

// run is one Start..Stop of a relayer: everything that lives that long. A
// dispatch abandoned at a stop deadline keeps its own run, so a restart
// never shares state with it.
type run struct {
	*Relayer

	// slots bound what is claimed and not yet recorded (MaxConcurrency).
	slots *semaphore.Weighted
	// railLoad counts, per rail type, the dispatches in progress (from
	// their claim until the rail call returns, so those waiting for a
	// rail slot too): a rail whose count reaches its concurrency cap is
	// left out of claims and hand-offs (claimable). Nil for RelayOnce.
	railLoad map[string]*atomic.Int64
	inFlight atomic.Int64  // dispatches in progress
	wake     chan struct{} // notifications (and the listener's connects)
	freed    chan struct{} // recorded outcomes gave slots back
	rec      *recorder
	// lastNotified is when the claim loop last claimed for a notification
	// (its own).
	lastNotified time.Time
	// isolating is set while the claim loop dispatches suspects alone (or
	// waits to): no hand-offs.
	isolating atomic.Bool
	// backlog is set while the queue holds more than this relayer takes:
	// its last claim, or its last write's refill, came back full. Outcome
	// writes then refill their freed slots (store.HandoffParams.Refill).
	backlog atomic.Bool
	// lastSuspectCheck is when the claim loop last asked for suspects,
	// and suspectsDue the answer of its last claim that asked: the next
	// claim is then a suspect's (claimOnce). Both the claim loop's own.
	lastSuspectCheck time.Time
	suspectsDue      bool
	// lost is what the claim loop knows of a claim whose reply was lost
	// (lostclaim.go). The claim loop's own.
	lost lostClaim
	// reg is the run's registration (registration.go), refreshed by
	// refreshLoop until regDone. Nil for RelayOnce.
	reg     *registration
	regDone chan struct{}
	// leftAtStart is Stats.LeftInFlight when the run began: more at its
	// stop, and it leaves claims in flight that its registration covers.
	leftAtStart int64
	// handoffMu orders hand-offs before Stop's wait for dispatches.
	handoffMu sync.RWMutex

	listening atomic.Bool
	// retryLog sums up the retries of one rail and code (logRetry).
	retryLog retryLog
	// readOnly is set while claims fail because the database is read-only
	// (Health.ReadOnly).
	readOnly atomic.Bool
	// claimFailure is the error of the last claim, if it failed
	// (Health.ClaimError; the outcome writers' are the recorder's).
	claimFailure lastError
	// schemaChecked is set once the schema was found at this build's
	// version: at start, or, if the database could not be asked then, by
	// the claim loop, which claims nothing until it is (checkSchema).
	schemaChecked atomic.Bool

	stopping    chan struct{}      // closed when Stop begins
	dispatchCtx context.Context    // cancelled at the hard deadline
	hardStop    context.CancelFunc // cancels dispatchCtx
	// slotWait bounds a dispatch's wait for a rail slot: cancelled when
	// Stop begins (releaseUnsent), so claims not yet sent go back.
	slotWait      context.Context
	releaseUnsent context.CancelFunc
	listenCancel  context.CancelFunc
	loopDone      chan struct{}
	listenDone    chan struct{}
	retryLogDone  chan struct{} // closed when retryLogTicks returns
	dispatches    sync.WaitGroup
}

func (r *Relayer) newRun() *run {
	ru := &run{
		Relayer:      r,
		slots:        semaphore.NewWeighted(int64(r.cfg.MaxConcurrency)),
		wake:         make(chan struct{}, 1),
		freed:        make(chan struct{}, 1),
		stopping:     make(chan struct{}),
		loopDone:     make(chan struct{}),
		listenDone:   make(chan struct{}),
		retryLogDone: make(chan struct{}),
		reg:          newRegistration(),
		regDone:      make(chan struct{}),
		leftAtStart:  r.stats.leftInFlight.Load(),
	}
	ru.railLoad = make(map[string]*atomic.Int64)
	for _, t := range r.cfg.Rails.Types() {
		ru.railLoad[t] = new(atomic.Int64)
	}
	ru.dispatchCtx, ru.hardStop = context.WithCancel(context.Background())
	ru.slotWait, ru.releaseUnsent = context.WithCancel(ru.dispatchCtx)
	ru.rec = newRecorder(ru)
	return ru
}

// start launches the listener, the recorder, the claim loop, the retry
// log's tick and the registration's refresh.
func (r *run) start(ctx context.Context) {
	if r.cfg.PollOnly {
		close(r.listenDone)
	} else {
		var lctx context.Context
		lctx, r.listenCancel = context.WithCancel(ctx)
		go r.listen(lctx)
	}
	go r.rec.loop()
	go r.claimLoop(ctx)
	go r.retryLogTicks()
	go r.refreshLoop()
}

// stop is the run's part of Relayer.Stop.
func (r *run) stop(ctx context.Context) error {
	var result error
	stragglers := false // dispatches still running when recording stops
	r.handoffMu.Lock()
	close(r.stopping)
	r.handoffMu.Unlock()
	r.releaseUnsent()
	<-r.loopDone

	done := make(chan struct{})
	go func() { r.dispatches.Wait(); close(done) }()
	// Recording and the clean-up after it share StopRecordTimeout from
	// here, the dispatches' end or the hard deadline, whichever is first:
	// the moment given to cancelled dispatches below runs beside the
	// recording, so Stop returns StopRecordTimeout after the deadline at
	// most, also while the database does not answer. (An outcome write
	// that may hand off counts as a dispatch; blocked on a silent database
	// it held Stop for the deadline, then that moment, then the whole
	// StopRecordTimeout: 5 s past the bound.)
	select {
	case <-done:
	case <-ctx.Done():
		result = ctx.Err()
	}
	recordBy := time.Now().Add(StopRecordTimeout)
	if result != nil {
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
			stragglers = true
		}
	}
	r.rec.finish(recordBy)
	r.hardStop()
	// Every retry recorded is logged by now: the counts of the retry
	// log's windows not yet said are said here, whether or not their
	// minute is over (nothing of this run will say them later).
	<-r.retryLogDone
	r.logEndedRetries(r.retryLogNow(), true, nil)
	if stragglers {
		// A dispatch still running that passed submit's check before
		// finish closed quit may queue its outcome after the final
		// flush: once they have all returned, account for what is there.
		go func() {
			<-done
			r.rec.leaveQueued()
		}()
	}

	// What recording left of its time, 5 s at most: after recording was
	// abandoned for a database that does not answer, the removal waited
	// its own 5 s for it. A registration left behind goes with the
	// reaper's pass, an hour later.
	cleanup, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(5*time.Second, time.Until(recordBy)))
	if err := r.unregisterIdle(cleanup); err != nil {
		r.log.Warn("could not unregister idle relayer", "err", err)
	}
	<-r.regDone
	r.endRegistration(cleanup, stragglers || r.stats.leftInFlight.Load() > r.leftAtStart)
	cancel()
	if r.listenCancel != nil {
		r.listenCancel()
	}
	<-r.listenDone
	st := r.Stats()
	r.log.Info("relayer stopped", "dispatched", st.Dispatched, "retried", st.Retried, "dead", st.Dead,
		"left_in_flight", st.LeftInFlight)
	return result
}

// lastError is the error of the last try of something retried, nil after
// one that succeeded; safe for concurrent use.
type lastError struct{ p atomic.Pointer[error] }

// set records the outcome of a try.
func (l *lastError) set(err error) {
	if err == nil {
		if l.p.Load() != nil {
			l.p.Store(nil)
		}
		return
	}
	l.p.Store(&err)
}

// get returns the last try's error, nil if it succeeded.
func (l *lastError) get() error {
	if p := l.p.Load(); p != nil {
		return *p
	}
	return nil
}

func (r *run) isStopping() bool {
	select {
	case <-r.stopping:
		return true
	default:
		return false
	}
}

// signal wakes the claim loop (non-blocking; one pending wake is enough).
func (r *run) signal() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}
