package engine

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/rails"
)

// TestStopCutOffIsNotAZombie: a rail slower than the stop deadline, and
// four rolling restarts in a row, each stopping the relayer while the
// call is in progress. Before, each stop left the claim in flight, the
// reaper requeued it as a zombie, and the fourth stop made it a
// ZOMBIE_LIMIT dead letter although no relayer died. Now the stopping
// relayer records each cut-off call itself: a RETRYABLE attempt with
// error code CUT_OFF_AT_STOP that uses up neither the retry budget nor
// the zombie limit, and that is claimed again only after the cut-off
// claim's lease (the rail may still be acting on it).
func TestStopCutOffIsNotAZombie(t *testing.T) {
	t.Parallel()
	b := setup(t, rails.SandboxOptions{})
	called := make(chan struct{}, 8)
	answer := make(chan struct{})
	b.useTransport(t, funcTransport(func(ctx context.Context, ins payment.Instruction) (rails.Result, error) {
		called <- struct{}{}
		select {
		case <-answer:
			return rails.Result{Code: rails.SandboxAccepted, Reference: "ref-" + ins.IdempotencyKey}, nil
		case <-ctx.Done():
			return rails.Result{}, ctx.Err()
		}
	}), time.Second)
	b.enqueue(t, 1, 1)

	const rounds = 4              // the reaper's zombie limit (3) plus one
	const lease = 2 * time.Second // the rail's timeout and the grace (MinLeaseGrace)
	for round := range rounds {
		cfg := b.config("deploy")
		cfg.LeaseGrace = lease - time.Second
		r := b.newRelayer(t, cfg)
		if err := r.Start(b.ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case <-called:
		case <-time.After(30 * time.Second):
			t.Fatalf("round %d: the rail was never called", round)
		}
		ctx, cancel := context.WithTimeout(b.ctx, 50*time.Millisecond)
		err := r.Stop(ctx)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("round %d: Stop: %v, want the deadline exceeded", round, err)
		}
		// Back in pending, with the reaper's help if needed (zombie limit 3).
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if _, err := r.store.Reap(b.ctx, b.pool, 100, "test-reaper", 3); err != nil {
				t.Fatal(err)
			}
			var pendingRows, dead int
			if err := b.pool.QueryRow(b.ctx, `SELECT (SELECT count(*) FROM outbox.pending), (SELECT count(*) FROM outbox.dead_letters)`).Scan(&pendingRows, &dead); err != nil {
				t.Fatal(err)
			}
			if dead > 0 {
				t.Fatalf("round %d: the instruction became a dead letter after graceful stops", round)
			}
			if pendingRows == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the instruction did not go back to pending", round)
			}
		}
	}

	var zombies, cutOffs, zombieCount, attemptNo int
	if err := b.pool.QueryRow(b.ctx, `
		SELECT (SELECT count(*) FROM outbox.attempts WHERE state = 'ZOMBIE_REQUEUE'),
		       (SELECT count(*) FROM outbox.attempts WHERE state = 'RETRYABLE' AND error_code = 'CUT_OFF_AT_STOP'),
		       (SELECT zombie_count FROM outbox.pending), (SELECT attempt_count FROM outbox.pending)`).Scan(
		&zombies, &cutOffs, &zombieCount, &attemptNo); err != nil {
		t.Fatal(err)
	}
	if zombies != 0 || cutOffs != rounds || zombieCount != 0 || attemptNo != 0 {
		t.Fatalf("%d ZOMBIE_REQUEUE and %d CUT_OFF_AT_STOP rows, zombie count %d, attempt count %d: want 0, %d, 0, 0",
			zombies, cutOffs, zombieCount, attemptNo, rounds)
	}
	// No claim began before the lease of the claim cut off before it ended
	// (the database's clock on both sides).
	var early int
	if err := b.pool.QueryRow(b.ctx, `
		SELECT count(*) FROM (
		  SELECT claimed_at - lag(claimed_at) OVER (ORDER BY claimed_at) AS gap
		  FROM outbox.attempts WHERE state = 'DISPATCHING') g
		WHERE gap < $1::bigint * interval '1 millisecond'`, lease.Milliseconds()).Scan(&early); err != nil {
		t.Fatal(err)
	}
	if early != 0 {
		t.Fatalf("%d claims began before the lease of the claim cut off before them ended", early)
	}

	// The rail answers now: the instruction is paid once, and the trail
	// verifies.
	close(answer)
	r := b.start(t, b.config("after-deploy"))
	b.waitDrained(t, 30*time.Second)
	statsOnceDispatched(t, r, 1)
	if rep := b.verify(t, true); rep.Dispatched != 1 || rep.DeadLetters != 0 {
		t.Fatalf("report %+v, want one dispatched", rep)
	}
}

// TestHandoffOfAWriteHeldAcrossStopIsHandedBack: an outcome write that
// began before Stop, and may hand off, waits for a participant's lock (a
// producer's open transaction) past Stop's deadline, and commits once
// recording has begun to stop, its hand-off having claimed the
// participant's next instruction. Before, that claim was dispatched,
// handed back unsent (the relayer is stopping), and its RELEASED outcome
// refused (recording had stopped): it sat in flight until its lease ended
// and the reaper counted it a zombie. Now the write records the release
// itself.
func TestHandoffOfAWriteHeldAcrossStopIsHandedBack(t *testing.T) {
	t.Parallel()
	b := setup(t, rails.SandboxOptions{})
	for i := range 2 {
		if _, err := b.producer.Enqueue(b.ctx, b.pool, instruction("held", i)); err != nil {
			t.Fatal(err)
		}
	}
	lock := b.lockParticipant(t, "held")
	r := b.newRelayer(t, b.config("held-handoff"))
	r.testHooks.abandonWait = 50 * time.Millisecond
	if err := r.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the held participant's outcome write to wait for its lock", func() bool {
		var waiting bool
		err := b.pool.QueryRow(b.ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock')`).Scan(&waiting)
		return err == nil && waiting && b.sandbox.Stats().Payments == 1
	})

	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		stopped <- r.Stop(ctx)
	}()
	rec := r.current.Load().rec
	waitFor(t, 10*time.Second, "recording to stop", func() bool {
		select {
		case <-rec.quit:
			return true
		default:
			return false
		}
	})
	if err := lock.Rollback(b.ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-stopped:
		t.Logf("Stop: %v", err)
	case <-time.After(StopRecordTimeout + 15*time.Second):
		t.Fatal("Stop did not return")
	}

	var inFlight, released int
	if err := b.pool.QueryRow(b.ctx, `SELECT (SELECT count(*) FROM outbox.inflight),
		(SELECT count(*) FROM outbox.attempts WHERE error_code = 'RELEASED' AND instruction_id = 'held-1')`).Scan(&inFlight, &released); err != nil {
		t.Fatal(err)
	}
	if st := r.Stats(); inFlight != 0 || released != 1 || st.Dispatched != 1 || st.LeftInFlight != 0 {
		t.Fatalf("%d in flight, %d RELEASED, stats %+v: want the hand-off handed back, nothing left for the reaper", inFlight, released, st)
	}
	b.verify(t, true)
}

// TestOutcomeQueuedAfterTheFinalFlushIsAccounted: a dispatch that ignored
// the hard deadline (a transport deaf to cancellation) and passed the
// recorder's check while recording still ran may queue its outcome after
// the final flush (submit's check and send are two steps; a stress run of
// submitters against finish caught it about once in 30,000 stops). That
// outcome was neither recorded nor counted: LeftInFlight and the logs
// said nothing of an instruction left for the reaper. The test queues
// such an outcome itself, as the racing dispatch would, while a straggler
// still runs; once the stragglers have returned, it is accounted for.
func TestOutcomeQueuedAfterTheFinalFlushIsAccounted(t *testing.T) {
	t.Parallel()
	b := setup(t, rails.SandboxOptions{})
	r, release := b.startInDeafCall(t, "deaf-rail-race")
	ctx, cancel := context.WithTimeout(b.ctx, 100*time.Millisecond)
	defer cancel()
	if err := r.Stop(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop: %v, want the deadline exceeded", err)
	}
	ru := r.current.Load()
	if !ru.slots.TryAcquire(1) {
		t.Fatal("no slot free")
	}
	ru.rec.outcomes <- pendingOutcome{Outcome: store.Outcome{State: store.Dispatched}} // the racing dispatch's
	close(release)
	waitFor(t, 10*time.Second, "both outcomes to be counted left in flight", func() bool {
		return r.Stats().LeftInFlight == 2 && len(ru.rec.outcomes) == 0
	})
}

// headersSeen is a RoundTripper that says when an answer's status and
// headers have reached the client (the rail has answered), before its body
// is read.
type headersSeen struct {
	next http.RoundTripper
	seen chan struct{}
}

func (h headersSeen) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := h.next.RoundTrip(req)
	if err == nil {
		select {
		case h.seen <- struct{}{}:
		default: // never block a dispatch on the test
		}
	}
	return resp, err
}

// TestStopAfterTheRailAnsweredKeepsTheAnswer: the webhook rail answers
// 503 (a refusal before any processing), its body is slow, and the
// relayer's stop deadline passes while the body is read. The rail did
// answer, so its answer is recorded: RAIL_UNAVAILABLE with the rail's
// code, an attempt of the budget. Before, every retryable decision of a
// call under way at the deadline was made a CUT_OFF_AT_STOP (outcome
// unknown, "not retried before its lease ends"), so an answer that says
// the rail did not act was archived as one that may have paid, without
// the rail's code, and an operator's cancel was refused until the lease
// ended.
func TestStopAfterTheRailAnsweredKeepsTheAnswer(t *testing.T) {
	t.Parallel()
	b := setup(t, rails.SandboxOptions{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusServiceUnavailable)
		w.(http.Flusher).Flush()
		<-r.Context().Done() // the body never comes
	}))
	t.Cleanup(srv.Close)
	seen := make(chan struct{}, 1)
	hook, err := rails.NewWebhook(rails.WebhookOptions{URL: srv.URL, Secret: []byte("0123456789abcdef0123456789abcdef"),
		Client: &http.Client{Transport: headersSeen{next: http.DefaultTransport, seen: seen}}})
	if err != nil {
		t.Fatal(err)
	}
	set, err := rails.NewSet(rails.Options{Type: "sandbox", Profile: payment.Generic{}, Transport: hook,
		Timeout: 5 * time.Second, Breaker: rails.BreakerOptions{Disabled: true}})
	if err != nil {
		t.Fatal(err)
	}
	b.rails = set
	b.enqueue(t, 1, 1)
	r := b.newRelayer(t, b.config("answered"))
	if err := r.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-seen:
	case <-time.After(30 * time.Second):
		t.Fatal("the rail never answered")
	}
	ctx, cancel := context.WithTimeout(b.ctx, 50*time.Millisecond)
	err = r.Stop(ctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop: %v, want the deadline exceeded", err)
	}
	var state, errorCode, railCode string
	var attemptCount int
	if err := b.pool.QueryRow(b.ctx, `
		SELECT state, coalesce(error_code, ''), coalesce(rail_code, ''), (SELECT attempt_count FROM outbox.pending)
		FROM outbox.attempts WHERE state <> 'DISPATCHING'`).Scan(&state, &errorCode, &railCode, &attemptCount); err != nil {
		t.Fatal(err)
	}
	if state != "RETRYABLE" || errorCode != string(rails.CodeRailUnavailable) || railCode != "HTTP_503" || attemptCount != 1 {
		t.Fatalf("recorded %s %s rail code %q, attempt count %d: want RETRYABLE %s HTTP_503, 1",
			state, errorCode, railCode, attemptCount, rails.CodeRailUnavailable)
	}
}

// TestStopWhileConnectingReleases: the stop's deadline passes while a Go
// transport is still connecting to its rail, on the instruction's last
// allowed attempt; the transport says nothing was sent (it wraps
// rails.ErrUnavailable, as [rails.Transport] asks). The instruction is
// handed back (RELEASED: no attempt counted) and stays pending. Before,
// the answer was classified RAIL_UNAVAILABLE, an attempt of the budget,
// and the graceful stop made a MAX_ATTEMPTS_EXCEEDED dead letter of an
// instruction never sent.
func TestStopWhileConnectingReleases(t *testing.T) {
	t.Parallel()
	b := setup(t, rails.SandboxOptions{})
	connecting := make(chan struct{}, 1)
	b.useTransport(t, funcTransport(func(ctx context.Context, _ payment.Instruction) (rails.Result, error) {
		connecting <- struct{}{}
		<-ctx.Done() // a host that does not answer the connection
		return rails.Result{}, fmt.Errorf("connecting to the rail: %w (%w)", rails.ErrUnavailable, ctx.Err())
	}), 5*time.Second)
	b.enqueue(t, 1, 1)
	cfg := b.config("connecting")
	cfg.MaxAttempts = 1 // an attempt counted would be the last
	r := b.newRelayer(t, cfg)
	if err := r.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-connecting:
	case <-time.After(30 * time.Second):
		t.Fatal("the rail was never called")
	}
	ctx, cancel := context.WithTimeout(b.ctx, 50*time.Millisecond)
	err := r.Stop(ctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop: %v, want the deadline exceeded", err)
	}
	var state, errorCode string
	var pendingRows, dead int
	if err := b.pool.QueryRow(b.ctx, `
		SELECT state, coalesce(error_code, ''), (SELECT count(*) FROM outbox.pending), (SELECT count(*) FROM outbox.dead_letters)
		FROM outbox.attempts WHERE state <> 'DISPATCHING'`).Scan(&state, &errorCode, &pendingRows, &dead); err != nil {
		t.Fatal(err)
	}
	if state != "RETRYABLE" || errorCode != string(rails.CodeReleased) || pendingRows != 1 || dead != 0 {
		t.Fatalf("recorded %s %s, %d pending, %d dead letters: want RETRYABLE %s, 1 pending, none dead",
			state, errorCode, pendingRows, dead, rails.CodeReleased)
	}
}

// TestDispatchAfterStopBeganCallsNoRail: a dispatch that starts once Stop
// has begun (its claim made just before) hands the instruction back
// (released) without calling the rail. Without that check (send's
// isStopping) the rail was called after the stop began.
func TestDispatchAfterStopBeganCallsNoRail(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	tr := funcTransport(func(_ context.Context, ins payment.Instruction) (rails.Result, error) {
		calls.Add(1)
		return rails.Result{Code: rails.SandboxAccepted, Reference: "ref-" + ins.IdempotencyKey}, nil
	})
	set, err := rails.NewSet(rails.Options{Type: "sandbox", Profile: payment.Generic{}, Transport: tr, Codes: rails.SandboxCodes,
		Breaker: rails.BreakerOptions{Disabled: true}})
	if err != nil {
		t.Fatal(err)
	}
	rel, err := New(nil, Config{Rails: set, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	rn := &run{Relayer: rel, stopping: make(chan struct{}), dispatchCtx: t.Context(), slotWait: t.Context()}
	close(rn.stopping)
	c := store.Claimed{Identity: store.Identity{InstructionID: "i-1", ParticipantID: "p1", SequenceID: 1, IdempotencyKey: "k-1", RailType: "sandbox"},
		AttemptNo: 1, Payload: []byte(`{"amount_minor": 100, "currency": "USD", "destination": "acct-1"}`)}
	var d rails.Decision
	rn.send(&c, &d, time.Now().Add(time.Minute))
	if d.ErrorCode != rails.CodeReleased || calls.Load() != 0 {
		t.Fatalf("decision %s %s after %d rail calls, want released without a call", d.Outcome, d.ErrorCode, calls.Load())
	}
}
