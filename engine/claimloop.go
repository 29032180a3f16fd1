package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ledgerline/outbox/internal/retry"
	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/migrations"
)

// persistentConflict is how long claims may keep failing on ordering
// conflicts before the claim loop logs it: far longer than any race.
const persistentConflict = 10 * time.Second

// claimLoop claims while there is work and slots, and otherwise waits for a
// notification, a local wake (an outcome batch gave slots back) or the poll.
func (r *run) claimLoop(ctx context.Context) {
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
	empty := 0              // consecutive claims that found nothing
	var lastFound time.Time // when a claim last found work
	// conflictsSince is when the current run of ordering conflicts began
	// (zero: the last claim had none), conflictsLogged when one was last
	// logged.
	var conflictsSince, conflictsLogged time.Time
	conflicts := 0
	longConflict := persistentConflict
	if r.testHooks.persistentConflict > 0 {
		longConflict = r.testHooks.persistentConflict
	}
	var lastRefresh time.Time
	failures := &retry.Loop{Log: r.log, What: "claim", Min: 50 * time.Millisecond, Max: claimBackoffCap}
	schemaFailures := &retry.Loop{Log: r.log, What: "schema check", Min: 50 * time.Millisecond, Max: claimBackoffCap}
	idleFailures := &retry.Loop{Log: r.log, What: "idle registration", Min: r.cfg.IdleRefresh, Max: r.cfg.IdleRefresh}
	for !r.isStopping() {
		if !r.schemaChecked.Load() {
			if err := r.checkSchema(stopCtx); err != nil {
				if stopCtx.Err() != nil || !r.sleep(stopCtx, schemaFailures.Failed(err)) {
					return
				}
				continue
			}
			schemaFailures.Succeeded()
		}
		n, full, err := r.claimOnce(stopCtx)
		if stopCtx.Err() == nil {
			r.readOnly.Store(isReadOnly(err))
			if !errors.Is(err, store.ErrOrderingConflict) {
				r.claimFailure.set(err)
			}
		}
		switch {
		case err != nil && stopCtx.Err() != nil:
			return
		case errors.Is(err, store.ErrOrderingConflict):
			// A concurrent claim won a participant; try again shortly (not
			// at once: two relayers retrying in lockstep would spin). Races
			// end within a claim or two; conflicts that go on mean a due
			// row the database refuses to put in flight every time (a
			// broken invariant, which audit verify names), and no claim of
			// this relayer succeeds meanwhile: say so, once a minute.
			conflicts++
			if conflictsSince.IsZero() {
				conflictsSince = time.Now()
			}
			if time.Since(conflictsSince) >= longConflict && time.Since(conflictsLogged) >= time.Minute {
				conflictsLogged = time.Now()
				r.log.Error("every claim fails on the one-in-flight-per-participant index; run `outbox audit verify`",
					"conflicts", conflicts, "since", conflictsSince, "err", err)
			}
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
		conflictsSince, conflicts = time.Time{}, 0
		if n > 0 {
			empty, lastFound = 0, time.Now()
		} else {
			empty++
		}
		if n > 0 && registered {
			if err := r.unregisterIdle(stopCtx); err == nil {
				registered = false
			}
		}
		if full || r.suspectsDue {
			continue // drain mode: there is probably more; or a suspect to claim alone
		}
		if r.shouldRegisterIdle(empty, lastFound) {
			if !registered || time.Since(lastRefresh) >= r.cfg.IdleRefresh {
				found, err := r.goIdle(stopCtx)
				if err != nil && stopCtx.Err() == nil {
					idleFailures.Failed(err)
				} else if err == nil {
					idleFailures.Succeeded()
					registered, lastRefresh = true, time.Now()
				}
				if found {
					empty, lastFound = 0, time.Now()
					if err := r.unregisterIdle(stopCtx); err == nil {
						registered = false
					}
					continue
				}
			}
		}
		if r.suspectsDue {
			continue // the idle registration's claims found a suspect due
		}
		if !r.waitForWork(stopCtx, r.nextWait(empty, registered, lastFound)) {
			return
		}
	}
}

// checkSchema is the start's schema check for a relayer that could not
// reach the database when it started: its statements need this build's
// schema, and on an older one (a rolling deploy that replaced the binaries
// before migrating) a claim would reach the rail and its outcome write
// then fail for a column or a function not there yet, the instruction
// going back to the rail at its lease's end. Behind, it claims nothing
// and says so, and claims once the schema is migrated.
func (r *run) checkSchema(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, r.roundTripDeadline())
	defer cancel()
	if _, err := migrations.Ready(ctx, r.pool, r.cfg.Schema); err != nil {
		if retry.Permanent(err) {
			err = retry.Explain(err)
		}
		return fmt.Errorf("not claiming until the schema is checked: %w", err)
	}
	r.schemaChecked.Store(true)
	return nil
}

// isReadOnly reports whether err is the database refusing a write because
// it is read-only (read_only_sql_transaction: a standby, or
// default_transaction_read_only), which no retry on the same server fixes.
func isReadOnly(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "25006"
}

// idleAfterEmptyClaims is how many claims in a row must find nothing
// before a relayer registers idle, and for at least as long as that many
// hot polls of nextWait take (idleAfterNothing: 2 + 4 + 8 = 14 ms at the
// default Debounce).
const idleAfterEmptyClaims = 3

// idleAfterNothing is how long a relayer's claims must have found nothing
// before it registers idle: the hot polls of idleAfterEmptyClaims empty
// claims. The count alone is not enough: claims prompted by freed slots
// (or a notification) come as fast as outcome writes, and at a steady
// 1,000/s three of them in a few milliseconds registered relayers whose
// stream had not stopped, two registrations in three sooner than this, so
// that producers paid for NOTIFY (docs/performance.md).
func (r *run) idleAfterNothing() time.Duration {
	return r.cfg.Debounce * (1<<idleAfterEmptyClaims - 1)
}

// shouldRegisterIdle decides when producers start paying for NOTIFY: when
// this relayer listens and its hot polls have found nothing for a while,
// whether or not it has dispatches in flight. A relayer busy with slow
// rails must still hear of new work at once: its own outcomes wake it
// only as often as they come, and at low rates not at all. While claims
// keep finding work, the relayer polls instead (nextWait), so at a steady
// rate producers send no NOTIFY, whose commit takes a cluster-wide lock
// (it halved producer throughput in `outbox bench notify`).
func (r *run) shouldRegisterIdle(empty int, lastFound time.Time) bool {
	return r.listening.Load() && empty >= idleAfterEmptyClaims && time.Since(lastFound) >= r.idleAfterNothing()
}

// nextWait is how long the loop waits for a wake before claiming again.
// Registered idle, the fallback poll (NOTIFY wakes it sooner). Otherwise a
// hot poll: Debounce after a claim that found work, doubling with each
// claim that found nothing, up to the poll interval: a steady stream is
// picked up within a few milliseconds without any NOTIFY, and a relayer
// whose stream stopped is back to the poll interval within a second.
//
// A relayer that has had its empty claims but not yet their time of
// nothing (idleAfterNothing, since lastFound) waits no longer than that
// time: its next claim, if empty, registers it. Claims prompted by freed
// slots count as empty claims too: after a burst whose outcomes come back
// in many writes, the doubling alone would reach the poll interval before
// the relayer registers, and new work would wait for the poll.
func (r *run) nextWait(empty int, registered bool, lastFound time.Time) wait {
	poll := r.pollDelay()
	if registered {
		return wait{d: min(poll, r.cfg.IdleRefresh)}
	}
	w := wait{d: poll}
	if empty <= 20 && r.cfg.Debounce<<empty < poll {
		w = wait{d: r.cfg.Debounce << empty, hot: true}
	}
	if empty >= idleAfterEmptyClaims && r.listening.Load() {
		if rest := r.idleAfterNothing() - time.Since(lastFound); rest > 0 && rest < w.d {
			w = wait{d: rest, hot: true}
		}
	}
	return w
}

// wait is how long waitForWork waits, and whether it is a hot poll.
type wait struct {
	d   time.Duration
	hot bool
}

// waitForWork blocks until a notification, slots freed by recorded
// outcomes, the end of wait, or stop. It reports false on stop.
//
// Notifications are debounced on the leading edge: the first one claims at
// once; those arriving within Debounce of the last notified claim collapse
// into one claim at the end of that window, so a NOTIFY storm costs at most
// one claim per window. Freed slots claim at once: they come at the pace of
// this relayer's own outcome batches.
func (r *run) waitForWork(ctx context.Context, w wait) bool {
	t := time.NewTimer(w.d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-r.freed:
		return true
	case <-r.wake:
		if rest := r.cfg.Debounce - time.Since(r.lastNotified); rest > 0 && !r.sleep(ctx, rest) {
			return false
		}
		r.lastNotified = time.Now()
		return true
	case <-t.C:
		if w.hot {
			r.stats.hotPolls.Add(1)
		} else {
			r.stats.polls.Add(1)
		}
		return true
	}
}

// defaultRoundTripDeadline bounds each of a relayer's round trips to the
// database: a claim, an outcome write, and the claim loop's other
// statements (the look for suspects, the idle registration and its
// checks). On a connection that went silent (a black-holed network, a
// primary that died without resetting its connections) nothing else ends
// the wait before TCP gives up, about 15 minutes on Linux, and
// PostgreSQL's statement_timeout cannot help a server that is not there.
// The context's deadline makes pgx give the connection up, so the next
// statement takes a fresh one. pgx closes it in the background, reading
// it for up to 15 s more, and the pool frees its slot only then: a pool
// whose every connection went silent at once waits that much longer for
// a fresh one (engine.TestClaimLoopSurvivesBlackHoledConnections allows for
// it).
const defaultRoundTripDeadline = 30 * time.Second

// roundTripDeadline is defaultRoundTripDeadline, or what a test set.
func (r *run) roundTripDeadline() time.Duration {
	if d := r.testHooks.statementDeadline; d > 0 {
		return d
	}
	return defaultRoundTripDeadline
}

// bounded derives from ctx the context of one round trip of the claim
// loop (see defaultRoundTripDeadline).
func (r *run) bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, r.roundTripDeadline())
}

func (r *run) pollDelay() time.Duration {
	r.rndMu.Lock()
	j := 0.8 + 0.4*r.rnd.Float64()
	r.rndMu.Unlock()
	return time.Duration(float64(r.cfg.PollInterval) * j)
}

func (r *run) sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// claimOnce takes as many free slots as it can (waiting for at least one),
// claims up to that many instructions and starts their dispatches. A slot
// is held from the claim until the outcome is recorded (see recorder), so
// slots come back in outcome batches and claims stay large. full reports
// that every slot asked for was filled. After a claim that failed without
// the server's answer, it first hands back what that claim took if it
// committed (releaseLostClaim).
func (r *run) claimOnce(ctx context.Context) (n int, full bool, err error) {
	if r.lost.claim || len(r.lost.released) > 0 {
		if err := r.releaseLostClaim(ctx); err != nil {
			return 0, false, err
		}
	}
	if r.isolating.Load() || r.suspectsDue {
		r.suspectsDue = false
		return r.claimSuspect(ctx)
	}
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
	// timeout instead, which the run's registration covers.
	claimCtx, cancel, err := r.claimContext(ctx)
	if err != nil {
		r.slots.Release(int64(want))
		return 0, false, err
	}
	// Taken before the claim, so it is no later than the database's claim
	// time: leases measured from it by this process's clock end no later
	// than the database's, however the two clocks disagree.
	claimStart := time.Now()
	claimed, err := r.claim(claimCtx, r.pool, want)
	cancel()
	r.slots.Release(int64(want - len(claimed)))
	if err == nil {
		r.backlog.Store(len(claimed) == want)
	}
	if err != nil || len(claimed) == 0 {
		return 0, false, err
	}
	r.stats.claimBatches.Add(1)
	r.lost.heard(claimed)
	r.startDispatches(claimed, claimStart, 0)
	return len(claimed), len(claimed) == want, nil
}

// suspectCheckInterval is how often a relayer asks whether suspects (see
// store.ClaimParams.Suspects) are due.
const suspectCheckInterval = 250 * time.Millisecond

// suspectRails are the rail types whose suspects a claim asks about
// (store.Store.ClaimAsking), at most every suspectCheckInterval, and
// otherwise none. They are the rails claimSuspect would claim: a suspect
// it could not take (breaker not closed, rail paused) must not start an
// isolation that drains every dispatch for nothing. The question rides
// the claim's round trip: in one of its own before the claim, it held up
// what that claim took.
func (r *run) suspectRails() []string {
	if time.Since(r.lastSuspectCheck) < suspectCheckInterval {
		return nil
	}
	r.lastSuspectCheck = time.Now()
	closed, _ := r.cfg.Rails.Claimable()
	return closed
}

// claimSuspect dispatches one suspect alone. It stops hand-offs
// (isolating), waits until everything this relayer holds is recorded (all
// its slots free: the previous suspect too, when it is called again while
// isolating), then claims one suspect, whose outcome frees its slot the
// usual way: if the suspect is a poison instruction and kills the process,
// nothing else dies with it. Isolation ends when no suspect is left to
// claim. Suspects are rare (their relayer died twice with them in flight),
// so the pause is too.
func (r *run) claimSuspect(ctx context.Context) (int, bool, error) {
	all := int64(r.cfg.MaxConcurrency)
	r.isolating.Store(true)
	if err := r.slots.Acquire(ctx, all); err != nil {
		r.isolating.Store(false)
		return 0, false, err
	}
	closed, _ := r.cfg.Rails.Claimable()
	var claimed []store.Claimed
	var err error
	claimStart := time.Now()
	if len(closed) > 0 {
		var claimCtx context.Context
		var cancel context.CancelFunc
		claimCtx, cancel, err = r.claimContext(ctx)
		if err != nil {
			r.slots.Release(all)
			r.isolating.Store(false)
			return 0, false, err
		}
		r.stats.claims.Add(1)
		claimed, err = r.store.Claim(claimCtx, r.pool, store.ClaimParams{RelayerID: r.cfg.RelayerID, Limit: 1,
			Leases: r.leases(closed), Suspects: true})
		cancel()
		r.lost.failed(err, nil)
	}
	r.slots.Release(all - int64(len(claimed)))
	if err != nil || len(claimed) == 0 {
		r.isolating.Store(false)
		return 0, false, err
	}
	r.stats.claimBatches.Add(1)
	r.lost.heard(claimed)
	r.log.Info("dispatching a suspect alone (its relayer died twice while it was in flight)", "outbox_id", claimed[0].OutboxID,
		"instruction_id", claimed[0].InstructionID, "participant", claimed[0].ParticipantID, "attempt_no", claimed[0].AttemptNo)
	r.startDispatches(claimed, claimStart, 0)
	return 1, false, nil
}

// claim claims up to limit instructions of rails whose breaker admits
// calls, in db; a half-open rail gets a claim of one, its probe.
func (r *run) claim(ctx context.Context, db store.Batcher, limit int) ([]store.Claimed, error) {
	closed, halfOpen := r.claimable()
	p := store.ClaimParams{RelayerID: r.cfg.RelayerID, Limit: limit}
	var out []store.Claimed
	if len(halfOpen) > 0 {
		p.Leases = r.leases(halfOpen)
		p.Limit = 1
		r.stats.claims.Add(1)
		probe, err := r.store.Claim(ctx, db, p)
		if err != nil {
			r.lost.failed(err, nil)
			return nil, err
		}
		// In flight from its claim, not its call: a claim made before
		// its call begins (the next pass of a drain) must not claim
		// another probe, which the breaker would refuse.
		for _, c := range probe {
			r.cfg.Rails.ProbeClaimed(c.RailType)
		}
		out = probe
		p.Limit = limit - len(probe)
	}
	if len(closed) > 0 && p.Limit > 0 {
		p.Leases = r.leases(closed)
		r.stats.claims.Add(1)
		more, due, err := r.store.ClaimAsking(ctx, db, p, r.suspectRails())
		if err != nil {
			r.lost.failed(err, out)
			return out, joinClaimErr(out, err)
		}
		r.suspectsDue = due
		out = append(out, more...)
	}
	return out, nil
}

// claimable is Rails.Claimable without the closed rails whose dispatches
// in progress (railLoad) fill their concurrency cap, unless every closed
// rail's do. Claims take the oldest due instructions across rails: a rail
// that answers slowly, its breaker closed, would otherwise fill every slot
// of the relayer with its backlog, each waiting for a rail slot, and
// another rail's instruction would be claimed only once the slow rail's
// whole backlog older than it had been. A rail left out is claimed again
// once one of its calls returns; at most a claim's worth beyond its cap
// waits meanwhile. When every closed rail is full (one rail draining a
// backlog) leaving them out would starve nobody, and would only take the
// refill from the outcome writes.
func (r *run) claimable() (closed, halfOpen []string) {
	closed, halfOpen = r.cfg.Rails.Claimable()
	if r.railLoad == nil || len(closed) < 2 {
		return closed, halfOpen
	}
	var kept []string
	for _, t := range closed {
		if n := r.railLoad[t]; n == nil || n.Load() < int64(r.cfg.Rails.MaxConcurrency(t)) {
			kept = append(kept, t)
		}
	}
	if len(kept) == 0 {
		return closed, halfOpen
	}
	return kept, halfOpen
}

// railReturned counts a dispatch of railType whose rail call (or its wait
// for one) is over (see railLoad). Not inlined: dispatch's frame is on
// every call's stack, down to the transport (see dispatch).
//
//go:noinline
func (r *run) railReturned(railType string) {
	if n := r.railLoad[railType]; n != nil {
		n.Add(-1)
	}
}

// joinClaimErr keeps a successful probe claim when the second claim fails:
// the probe is ours and must be dispatched.
func joinClaimErr(claimed []store.Claimed, err error) error {
	if len(claimed) > 0 {
		return nil
	}
	return err
}

func (r *run) leases(types []string) map[string]time.Duration {
	m := make(map[string]time.Duration, len(types))
	for _, t := range types {
		m[t] = r.cfg.Rails.Timeout(t) + r.cfg.LeaseGrace
	}
	return m
}

// startDispatches starts the dispatches of claimed instructions (each holds
// a slot already). handoffOf is the number of the outcome write whose
// hand-off claimed them, 0 for a claim (see recorder.hold).
func (r *run) startDispatches(claimed []store.Claimed, claimStart time.Time, handoffOf uint64) {
	r.stats.claimed.Add(int64(len(claimed)))
	if len(claimed) > 0 {
		r.noteClaim(claimed[0].ClaimedAt, claimStart)
	}
	r.log.Debug("claimed", "count", len(claimed))
	r.inFlight.Add(int64(len(claimed)))
	r.dispatches.Add(len(claimed))
	for _, c := range claimed {
		if n := r.railLoad[c.RailType]; n != nil {
			n.Add(1)
		}
	}
	started := time.Now()
	for _, c := range claimed {
		go r.dispatch(c, r.callDeadline(claimStart, c), handoffOf, started)
	}
}

// callDeadline is the latest moment, by this process's clock, at which a
// rail call for c may end: the lease measured from claimStart, less half the
// grace period, which is left for recording the outcome before the
// database's lease ends and the reaper may hand the instruction to another
// relayer.
func (r *run) callDeadline(claimStart time.Time, c store.Claimed) time.Time {
	return claimStart.Add(c.LeaseUntil.Sub(c.ClaimedAt) - r.cfg.LeaseGrace/2)
}
