package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ledgerline/outbox/internal/retry"
	"github.com/ledgerline/outbox/internal/store"
)

// pendingOutcome is an outcome waiting to be recorded.
type pendingOutcome struct {
	store.Outcome
	enqueuedAt time.Time
	handoffOf  uint64        // the write whose hand-off claimed it; 0 for a claim
	took       time.Duration // from the start of its dispatch to its outcome
}

// recorder records the outcomes of one run in batches, as a group commit
// with OutcomeWriters writes in progress at most (see loop).
// Recording never gives up while the relayer runs; Stop gives it
// StopRecordTimeout to flush, then abandons what is left (in flight, for
// the reaper).
type recorder struct {
	r        *run
	outcomes chan pendingOutcome
	// quit is closed by finish: the loop records what is queued and
	// returns. outcomes itself is never closed, so a dispatch that returns
	// late cannot panic on a send.
	quit chan struct{}
	done chan struct{}
	// ctx is cancelled when finish gives up on recording (the database is
	// unreachable): the loop stops retrying, and what it could not record
	// stays in flight for the reaper.
	ctx     context.Context
	abandon context.CancelFunc
	// writers holds the writers not writing: a write takes one for its
	// duration, so at most OutcomeWriters are in progress (see loop). Each
	// is the failure tracker of its own retries.
	writers chan *retry.Loop
	// failures is each writer's last try's error (Health.RecordError):
	// one writer failing again and again (a participant's lock held)
	// while another succeeds is a failure for as long as it lasts, not
	// one cleared by every success of the other. Built once, read only.
	failures map[*retry.Loop]*lastError
	writes   sync.WaitGroup // writes in progress
	// spare holds batches whose writes ended, for the next writes to
	// reuse: a batch has room for FlushSize outcomes (256 by default, about
	// 90 KB), and a relayer moving a few busy participants writes one every
	// millisecond with ten in it. Allocating each afresh was nearly half of
	// what such a relayer allocated, and its collector's work.
	spare chan []pendingOutcome
	wrote chan struct{} // a write ended (capacity 1; a missed send means one is pending)
	// handoffMu guards handoffs: the loop reads it (hold), writers update
	// it as their writes commit.
	handoffMu sync.Mutex
	handoffs  handoffWatch
	// startedMu guards started: the writes in progress, by writer, and
	// when each started (see writer: the next write waits for them unless
	// the oldest is held up).
	startedMu sync.Mutex
	started   map[*retry.Loop]time.Time
	// observeMu keeps OnRecorded to one batch at a time.
	observeMu sync.Mutex
}

// handoffWatch is what the recorder knows of its last write's hand-offs,
// for hold.
type handoffWatch struct {
	last        uint64 // number of the last committed write
	pending     int    // its hand-offs whose outcomes have not arrived yet
	handoffTime ewma   // how long a hand-off's dispatch takes, start to outcome
	writeTime   ewma   // how long a write takes, round trip and commit
}

// ewma is an exponentially weighted moving average of durations (weight
// 1/8 for the newest sample), zero until the first sample.
type ewma struct{ v time.Duration }

func (e *ewma) add(d time.Duration) {
	if e.v == 0 {
		e.v = d
		return
	}
	e.v += (d - e.v) / 8
}

// lastFailure is the error of a writer whose last try failed, nil when
// every writer's last try succeeded.
func (rc *recorder) lastFailure() error {
	for _, l := range rc.failures {
		if err := l.get(); err != nil {
			return err
		}
	}
	return nil
}

func newRecorder(r *run) *recorder {
	n := max(r.cfg.OutcomeWriters, 1)
	rc := &recorder{
		r:        r,
		outcomes: make(chan pendingOutcome, 2*r.cfg.MaxConcurrency),
		quit:     make(chan struct{}),
		done:     make(chan struct{}),
		writers:  make(chan *retry.Loop, n),
		wrote:    make(chan struct{}, 1),
		spare:    make(chan []pendingOutcome, n+1),
		started:  make(map[*retry.Loop]time.Time, n),
		failures: make(map[*retry.Loop]*lastError, n),
	}
	for range n {
		w := &retry.Loop{Log: r.log, What: "record outcomes", Min: 20 * time.Millisecond, Max: 2 * time.Second}
		rc.failures[w] = new(lastError)
		rc.writers <- w
	}
	rc.ctx, rc.abandon = context.WithCancel(context.Background())
	return rc
}

// submit queues an outcome for recording; false means recording has
// stopped (the dispatch returned after Stop's deadline). Its check and its
// send are two steps, so an outcome may still be queued after the final
// flush; Stop accounts for those once its stragglers have returned
// (leaveQueued), which keeps this path, every outcome's, free of a lock.
func (rc *recorder) submit(po pendingOutcome) bool {
	select {
	case <-rc.quit:
		return false
	default:
	}
	select {
	case rc.outcomes <- po:
		return true
	case <-rc.quit:
		return false
	}
}

// finish flushes what is queued, giving up at deadline.
func (rc *recorder) finish(deadline time.Time) {
	close(rc.quit)
	select {
	case <-rc.done:
	case <-time.After(time.Until(deadline)):
		rc.r.log.Error("could not record outcomes while stopping; they stay in flight and the reaper requeues them after their leases",
			"gave_up_at", deadline)
		rc.abandon()
		<-rc.done
	}
	rc.abandon()
}

// leaveQueued accounts for outcomes queued after recording stopped (see
// run.stop), as leaveInFlight does for those submit refuses: their
// instructions stay in flight for the reaper.
func (rc *recorder) leaveQueued() {
	for _, po := range rc.takeQueued(nil, -1) {
		rc.r.slots.Release(1)
		rc.r.stats.leftInFlight.Add(1)
		rc.r.log.Warn("outcome queued after recording stopped; left in flight for the reaper", "outbox_id", po.OutboxID,
			"instruction_id", po.InstructionID, "participant", po.ParticipantID, "attempt_no", po.AttemptNo, "state", po.State)
	}
}

// loop records outcomes as a group commit: a write starts as soon as an
// outcome arrives if no write is in progress (with what gather adds, and
// what hold waits for), and whatever arrives during a write goes into the
// next one. No fixed timer stands on the critical path. When finish
// closes quit it records what is queued, waits for the writes in progress
// and returns.
//
// The next write waits for the one in progress unless it is full
// (FlushSize outcomes) or the one in progress is held up (stallAfter):
// then it starts at once if one of the OutcomeWriters is free. So a write
// held up by a lock or a slow commit holds up one more write's worth of
// outcomes at most, not all of them. Otherwise writes follow one another,
// so that what arrives during one joins the next: a relayer draining a
// backlog writes every outcome waiting in one statement (FlushSize is as
// large as MaxConcurrency by default), and a few busy participants stay in
// one write per cycle (see hold) instead of splitting into cohorts that
// each pay for a write. The writes are independent: each outcome is in
// one write, and its instruction's in-flight row fences it, as between two
// relayers.
func (rc *recorder) loop() {
	defer close(rc.done)
	for {
		select {
		case o := <-rc.outcomes:
			w, batch := rc.writer(append(rc.newBatch(), o))
			batch = rc.hold(rc.gather(batch))
			rc.setStarted(w, time.Now())
			rc.writes.Add(1)
			go func() {
				defer rc.writes.Done()
				rc.flush(w, batch)
				rc.reuse(batch)
				rc.setStarted(w, time.Time{})
				rc.writers <- w
				select {
				case rc.wrote <- struct{}{}:
				default:
				}
			}()
		case <-rc.quit:
			w := <-rc.writers
			rc.flush(w, rc.takeQueued(nil, -1))
			rc.writers <- w
			rc.writes.Wait()
			return
		}
	}
}

// newBatch returns an empty batch with room for FlushSize outcomes, one a
// write ended with if there is one.
func (rc *recorder) newBatch() []pendingOutcome {
	select {
	case b := <-rc.spare:
		return b
	default:
		return make([]pendingOutcome, 0, rc.r.cfg.FlushSize)
	}
}

// reuse keeps batch, whose write has ended, for a later write, cleared so
// that it holds on to no outcome's strings.
func (rc *recorder) reuse(batch []pendingOutcome) {
	clear(batch)
	select {
	case rc.spare <- batch[:0]:
	default:
	}
}

// writer returns a writer for the write batch starts, once it may start:
// at once if no write is in progress; otherwise when the write in
// progress ends, or as soon as batch is full (outcomes arriving meanwhile
// join it) and a writer is free, or once the write in progress is held up
// (it has run for stallAfter) and a writer is free. At stop it waits only
// for a free writer.
func (rc *recorder) writer(batch []pendingOutcome) (*retry.Loop, []pendingOutcome) {
	var stall *time.Timer
	defer func() {
		if stall != nil {
			stall.Stop()
		}
	}()
	stalled := false
	for {
		// Only this goroutine takes writers, so a writer being free stays
		// true until it takes one.
		if len(rc.writers) == cap(rc.writers) || len(batch) >= rc.r.cfg.FlushSize ||
			(stalled && len(rc.writers) > 0) {
			return <-rc.writers, batch
		}
		if stall == nil && !stalled {
			if since := rc.oldestStarted(); !since.IsZero() {
				stall = time.NewTimer(time.Until(since.Add(rc.stallAfter())))
			}
		}
		var stallC <-chan time.Time
		if stall != nil {
			stallC = stall.C
		}
		select {
		case o := <-rc.outcomes:
			batch = append(batch, o)
		case <-rc.wrote:
			// A write ended: the oldest in progress may be another.
			if stall != nil {
				stall.Stop()
				stall = nil
			}
		case <-stallC:
			stall, stalled = nil, true
		case <-rc.quit:
			return <-rc.writers, batch
		}
	}
}

// setStarted notes that writer w's write started at t, or ended (t zero).
func (rc *recorder) setStarted(w *retry.Loop, t time.Time) {
	rc.startedMu.Lock()
	defer rc.startedMu.Unlock()
	if t.IsZero() {
		delete(rc.started, w)
		return
	}
	rc.started[w] = t
}

// oldestStarted is when the oldest write in progress started (zero if
// none is).
func (rc *recorder) oldestStarted() time.Time {
	rc.startedMu.Lock()
	defer rc.startedMu.Unlock()
	var oldest time.Time
	for _, t := range rc.started {
		if oldest.IsZero() || t.Before(oldest) {
			oldest = t
		}
	}
	return oldest
}

// writeStallFloor is the least time a write runs before the next one stops
// waiting for it (see stallAfter).
const writeStallFloor = 100 * time.Millisecond

// stallAfter is how long a write may run before it counts as held up (by
// a participant's lock that a producer's open transaction holds, a slow
// commit): four times what a write has been taking, and at least
// writeStallFloor. Past it the next write starts beside it on another
// writer, so a held-up write holds up its own outcomes and at most one
// more write's, not every outcome the relayer has; below it, writes
// follow one another and each takes every outcome waiting (FlushSize).
func (rc *recorder) stallAfter() time.Duration {
	rc.handoffMu.Lock()
	w := rc.handoffs.writeTime.v
	rc.handoffMu.Unlock()
	return max(writeStallFloor, 4*w)
}

// gather adds to batch the outcomes that arrive while other goroutines are
// ready to run, up to FlushSize: it yields the processor and takes what was
// queued meanwhile, until a yield brings nothing new. No clock is involved,
// so an outcome never waits for one; what it gains is the outcomes of the
// dispatches a write has just started (a hand-off's successors on a fast
// rail), which a write that started at once would split into two.
func (rc *recorder) gather(batch []pendingOutcome) []pendingOutcome {
	for len(batch) < rc.r.cfg.FlushSize {
		runtime.Gosched()
		n := len(batch)
		if batch = rc.takeQueued(batch, rc.r.cfg.FlushSize); len(batch) == n {
			break
		}
	}
	return batch
}

// hold adds to batch the outcomes of the last write's hand-offs that are
// still out, if they are due back soon, waiting for them up to twice the
// time a hand-off's dispatch has been taking, never more than half a
// write, and not at all when a hand-off's dispatch takes half a write or
// longer (a slow rail).
//
// Without it, a few busy participants split into two groups that never
// meet again: the outcomes that arrived during a write start the next one
// at once, and the hand-offs that write just dispatched come back while it
// runs, so each participant moves one instruction every two writes. With
// ten participants on the sandbox rail, writes carried 3.6 to 6.7 outcomes
// each; holding about 0.2 ms for the hand-offs' outcomes makes one write of
// all ten (docs/performance.md, "Group commit").
func (rc *recorder) hold(batch []pendingOutcome) []pendingOutcome {
	rc.handoffMu.Lock()
	h := &rc.handoffs
	for i := range batch {
		h.arrived(&batch[i])
	}
	pending, handoffTime, writeTime := h.pending, h.handoffTime.v, h.writeTime.v
	rc.handoffMu.Unlock()
	limit := rc.r.cfg.FlushSize
	if pending <= 0 || len(batch) >= limit || handoffTime >= writeTime/2 {
		return batch
	}
	t := time.NewTimer(min(2*handoffTime, writeTime/2))
	defer t.Stop()
	for pending > 0 && len(batch) < limit {
		select {
		case o := <-rc.outcomes:
			rc.handoffMu.Lock()
			h.arrived(&o)
			pending = h.pending
			rc.handoffMu.Unlock()
			batch = append(batch, o)
		case <-t.C:
			return batch
		case <-rc.quit:
			return batch
		}
	}
	return batch
}

// arrived counts an outcome taken for a write: a hand-off's tells how long
// hand-offs take, and one of the last write's is no longer awaited.
func (h *handoffWatch) arrived(p *pendingOutcome) {
	if p.handoffOf == 0 {
		return
	}
	h.handoffTime.add(p.took)
	if p.handoffOf == h.last {
		h.pending--
	}
}

// wrote notes a committed write that took d and handed off handed
// instructions, and returns its number, which their outcomes carry.
func (h *handoffWatch) wrote(d time.Duration, handed int) uint64 {
	h.writeTime.add(d)
	h.last++
	h.pending = handed
	return h.last
}

// takeQueued appends the outcomes already queued to batch, up to limit in
// all (no limit when negative), without waiting.
func (rc *recorder) takeQueued(batch []pendingOutcome, limit int) []pendingOutcome {
	for limit < 0 || len(batch) < limit {
		select {
		case o := <-rc.outcomes:
			batch = append(batch, o)
		default:
			return batch
		}
	}
	return batch
}

// flush records outcomes in chunks of at most FlushSize, with writer w.
func (rc *recorder) flush(w *retry.Loop, batch []pendingOutcome) {
	for len(batch) > 0 {
		n := min(len(batch), rc.r.cfg.FlushSize)
		rc.flushChunk(w, batch[:n], false, 0)
		batch = batch[n:]
	}
}

// flushChunk writes one batch in one transaction, retrying until it
// succeeds: an outcome is never dropped while the relayer runs. Only when
// Stop abandons recording does it give up; the unrecorded instructions then
// stay in flight and the reaper requeues them after their leases. Either
// way the batch's slots go back, less those that carry handed-off
// instructions.
//
// A write that may have handed off and failed without the server's answer
// may have committed: it is sent again without a hand-off, and once it
// succeeds, what the lost write handed off (if it committed) is found and
// recorded as RELEASED (lostHandoffs), a look made only after such a
// failure.
//
// A batch the database refuses for its content (a data or constraint
// error: retrying the same statement cannot succeed) is split until the
// offending outcome is alone, so one bad outcome cannot block the others.
// That one is recorded once more with the rail's text removed; if even that
// fails it is left in flight. If that refusal answered the resend after a
// lost reply, the lost write's hand-offs are looked for before the split
// (its writes then hand off nothing that the look could take for them) and
// recorded as RELEASED after it.
//
// keep is how many of the batch's slots it keeps for outcomes recorded
// after it (those hand-offs, which took the slots of the batch's terminal
// outcomes); a batch that keeps slots does not hand off.
func (rc *recorder) flushChunk(w *retry.Loop, batch []pendingOutcome, scrubbed bool, keep int) {
	rc.write(w, batch, scrubbed, keep, false)
}

// write is flushChunk; with lockOnce it gives up instead at the first
// refusal on a lock (lock_not_available) and reports it (refused), nothing
// recorded and no slot given back, for apart to write it again.
func (rc *recorder) write(w *retry.Loop, batch []pendingOutcome, scrubbed bool, keep int, lockOnce bool) (refused bool) {
	r := rc.r
	if len(batch) == 0 {
		return false
	}
	outcomes := make([]store.Outcome, len(batch))
	terminal := 0
	for i, p := range batch {
		outcomes[i] = p.Outcome
		if p.State == store.Dispatched || p.State == store.Failed {
			terminal++
		}
	}
	handoff := keep == 0
	// lost is set once a write that may have handed off failed without the
	// server's answer (see replyLost): it may have committed, its hand-offs
	// this relayer's without its knowing.
	lost := false
	for {
		ctx, cancel := context.WithTimeout(rc.ctx, r.roundTripDeadline())
		recorded, handed, orphans, err := rc.record(ctx, outcomes, terminal, handoff)
		cancel()
		if recorded != nil {
			w.Succeeded()
			rc.failures[w].set(nil)
			// Archived; an error here is about withdrawing a requeued copy,
			// which then is dispatched again under the same key.
			if err != nil {
				r.log.Warn("outcomes recorded, but a late completion could not withdraw its requeued copy", "err", err)
			}
			if lost {
				orphans = append(orphans, rc.lostHandoffs(w, &outcomes[0])...)
			}
			// The orphans take slots of this batch's terminal outcomes, as
			// hand-offs do; recording their release gives them back.
			freed := len(batch) - handed - len(orphans) - keep
			r.slots.Release(int64(freed))
			rc.afterFlush(batch, recorded, freed)
			rc.flush(w, orphans)
			return false
		}
		if errors.Is(err, store.ErrOrderingConflict) && handoff {
			// A hand-off's claim, not the outcomes, was refused: record
			// them at once without it; the claim loop claims as usual.
			r.log.Warn("hand-off refused by the database; recording the outcomes without it", "err", err)
			handoff = false
			continue
		}
		if code, ok := contentError(err); ok {
			if lost {
				rc.unrecordableAfterLostReply(w, batch, outcomes, scrubbed, keep, code, err)
				return false
			}
			rc.unrecordable(w, batch, scrubbed, keep, code, err)
			return false
		}
		if lockRefused(err) {
			// Not after a lost reply: that write may have committed, and
			// only this loop looks for its hand-offs once the batch is in.
			if lockOnce && !lost {
				return true
			}
			if keep == 0 && !lost && manyParticipants(batch) {
				rc.apart(w, batch, scrubbed)
				return false
			}
		}
		if handoff && terminal > 0 && replyLost(err) {
			// The write may have committed, its reply lost. Send it again
			// without a hand-off: the outcomes are archived once whatever
			// happened (Record is idempotent), and if they were archived
			// by the lost write, what is in flight from that transaction
			// is its hand-offs, which lostHandoffs hands back.
			handoff, lost = false, true
		}
		rc.failures[w].set(err)
		if rc.ctx.Err() != nil {
			r.slots.Release(int64(len(batch) - keep))
			r.stats.leftInFlight.Add(int64(len(batch)))
			r.log.Error("gave up recording outcomes at stop; the reaper will requeue them", "count", len(batch), "err", err)
			return false
		}
		select {
		case <-time.After(w.Failed(err)):
		case <-rc.ctx.Done():
		}
	}
}

// apart writes a batch the database refused on a lock (a participant's
// sequences row, held by a producer's open transaction past the relayer's
// lock_timeout) participant by participant, each once, then again until
// they go through those refused on a lock again. Sent again whole, the
// batch was refused whole for as long as the lock was held: every
// participant's outcome in it waited, past its lease (the reaper requeued
// it, and it was sent a second time), for one producer's transaction.
//
//go:noinline
func (rc *recorder) apart(w *retry.Loop, batch []pendingOutcome, scrubbed bool) {
	rc.r.log.Warn("outcome write refused on a participant's lock; writing its participants apart", "count", len(batch))
	var held [][]pendingOutcome
	for _, g := range byParticipant(batch) {
		if rc.write(w, g, scrubbed, 0, true) {
			held = append(held, g)
		}
	}
	for _, g := range held {
		rc.flushChunk(w, g, scrubbed, 0)
	}
}

// byParticipant splits batch by participant, in the order of their first
// outcomes.
func byParticipant(batch []pendingOutcome) [][]pendingOutcome {
	at := make(map[string]int)
	var groups [][]pendingOutcome
	for _, p := range batch {
		i, ok := at[p.ParticipantID]
		if !ok {
			i = len(groups)
			at[p.ParticipantID] = i
			groups = append(groups, nil)
		}
		groups[i] = append(groups[i], p)
	}
	return groups
}

// manyParticipants reports whether batch holds the outcomes of more than
// one participant.
func manyParticipants(batch []pendingOutcome) bool {
	for _, p := range batch[1:] {
		if p.ParticipantID != batch[0].ParticipantID {
			return true
		}
	}
	return false
}

// sqlstateLockNotAvailable is PostgreSQL's lock_not_available: a statement
// waited for a lock longer than lock_timeout.
const sqlstateLockNotAvailable = "55P03"

// lockRefused reports whether err is the database giving up on a lock
// (lock_not_available).
func lockRefused(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == sqlstateLockNotAvailable
}

// replyLost reports whether err leaves a write's commit unknown: an error
// the server did not send (a broken connection, a deadline), after which
// the write may have committed. A server's error means that the write's
// implicit transaction rolled back.
//
//go:noinline
func replyLost(err error) bool {
	var pgErr *pgconn.PgError
	return !errors.As(err, &pgErr)
}

// handBack returns RELEASED outcomes, to be recorded by the write at hand,
// for claims this relayer will not dispatch: the rail was never called,
// and they go back to pending due at once, without an attempt or a zombie
// counted. Left in flight, they would wait for their leases and the
// reaper. A cold path, kept out of the frames of record and flushChunk,
// on every write's goroutine.
//
//go:noinline
func (rc *recorder) handBack(claimed []store.Claimed, why string) []pendingOutcome {
	r := rc.r
	orphans := make([]pendingOutcome, len(claimed))
	for i, c := range claimed {
		r.log.Warn("handing back a hand-off unsent", "outbox_id", c.OutboxID, "instruction_id", c.InstructionID,
			"participant", c.ParticipantID, "attempt_no", c.AttemptNo, "why", why)
		orphans[i] = pendingOutcome{Outcome: r.outcome(c, released(why), 0), enqueuedAt: c.EnqueuedAt}
	}
	return orphans
}

// lostHandoffs finds what the hand-off of a write whose reply was lost
// claimed for this relayer (store.LostHandoffs; o is an outcome of that
// write, recorded again since without a hand-off) and returns their
// RELEASED outcomes (handBack). If the database cannot be asked before
// Stop abandons recording, they stay in flight for the reaper, as before.
//
//go:noinline
func (rc *recorder) lostHandoffs(w *retry.Loop, o *store.Outcome) []pendingOutcome {
	r := rc.r
	for {
		ctx, cancel := context.WithTimeout(rc.ctx, r.roundTripDeadline())
		claimed, err := r.store.LostHandoffs(ctx, r.pool, r.cfg.RelayerID, o.AttemptID, o.ClaimedAt)
		cancel()
		if err == nil {
			w.Succeeded()
			return rc.handBack(claimed, "released without calling the rail: handed off by an outcome write whose commit reply was lost")
		}
		if rc.ctx.Err() != nil {
			r.log.Error("could not look for the hand-offs of a write whose reply was lost; any stay in flight for the reaper", "err", err)
			return nil
		}
		select {
		case <-time.After(w.Failed(err)):
		case <-rc.ctx.Done():
		}
	}
}

// record writes one batch of outcomes. Unless the relayer is stopping (or
// handoff is false), the slots of its terminal outcomes may carry new
// work, which the same transaction claims (hand-off: their participants'
// next instructions first, then, while draining a backlog, any due ones;
// rails with a closed breaker only) and which record starts dispatching at
// once. It returns how many were handed off and dispatched, and for the
// hand-offs of a write that ended after Stop began, their RELEASED
// outcomes (orphans), which the caller records: dispatched, they would
// only be handed back, by an outcome that may come after recording
// stopped (the write waited for a lock past Stop's deadline) and so be
// left for the reaper.
func (rc *recorder) record(ctx context.Context, outcomes []store.Outcome, terminal int, handoff bool) (recorded []store.Recorded, dispatched int, orphans []pendingOutcome, err error) {
	r := rc.r
	h := store.HandoffParams{RelayerID: r.cfg.RelayerID}
	// Stop closes stopping under handoffMu's write lock: a write that may
	// hand off counts as a dispatch in progress from here until its
	// hand-offs are dispatching, so Stop's wait for dispatches covers them
	// (or no hand-off happens). The lock is not held across the write:
	// Stop must not wait for a write held up by a participant's lock
	// before it stops claiming, nor beyond its deadline.
	r.handoffMu.RLock()
	if handoff && !r.isStopping() && !r.isolating.Load() {
		closed, _ := r.claimable()
		h.Limit, h.Leases, h.Refill = terminal, r.leases(closed), r.backlog.Load()
		r.dispatches.Add(1)
		defer r.dispatches.Done()
	}
	r.handoffMu.RUnlock()
	claimStart := time.Now()
	recorded, handed, err := r.store.Record(ctx, r.pool, outcomes, h)
	if recorded == nil {
		return nil, 0, nil, err
	}
	took := time.Since(claimStart)
	r.stats.outcomeWrites.Add(1)
	r.stats.outcomeWriteTime.Add(int64(took))
	if h.Refill && len(handed) < h.Limit {
		r.backlog.Store(false) // the due queue ran dry
	}
	rc.handoffMu.Lock()
	write := rc.handoffs.wrote(took, len(handed))
	rc.handoffMu.Unlock()
	if len(handed) > 0 {
		r.stats.handoffs.Add(int64(len(handed)))
		if r.isStopping() {
			return recorded, 0, rc.handBack(handed, "released without calling the rail: handed off by an outcome write that ended after its relayer began to stop"), err
		}
		r.startDispatches(handed, claimStart, write)
	}
	return recorded, len(handed), nil, err
}

// unrecordable handles a batch the database refused for its content.
func (rc *recorder) unrecordable(w *retry.Loop, batch []pendingOutcome, scrubbed bool, keep int, code string, err error) {
	r := rc.r
	if len(batch) > 1 {
		half := len(batch) / 2
		rc.flushChunk(w, batch[:half], scrubbed, min(keep, half))
		rc.flushChunk(w, batch[half:], scrubbed, keep-min(keep, half))
		return
	}
	o := batch[0]
	if !scrubbed {
		r.log.Error("outcome refused by the database; recording it without the rail's text", "outbox_id", o.OutboxID,
			"attempt_no", o.AttemptNo, "sqlstate", code, "err", err)
		o.RailReference, o.RailCode = "", ""
		o.ErrorMessage = fmt.Sprintf("the rail's reference, code and message could not be stored (SQLSTATE %s) and were removed", code)
		rc.flushChunk(w, []pendingOutcome{o}, true, keep)
		return
	}
	r.slots.Release(int64(1 - keep))
	r.stats.leftInFlight.Add(1)
	r.log.Error("outcome cannot be recorded; left in flight for the reaper", "outbox_id", o.OutboxID,
		"instruction_id", o.InstructionID, "attempt_no", o.AttemptNo, "state", o.State, "sqlstate", code, "err", err)
}

// unrecordableAfterLostReply is unrecordable for a resend after a lost
// reply: the lost write may have committed (the database state changed
// since, and now refuses the resend), so its hand-offs are looked for
// first, while this batch's writes have handed off nothing (the look takes
// what that one transaction claimed: store.LostHandoffs), then the batch
// is split, keeping the slots those hand-offs took from its terminal
// outcomes, and they are recorded as RELEASED after it. A cold path.
//
//go:noinline
func (rc *recorder) unrecordableAfterLostReply(w *retry.Loop, batch []pendingOutcome, outcomes []store.Outcome,
	scrubbed bool, keep int, code string, err error) {
	orphans := rc.lostHandoffs(w, &outcomes[0])
	rc.unrecordable(w, batch, scrubbed, keep+len(orphans), code, err)
	rc.flush(w, orphans)
}

// sqlstateDataCorrupted is PostgreSQL's data_corrupted.
const sqlstateDataCorrupted = "XX001"

// contentError reports whether err is the database refusing the data
// itself (SQLSTATE class 22, data exception, or 23, integrity constraint
// violation), or finding what an outcome refers to missing (XX001,
// data_corrupted: a late outcome whose claim is not in the archive, see
// migration 024), which no retry of the same statement can fix.
func contentError(err error) (string, bool) {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (strings.HasPrefix(pgErr.Code, "22") || strings.HasPrefix(pgErr.Code, "23") ||
		pgErr.Code == sqlstateDataCorrupted) {
		return pgErr.Code, true
	}
	return "", false
}

// afterFlush reports a committed batch (logs, counters, OnRecorded) and,
// if it gave slots back, wakes the claim loop.
func (rc *recorder) afterFlush(batch []pendingOutcome, recorded []store.Recorded, freed int) {
	r := rc.r
	// Keyed by claim, not outbox id: one batch may hold a reaped attempt
	// and the newer attempt of the same instruction.
	late := make(map[uuid.UUID]store.Recorded)
	for _, rec := range recorded {
		if rec.Late {
			late[rec.ClaimAttemptID] = rec
		}
	}
	var observed []Recorded
	if r.cfg.OnRecorded != nil {
		observed = make([]Recorded, 0, len(batch))
	}
	now := r.dbNow()
	for _, p := range batch {
		o := p.Outcome
		rec, isLate := late[o.ClaimAttemptID]
		obs := Recorded{Outcome: o, EnqueuedAt: p.enqueuedAt, RecordedAt: now, Late: isLate, Absorbed: rec.Absorbed}
		if observed != nil {
			observed = append(observed, obs)
		}
		res := obs.Result()
		r.stats.count(res)
		switch res {
		case ResultLate:
			if obs.Absorbed {
				// Its claim had an outcome already (migration 050): this
				// one was not archived.
				r.stats.absorbed.Add(1)
				r.log.Error("outcome not recorded: its claim has an outcome already", "outbox_id", o.OutboxID,
					"instruction_id", o.InstructionID, "participant", o.ParticipantID, "attempt_no", o.AttemptNo, "state", o.State)
				break
			}
			r.log.Warn("late outcome: lease was reaped", "outbox_id", o.OutboxID, "instruction_id", o.InstructionID,
				"participant", o.ParticipantID, "attempt_no", o.AttemptNo, "state", o.State, "withdrew_requeued_copy", rec.Withdrew)
		case ResultDead:
			r.logFailure(o, "dead letter")
		case ResultRetried:
			r.logRetry(o)
		}
	}
	if observed != nil {
		rc.observeMu.Lock()
		r.cfg.OnRecorded(observed)
		rc.observeMu.Unlock()
	}
	// Slots given back: claim again. A batch whose every slot went to a
	// hand-off freed none, and a claim would find only what NOTIFY and
	// the polls already bring (a busy participant's successor is claimed
	// by the hand-off itself): skipping it spares the database one empty
	// claim per write when a few participants keep the relayer busy.
	if freed == 0 {
		return
	}
	select {
	case r.freed <- struct{}{}:
	default:
	}
}

// retryLogEvery is how long the retries of one rail with one error code
// are summed up in one line (logRetry).
const retryLogEvery = time.Minute

// retryLog counts, per rail and error code, the retried attempts not
// logged at Warn since the last one that was (logRetry). Its keys are
// bounded by the configured rails and their code tables.
type retryLog struct {
	mu sync.Mutex
	by map[retryLogKey]*retryLogWindow
}

type retryLogKey struct{ rail, code string }

// retryLogWindow is one key's window: when its logged line was, and how
// many retries since were not logged at Warn.
type retryLogWindow struct {
	since  time.Time
	hidden int64
}

// take reports whether a retry of key is logged at Warn now, and if so
// how many were not since the last that was.
func (l *retryLog) take(key retryLogKey, now time.Time) (log bool, hidden int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.by == nil {
		l.by = make(map[retryLogKey]*retryLogWindow)
	}
	w := l.by[key]
	if w == nil {
		l.by[key] = &retryLogWindow{since: now}
		return true, 0
	}
	if now.Sub(w.since) < retryLogEvery {
		w.hidden++
		return false, 0
	}
	hidden, w.since, w.hidden = w.hidden, now, 0
	return true, hidden
}

// retryLogSummary is a window's retries not logged at Warn: those of key
// since since.
type retryLogSummary struct {
	key    retryLogKey
	since  time.Time
	hidden int64
}

// ended removes the windows whose minute is over at now (all: every
// window, at Stop), but skip's (the window of the retry being logged,
// whose own line says its count), and returns those of them that hold
// retries not logged. Without it a window's count was said only by the
// next retry of its rail and code: never, when none came.
func (l *retryLog) ended(now time.Time, all bool, skip *retryLogKey) []retryLogSummary {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []retryLogSummary
	for k, w := range l.by {
		if (skip != nil && k == *skip) || (!all && now.Sub(w.since) < retryLogEvery) {
			continue
		}
		delete(l.by, k)
		if w.hidden > 0 {
			out = append(out, retryLogSummary{key: k, since: w.since, hidden: w.hidden})
		}
	}
	return out
}

// logEndedRetries logs, a line per rail and code, the retries not logged
// of the windows ended at now (ended).
func (r *run) logEndedRetries(now time.Time, all bool, skip *retryLogKey) {
	for _, s := range r.retryLog.ended(now, all, skip) {
		r.log.Warn("attempts retried: not logged", "rail", s.key.rail, "error_code", s.key.code,
			"retries_not_logged", s.hidden, "since", s.since)
	}
}

// retryLogNow is the retry log's clock (testHooks.retryLogNow in tests).
func (r *run) retryLogNow() time.Time {
	if h := r.testHooks.retryLogNow; h != nil {
		return h()
	}
	return time.Now()
}

// retryLogTick is how often the relayer looks for retry-log windows that
// have ended: their counts are logged within this of their minute's end.
const retryLogTick = 10 * time.Second

// retryLogTicks logs the counts of ended retry-log windows every
// retryLogTick until Stop begins; retryLogDone is closed when it returns.
func (r *run) retryLogTicks() {
	defer close(r.retryLogDone)
	every := retryLogTick
	if r.testHooks.retryLogTick > 0 {
		every = r.testHooks.retryLogTick
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-r.stopping:
			return
		case <-t.C:
			r.logEndedRetries(r.retryLogNow(), false, nil)
		}
	}
}

// logRetry logs a retried attempt: the first of its rail and error code
// in retryLogEvery at Warn, the others at Debug, the next Warn line
// saying how many there were. A rail refusing every call in a way that
// does not open its breaker (rate limited) is retried at the pace of the
// backoff for every instruction queued: a line each was thousands a
// second for as long as it refused, each attempt being in the archive
// already. Dead letters are logged each (logFailure): each needs an
// operator.
func (r *run) logRetry(o store.Outcome) {
	key, now := retryLogKey{rail: o.RailType, code: o.ErrorCode}, r.retryLogNow()
	// Other rails' and codes' windows that have ended say their counts
	// now, not only on a retry of their own.
	r.logEndedRetries(now, false, &key)
	log, hidden := r.retryLog.take(key, now)
	if !log {
		if r.log.Enabled(context.Background(), slog.LevelDebug) {
			r.log.Debug("attempt failed: will retry", r.failureArgs(o)...)
		}
		return
	}
	args := r.failureArgs(o)
	if hidden > 0 {
		// Of this rail with this code, since its last line.
		args = append(args, "retries_not_logged", hidden)
	}
	r.log.Warn("attempt failed: will retry", args...)
}

func (r *run) logFailure(o store.Outcome, what string) {
	r.log.Warn("attempt failed: "+what, r.failureArgs(o)...)
}

// failureArgs are the log attributes of a failed attempt.
func (r *run) failureArgs(o store.Outcome) []any {
	args := []any{"outbox_id", o.OutboxID, "instruction_id", o.InstructionID, "participant", o.ParticipantID,
		"sequence_id", o.SequenceID, "attempt_no", o.AttemptNo, "rail", o.RailType, "error_code", o.ErrorCode,
		"rail_code", o.RailCode, "error", o.ErrorMessage}
	if o.State == store.Retryable {
		args = append(args, "retry_in", o.RetryDelay)
	}
	if o.TenantID != "" {
		args = append(args, "tenant_id", o.TenantID)
	}
	if o.CorrelationID != "" {
		args = append(args, "correlation_id", o.CorrelationID)
	}
	return args
}
