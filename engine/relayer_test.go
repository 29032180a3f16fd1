package engine

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/attempts"
	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/migrations"
	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/pending"
	"github.com/ledgerline/outbox/rails"
)

func TestMain(m *testing.M) { testdb.Main(m) }

type testBundle struct {
	ctx      context.Context
	pool     *pgxpool.Pool
	producer *pending.Producer
	archive  *attempts.Archive
	sandbox  *rails.Sandbox
	rails    *rails.Set
}

func setup(t *testing.T, sandbox rails.SandboxOptions) *testBundle {
	t.Helper()
	return setupOn(t, testdb.NewWithConfig(t, func(c *pgxpool.Config) { c.MaxConns = 24 }), sandbox)
}

// setupOn is setup on a pool of the test's own (a proxied one, say).
func setupOn(t *testing.T, pool *pgxpool.Pool, sandbox rails.SandboxOptions) *testBundle {
	t.Helper()
	producer, err := pending.NewProducer(pending.Config{})
	if err != nil {
		t.Fatal(err)
	}
	archive, _ := attempts.New("")
	sbx := rails.NewSandbox(sandbox)
	set, err := rails.NewSet(rails.Options{Type: "sandbox", Profile: payment.Generic{}, Transport: sbx,
		Timeout: 2 * time.Second, Breaker: rails.BreakerOptions{Disabled: true}})
	if err != nil {
		t.Fatal(err)
	}
	return &testBundle{ctx: t.Context(), pool: pool, producer: producer, archive: archive, sandbox: sbx, rails: set}
}

// testLogger logs to stderr only when OUTBOX_TEST_LOG is set.
func testLogger() *slog.Logger {
	if os.Getenv("OUTBOX_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// fastConfig retries quickly so tests with injected failures finish soon.
func (b *testBundle) config(id string) Config {
	return Config{
		RelayerID: id, Rails: b.rails, PollInterval: 100 * time.Millisecond,
		BackoffBase: 5 * time.Millisecond, BackoffCap: 50 * time.Millisecond, Logger: testLogger(),
	}
}

func (b *testBundle) start(t *testing.T, cfg Config) *Relayer {
	t.Helper()
	r, err := New(b.pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = r.Stop(ctx)
	})
	return r
}

// unordered switches per-participant ordering off for the bundle's database.
func (b *testBundle) unordered(t *testing.T) {
	t.Helper()
	st, err := store.New("")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.SetOrdered(b.ctx, b.pool, false); err != nil {
		t.Fatal(err)
	}
}

func instruction(participant string, i int) pending.Instruction {
	return pending.Instruction{
		InstructionID: fmt.Sprintf("%s-%d", participant, i), ParticipantID: participant,
		IdempotencyKey: fmt.Sprintf("key-%s-%d", participant, i), RailType: "sandbox",
		AmountMinor: int64(100 + i), Currency: "USD", Destination: "acct-" + participant,
	}
}

// enqueue enqueues count instructions round-robin over participants, in
// batches of up to 1,000 per transaction.
func (b *testBundle) enqueue(t *testing.T, count, participants int) {
	t.Helper()
	var batch []pending.Instruction
	flush := func() {
		if err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
			_, err := b.producer.EnqueueBatch(b.ctx, tx, batch)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		batch = batch[:0]
	}
	for i := range count {
		batch = append(batch, instruction(fmt.Sprintf("p%03d", i%participants), i/participants))
		if len(batch) == 1000 {
			flush()
		}
	}
	if len(batch) > 0 {
		flush()
	}
}

// waitDrained waits until nothing is pending or in flight.
func (b *testBundle) waitDrained(t *testing.T, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var left int
		if err := b.pool.QueryRow(b.ctx, `SELECT (SELECT count(*) FROM outbox.pending) + (SELECT count(*) FROM outbox.inflight)`).Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not drained after %v: %d instructions left", timeout, left)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// statsOnceDispatched returns r's stats once they count n dispatched
// (bounded): a write's commit, which waitDrained sees, comes a moment
// before the relayer counts it.
func statsOnceDispatched(t *testing.T, r *Relayer, n int64) Stats {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		st := r.Stats()
		if st.Dispatched >= n {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v: %d dispatched, want %d", st, st.Dispatched, n)
		}
	}
}

func (b *testBundle) verify(t *testing.T, ordered bool) attempts.Report {
	t.Helper()
	r, err := b.archive.Verify(b.ctx, b.pool, attempts.VerifyOptions{Ordered: ordered})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range r.Violations {
		t.Error(v)
	}
	return r
}

// TestFourRelayersDrainInOrder is the relayer's acceptance test: 4 relayers,
// 20,000 instructions over 200 participants, injected retryable and terminal
// failures. Every instruction ends dispatched or dead, none is dispatched
// twice, each participant's dispatches follow its sequence, and the
// invariants hold (checked by query).
func TestFourRelayersDrainInOrder(t *testing.T) {
	t.Parallel()
	const total, participants = 20_000, 200
	b := setup(t, rails.SandboxOptions{Seed: 42, RetryableRate: 0.03, TerminalRate: 0.01})
	b.enqueue(t, total, participants)
	relayers := make([]*Relayer, 4)
	for i := range relayers {
		relayers[i] = b.start(t, b.config(fmt.Sprintf("relayer-%d", i)))
	}
	b.waitDrained(t, 10*time.Minute)

	rep := b.verify(t, true)
	if rep.Instructions != total || rep.Dispatched+rep.DeadLetters != total {
		t.Fatalf("report %+v: want %d instructions all dispatched or dead", rep, total)
	}
	if rep.DispatchedTwice != 0 {
		t.Fatalf("%d instructions dispatched twice", rep.DispatchedTwice)
	}
	if rep.DeadLetters == 0 || rep.Attempts <= 2*total {
		t.Fatalf("report %+v: the injected failures did not happen (test would prove nothing)", rep)
	}
	// Dispatch order per participant equals sequence order (beyond the
	// invariant check, directly on the DISPATCHED and FAILED rows).
	var outOfOrder int
	if err := b.pool.QueryRow(b.ctx, `
		SELECT count(*) FROM (
		  SELECT participant_id, sequence_id,
		         lag(sequence_id) OVER (PARTITION BY participant_id ORDER BY created_at, attempt_id) AS prev
		  FROM outbox.attempts WHERE state IN ('DISPATCHED', 'FAILED')) x
		WHERE sequence_id <> prev + 1`).Scan(&outOfOrder); err != nil {
		t.Fatal(err)
	}
	if outOfOrder != 0 {
		t.Fatalf("%d terminal outcomes out of sequence order", outOfOrder)
	}
	st := b.sandbox.Stats()
	if st.EffectiveDuplicates != 0 || st.Payments != rep.Dispatched {
		t.Fatalf("sandbox %+v, dispatched %d: want one payment per dispatched instruction", st, rep.Dispatched)
	}
	var claimed int64
	for _, r := range relayers {
		s := r.Stats()
		claimed += s.Claimed
		if s.Claimed == 0 {
			t.Errorf("relayer %s claimed nothing", r.ID())
		}
	}
	if claimed != rep.Attempts-countStates(t, b, "DISPATCHED", "RETRYABLE", "FAILED") {
		t.Errorf("relayers claimed %d, archive has a different number of DISPATCHING rows", claimed)
	}
}

func countStates(t *testing.T, b *testBundle, states ...string) int64 {
	t.Helper()
	var n int64
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox.attempts WHERE state = ANY($1)`, states).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestUnorderedDrain(t *testing.T) {
	t.Parallel()
	b := setup(t, rails.SandboxOptions{Seed: 7, RetryableRate: 0.05})
	b.unordered(t)
	b.enqueue(t, 2000, 3)
	cfg := b.config("unordered")
	b.start(t, cfg)
	b.waitDrained(t, 5*time.Minute)
	rep := b.verify(t, false)
	if rep.Dispatched != 2000 || rep.DispatchedTwice != 0 {
		t.Fatalf("report %+v", rep)
	}
}

// waitRegisteredIdle waits until the relayer has registered itself idle.
func (b *testBundle) waitRegisteredIdle(t *testing.T, id string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		var n int
		if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox.relayer_idle WHERE relayer_id = $1`, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("relayer never registered as idle")
}

func (b *testBundle) waitDispatched(t *testing.T, n int64, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if countStates(t, b, "DISPATCHED") >= n {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("fewer than %d dispatched after %v", n, within)
}

// TestNotifyWakesIdleRelayer: with a 10 s poll, a new instruction is
// dispatched by the NOTIFY path, not the poll.
func TestNotifyWakesIdleRelayer(t *testing.T) {
	t.Parallel()
	b := setup(t, rails.SandboxOptions{})
	cfg := b.config("listener")
	cfg.PollInterval = 10 * time.Second
	r := b.start(t, cfg)
	b.waitRegisteredIdle(t, "listener")

	if _, err := b.producer.Enqueue(b.ctx, b.pool, instruction("p1", 1)); err != nil {
		t.Fatal(err)
	}
	b.waitDispatched(t, 1, 8*time.Second)
	// A hot poll (a transaction that was running at registration, such as
	// another test's, still runs) may claim it first; the notification
	// must still arrive, and the 10 s poll must not have run.
	deadline := time.Now().Add(5 * time.Second)
	st := r.Stats()
	for st.Notifications == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
		st = r.Stats()
	}
	if st.Notifications == 0 || st.Polls != 0 {
		t.Fatalf("stats %+v: want a notification, before any poll", st)
	}
}

// TestIdleRegistrationLosesNoWakeup enqueues while the only relayer is
// registering itself idle: the producer's trigger runs before the
// registration is visible (so it does not notify) and commits only after
// the relayer's follow-up claim came back empty. The relayer must still
// dispatch it without waiting for its 10 s poll, even though an unrelated
// transaction, running since before the registration, stays open
// throughout (the relayer cannot tell it from a producer).
func TestIdleRegistrationLosesNoWakeup(t *testing.T) {
	t.Parallel()
	b := setup(t, rails.SandboxOptions{})
	cfg := b.config("racer")
	cfg.PollInterval = 10 * time.Second
	r, err := New(b.pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	unrelated, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unrelated.Rollback(context.Background()) })
	if _, err := unrelated.Exec(b.ctx, "SELECT pg_current_xact_id()"); err != nil { // a writer: it has a transaction id
		t.Fatal(err)
	}
	var (
		once     sync.Once
		producer pgx.Tx
		hookErr  = make(chan error, 2)
	)
	r.testHooks.beforeRegister = func() {
		once.Do(func() {
			tx, err := b.pool.Begin(b.ctx)
			if err == nil {
				_, err = b.producer.Enqueue(b.ctx, tx, instruction("p1", 1))
			}
			producer = tx
			hookErr <- err
		})
	}
	r.testHooks.afterIdleClaim = func() {
		if producer != nil {
			hookErr <- producer.Commit(b.ctx)
			producer = nil
		}
	}
	if err := r.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Stop(context.Background()) })
	for range 2 {
		if err := <-hookErr; err != nil {
			t.Fatal(err)
		}
	}
	b.waitDispatched(t, 1, 8*time.Second)
	if st := r.Stats(); st.Polls != 0 || st.Notifications != 0 {
		t.Fatalf("stats %+v: the instruction must be found by the idle protocol itself (no poll, and the producer could not notify)", st)
	}
}

func TestPollOnlyAndTriggerOffStillDrain(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"poll-only", "trigger-off"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			b := setup(t, rails.SandboxOptions{})
			cfg := b.config(mode)
			cfg.PollInterval = 250 * time.Millisecond
			if mode == "poll-only" {
				cfg.PollOnly = true
			} else if err := migrations.SetNotify(b.ctx, b.pool, "", false); err != nil {
				t.Fatal(err)
			}
			r := b.start(t, cfg)
			// Let it go idle first, so the work below can only be found by
			// polling.
			for r.Stats().Polls == 0 {
				time.Sleep(10 * time.Millisecond)
			}
			b.enqueue(t, 500, 10)
			b.waitDrained(t, time.Minute)
			if rep := b.verify(t, true); rep.Dispatched != 500 {
				t.Fatalf("report %+v", rep)
			}
			if st := r.Stats(); st.Notifications != 0 {
				t.Fatalf("stats %+v: nothing may arrive by NOTIFY", st)
			}
		})
	}
}

// TestRetriesBackOffThenDeadLetter: a rail that always fails: each retry
// waits within the growing, capped bound (full jitter: some wait, none
// longer than its bound), the next attempt is not claimed before its
// retry's time, and the last allowed attempt ends FAILED with
// MAX_ATTEMPTS_EXCEEDED and a dead letter.
func TestRetriesBackOffThenDeadLetter(t *testing.T) {
	t.Parallel()
	b := setup(t, rails.SandboxOptions{RetryableRate: 1})
	cfg := b.config("retrier")
	cfg.BackoffBase, cfg.BackoffCap, cfg.MaxAttempts = 20*time.Millisecond, 80*time.Millisecond, 5
	b.start(t, cfg)
	if _, err := b.producer.Enqueue(b.ctx, b.pool, instruction("p1", 1)); err != nil {
		t.Fatal(err)
	}
	b.waitDrained(t, time.Minute)
	b.verify(t, true)

	rows, err := b.pool.Query(b.ctx, `SELECT r.attempt_no, extract(epoch FROM r.next_attempt_at - r.completed_at),
		extract(epoch FROM (SELECT d.created_at FROM outbox.attempts d WHERE d.state = 'DISPATCHING' AND d.attempt_no = r.attempt_no + 1)
		                   - r.next_attempt_at)
		FROM outbox.attempts r WHERE r.state = 'RETRYABLE' ORDER BY r.attempt_no`)
	if err != nil {
		t.Fatal(err)
	}
	type retry struct {
		No    int
		Delay float64
		// Early is how long after the retry's time the next claim came
		// (negative: before it).
		Early float64
	}
	retries, err := pgx.CollectRows(rows, pgx.RowToStructByPos[retry])
	if err != nil {
		t.Fatal(err)
	}
	if len(retries) != 4 {
		t.Fatalf("%d retries, want 4 before the 5th attempt fails", len(retries))
	}
	bo := Backoff{Base: cfg.BackoffBase, Cap: cfg.BackoffCap}
	longest := 0.0
	for i, r := range retries {
		if r.No != i+1 || r.Delay < 0 || r.Delay > bo.Bound(r.No).Seconds()+0.001 {
			t.Errorf("retry %d: attempt %d waited %.3fs, bound %v", i, r.No, r.Delay, bo.Bound(r.No))
		}
		if r.Early < 0 {
			t.Errorf("attempt %d was claimed %.3fs before its retry's time", r.No+1, -r.Early)
		}
		longest = max(longest, r.Delay)
	}
	// Each delay is uniform in [0, bound] (bounds 20, 40, 80, 80 ms): all
	// four under a millisecond has a chance of about 1 in 10 million. A
	// retry policy that does not back off at all stores 0 for each.
	if longest < 0.001 {
		t.Errorf("retries %+v: none waited a millisecond, want backoff", retries)
	}
	var code string
	var count int
	if err := b.pool.QueryRow(b.ctx, `SELECT error_code, attempt_count FROM outbox.dead_letters`).Scan(&code, &count); err != nil {
		t.Fatal(err)
	}
	if code != string(rails.CodeMaxAttemptsExceeded) || count != 5 {
		t.Fatalf("dead letter %s after %d attempts, want MAX_ATTEMPTS_EXCEEDED after 5", code, count)
	}
}

// TestGracefulStopUnderLoad stops a busy relayer whose rail hangs on some
// calls: everything answered is recorded, nothing is lost, and the only
// in-flight rows left are the calls cut off at the deadline.
func TestGracefulStopUnderLoad(t *testing.T) {
	t.Parallel()
	b := setup(t, rails.SandboxOptions{Seed: 3, LatencyMin: time.Millisecond, LatencyMax: 5 * time.Millisecond, HangRate: 0.02})
	b.unordered(t)
	b.enqueue(t, 3000, 300)
	cfg := b.config("stopper")
	r, err := New(b.pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	b.waitDispatched(t, 500, time.Minute)
	ctx, cancel := context.WithTimeout(b.ctx, 300*time.Millisecond)
	defer cancel()
	_ = r.Stop(ctx)

	rep := b.verify(t, false)
	st := r.Stats()
	if rep.InFlight != st.LeftInFlight {
		t.Fatalf("%d rows in flight after stop, relayer cut off %d", rep.InFlight, st.LeftInFlight)
	}
	if hangs := b.sandbox.Stats().Hangs; rep.InFlight > hangs {
		t.Fatalf("%d rows in flight but only %d calls hung", rep.InFlight, hangs)
	}
	if rep.Pending+rep.InFlight+rep.Dispatched+rep.DeadLetters != 3000 {
		t.Fatalf("report %+v: instructions lost", rep)
	}
	if rep.Dispatched != st.Dispatched {
		t.Fatalf("archive has %d dispatched, relayer recorded %d", rep.Dispatched, st.Dispatched)
	}
}
