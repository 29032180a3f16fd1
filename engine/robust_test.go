package engine

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"

	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/rails"
)

// funcTransport is a Go transport made of a function, the way an
// embedding program registers its own.
type funcTransport func(ctx context.Context, ins payment.Instruction) (rails.Result, error)

func (f funcTransport) Send(ctx context.Context, ins payment.Instruction) (rails.Result, error) {
	return f(ctx, ins)
}

// useTransport replaces the bundle's rails with one sandbox-typed rail
// over tr (sandbox codes, no breaker).
func (b *testBundle) useTransport(t *testing.T, tr rails.Transport, timeout time.Duration) {
	t.Helper()
	set, err := rails.NewSet(rails.Options{Type: "sandbox", Profile: payment.Generic{}, Transport: tr, Codes: rails.SandboxCodes,
		Timeout: timeout, Breaker: rails.BreakerOptions{Disabled: true}})
	if err != nil {
		t.Fatal(err)
	}
	b.rails = set
}

// newRelayer creates a relayer that is not started yet (so a test can set
// hooks) and stops it at cleanup.
func (b *testBundle) newRelayer(t *testing.T, cfg Config) *Relayer {
	t.Helper()
	r, err := New(b.pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = r.Stop(ctx)
	})
	return r
}

func (b *testBundle) waitInFlight(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var got int
		if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox.inflight`).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d in flight, want %d", got, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestUnstorableOutcomeDoesNotWedge: the database refuses two outcomes of
// a batch for their content (a NUL byte in text). The batch is split, the
// other outcomes are recorded, the two are recorded without the rail's
// text, and the relayer keeps going; before, the whole batch was retried
// forever and the relayer stopped recording anything.
func TestUnstorableOutcomeDoesNotWedge(t *testing.T) {
	t.Parallel()
	b := setup(t, rails.SandboxOptions{})
	const total = 40
	b.enqueue(t, total, total)
	poisoned := map[string]bool{"p003-0": true, "p011-0": true}
	r := b.newRelayer(t, b.config("poison"))
	r.testHooks.outcome = func(o *store.Outcome) {
		if poisoned[o.InstructionID] {
			o.RailReference = "ref\x00with-nul"
		}
	}
	if err := r.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	b.waitDrained(t, time.Minute)

	rep := b.verify(t, true)
	if rep.Dispatched != total || rep.DispatchedTwice != 0 {
		t.Fatalf("report %+v, want %d dispatched once", rep, total)
	}
	rows, err := b.pool.Query(b.ctx, `SELECT instruction_id, coalesce(rail_reference, ''), coalesce(error_message, '')
		FROM outbox.attempts WHERE state = 'DISPATCHED'`)
	if err != nil {
		t.Fatal(err)
	}
	var (
		scrubbed     int
		id, ref, msg string
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &ref, &msg}, func() error {
		switch {
		case poisoned[id] && ref == "" && strings.Contains(msg, "could not be stored"):
			scrubbed++
		case poisoned[id]:
			t.Errorf("%s recorded with reference %q, message %q; want the rail's text removed and said so", id, ref, msg)
		case ref == "":
			t.Errorf("%s lost its rail reference", id)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if scrubbed != len(poisoned) {
		t.Errorf("%d scrubbed outcomes, want %d", scrubbed, len(poisoned))
	}
	if st := r.Stats(); st.Dispatched != total || st.LeftInFlight != 0 {
		t.Errorf("stats %+v", st)
	}
}

// TestOutcomeOfAMissingClaimDoesNotWedge: an outcome that names a claim
// the archive does not have (archive rows removed; here a relayer's bug)
// fails its write as data_corrupted. The batch is split, the other
// outcomes are recorded, that one is left in flight for the reaper, and
// the relayer keeps going instead of retrying the write forever.
func TestOutcomeOfAMissingClaimDoesNotWedge(t *testing.T) {
	t.Parallel()
	b := setup(t, rails.SandboxOptions{})
	const total = 40
	b.enqueue(t, total, total)
	r := b.newRelayer(t, b.config("missing-claim"))
	r.testHooks.outcome = func(o *store.Outcome) {
		if o.InstructionID == "p005-0" {
			o.ClaimAttemptID = uuid.Must(uuid.NewV7())
		}
	}
	if err := r.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		if st := r.Stats(); st.Dispatched == total-1 && st.LeftInFlight == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v, want %d dispatched and 1 left in flight", r.Stats(), total-1)
		}
	}
	var instruction string
	if err := b.pool.QueryRow(b.ctx, `SELECT instruction_id FROM outbox.inflight`).Scan(&instruction); err != nil || instruction != "p005-0" {
		t.Fatalf("in flight: %q (%v), want p005-0 alone", instruction, err)
	}
	var dispatched int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox.attempts WHERE state = 'DISPATCHED'`).Scan(&dispatched); err != nil || dispatched != total-1 {
		t.Fatalf("%d DISPATCHED rows (%v), want %d", dispatched, err, total-1)
	}
}

// TestStopReturnsWhileDatabaseUnreachable: the database goes away while an
// outcome waits to be recorded. Stop gives recording a bounded time, then
// leaves the instruction in flight for the reaper and returns; before, it
// waited for the database forever.
func TestStopReturnsWhileDatabaseUnreachable(t *testing.T) {
	t.Parallel()
	b := setup(t, rails.SandboxOptions{})
	release := make(chan struct{})
	b.useTransport(t, funcTransport(func(ctx context.Context, ins payment.Instruction) (rails.Result, error) {
		select {
		case <-release:
			return rails.Result{Code: rails.SandboxAccepted, Reference: "ref-" + ins.IdempotencyKey}, nil
		case <-ctx.Done():
			return rails.Result{}, ctx.Err()
		}
	}), 30*time.Second)
	b.enqueue(t, 1, 1)
	r := b.newRelayer(t, b.config("cut-off"))
	if err := r.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	b.waitInFlight(t, 1)

	// Cut the test database off: no new connections, existing ones
	// terminated. The admin connection is to another database.
	admin, err := pgx.Connect(b.ctx, testdb.AdminURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	db := b.pool.Config().ConnConfig.Database
	if _, err := admin.Exec(b.ctx, `ALTER DATABASE "`+db+`" ALLOW_CONNECTIONS false`); err != nil {
		t.Fatal(err)
	}
	reopen := sync.OnceFunc(func() {
		if _, err := admin.Exec(context.Background(), `ALTER DATABASE "`+db+`" ALLOW_CONNECTIONS true`); err != nil {
			t.Error(err)
		}
	})
	defer reopen()
	if _, err := admin.Exec(b.ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1`, db); err != nil {
		t.Fatal(err)
	}
	close(release) // the rail answers; its outcome cannot be recorded

	stopped := make(chan error, 1)
	started := time.Now()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		stopped <- r.Stop(ctx)
	}()
	select {
	case err := <-stopped:
		t.Logf("Stop returned after %v: %v", time.Since(started).Round(time.Millisecond), err)
	case <-time.After(StopRecordTimeout + 30*time.Second):
		t.Fatal("Stop did not return while the database was unreachable")
	}
	if st := r.Stats(); st.LeftInFlight != 1 || st.Dispatched != 0 {
		t.Errorf("stats %+v, want the outcome left in flight", st)
	}

	reopen()
	b.waitInFlight(t, 1) // still leased: the reaper's to requeue
	b.verify(t, true)
}

// TestOutcomeAfterStopGaveUpDoesNotPanic: a rail that ignores cancellation
// answers after Stop stopped waiting for it. Its outcome is not recorded
// (the instruction stays in flight for the reaper); before, sending it
// crashed the process on a closed channel.
func TestOutcomeAfterStopGaveUpDoesNotPanic(t *testing.T) {
	t.Parallel()
	b := setup(t, rails.SandboxOptions{})
	r, release := b.startInDeafCall(t, "deaf-rail")
	b.waitInFlight(t, 1)

	ctx, cancel := context.WithTimeout(b.ctx, 100*time.Millisecond)
	defer cancel()
	if err := r.Stop(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop: %v, want the deadline exceeded", err)
	}
	close(release)
	done := make(chan struct{})
	go func() { r.current.Load().dispatches.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the dispatch never returned")
	}
	if st := r.Stats(); st.LeftInFlight != 1 || st.Dispatched != 0 {
		t.Errorf("stats %+v, want the late outcome left in flight", st)
	}
	b.waitInFlight(t, 1)
	b.verify(t, true)
}

// TestRailPanicIsRetriedWithSameKey: a Go transport that panics does not
// take the relayer down; the attempt is a retryable transport error (the
// request may have left) and the retry carries the same idempotency key.
func TestRailPanicIsRetriedWithSameKey(t *testing.T) {
	t.Parallel()
	b := setup(t, rails.SandboxOptions{})
	var mu sync.Mutex
	calls := map[string]int{}
	b.useTransport(t, funcTransport(func(_ context.Context, ins payment.Instruction) (rails.Result, error) {
		mu.Lock()
		calls[ins.IdempotencyKey]++
		n := calls[ins.IdempotencyKey]
		mu.Unlock()
		if n == 1 {
			panic("transport bug")
		}
		return rails.Result{Code: rails.SandboxAccepted, Reference: "ref-" + ins.IdempotencyKey}, nil
	}), 5*time.Second)
	const total = 5
	b.enqueue(t, total, total)
	b.start(t, b.config("panicky"))
	b.waitDrained(t, time.Minute)

	rep := b.verify(t, true)
	if rep.Dispatched != total {
		t.Fatalf("report %+v, want %d dispatched", rep, total)
	}
	mu.Lock()
	for key, n := range calls {
		if n != 2 {
			t.Errorf("key %s sent %d times, want 2 (the panic, then the retry)", key, n)
		}
	}
	mu.Unlock()
	var retries int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox.attempts
		WHERE state = 'RETRYABLE' AND error_code = 'RAIL_TRANSPORT_ERROR' AND error_message LIKE '%panicked%'`).Scan(&retries); err != nil {
		t.Fatal(err)
	}
	if retries != total {
		t.Errorf("%d retryable transport errors recorded for the panics, want %d", retries, total)
	}
}

// TestUndecodablePayloadIsDeadLettered: a pending row whose payload was
// altered outside the producer cannot be decoded. It becomes a dead letter
// (VALIDATION_FAILED, field payload) and the instructions claimed with it
// are dispatched; before, the whole claim batch was stranded in flight.
func TestUndecodablePayloadIsDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t, rails.SandboxOptions{})
	b.enqueue(t, 3, 3)
	if _, err := b.pool.Exec(b.ctx, `UPDATE outbox.pending SET payload = '{"amount_minor": "lots"}' WHERE participant_id = 'p001'`); err != nil {
		t.Fatal(err)
	}
	b.start(t, b.config("decoder"))
	b.waitDrained(t, 30*time.Second)

	rep := b.verify(t, true)
	if rep.Dispatched != 2 || rep.DeadLetters != 1 {
		t.Fatalf("report %+v, want 2 dispatched and 1 dead letter", rep)
	}
	var participant, code string
	if err := b.pool.QueryRow(b.ctx, `SELECT participant_id, error_code FROM outbox.dead_letters`).Scan(&participant, &code); err != nil {
		t.Fatal(err)
	}
	if participant != "p001" || code != string(rails.CodeValidationFailed) {
		t.Errorf("dead letter of %s with %s, want p001 with VALIDATION_FAILED", participant, code)
	}
	if st := b.sandbox.Stats(); st.Payments != 2 {
		t.Errorf("sandbox paid %d, want 2", st.Payments)
	}
}

// TestCallDeadlineUsesOwnClock: the rail call's deadline is measured on
// the relayer's clock from before the claim, not by comparing the
// database's lease end with the local clock, so a database clock running
// ahead cannot stretch a call past the lease.
func TestCallDeadlineUsesOwnClock(t *testing.T) {
	t.Parallel()
	r := &run{Relayer: &Relayer{cfg: Config{LeaseGrace: 10 * time.Second}}}
	claimStart := time.Now()
	dbNow := claimStart.Add(time.Hour) // the database's clock is an hour ahead
	c := store.Claimed{ClaimedAt: dbNow, LeaseUntil: dbNow.Add(40 * time.Second)}
	if got, want := r.callDeadline(claimStart, c), claimStart.Add(35*time.Second); !got.Equal(want) {
		t.Errorf("call deadline %v after the claim started, want %v", got.Sub(claimStart), want.Sub(claimStart))
	}
}

// TestConfigRejectsStaleIdleRefresh: a refresh slower than half the
// trigger's freshness window would let the registration go stale while the
// relayer waits, and producers would stop notifying it.
func TestConfigRejectsStaleIdleRefresh(t *testing.T) {
	t.Parallel()
	set, err := rails.NewSet(rails.Options{Type: "sandbox", Profile: payment.Generic{}, Transport: rails.NewSandbox(rails.SandboxOptions{})})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(nil, Config{Rails: set, IdleRefresh: 8 * time.Second}); err == nil {
		t.Error("IdleRefresh 8s accepted")
	}
	if _, err := New(nil, Config{Rails: set, IdleRefresh: 5 * time.Second}); err != nil {
		t.Errorf("IdleRefresh 5s: %v", err)
	}
}

// TestStopBeginsWhileAWriteWaitsForALock: an outcome write waits for its
// participant's lock (a producer's transaction holds it) when Stop is
// called. Stop begins at once: the claim loop ends while the write still
// waits, and an instruction enqueued then is not claimed. Before, Stop
// waited for the write (up to its 30 s timeout) before it even stopped
// claiming, ignoring its context, and the relayer went on claiming and
// calling rails that whole time, only to cut those calls off at the hard
// deadline that had meanwhile passed.
func TestStopBeginsWhileAWriteWaitsForALock(t *testing.T) {
	t.Parallel()
	b := setup(t, rails.SandboxOptions{})
	b.enqueueOne(t, "held")
	lock := b.lockParticipant(t, "held")
	r := b.newRelayer(t, b.config("held-stop"))
	r.testHooks.abandonWait = 50 * time.Millisecond
	if err := r.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	run := r.current.Load()
	waitFor(t, 10*time.Second, "the held participant's outcome write to wait for its lock", func() bool {
		var waiting bool
		err := b.pool.QueryRow(b.ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock')`).Scan(&waiting)
		return err == nil && waiting && b.sandbox.Stats().Payments == 1
	})

	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		stopped <- r.Stop(ctx)
	}()
	waitFor(t, 10*time.Second, "Stop to begin", func() bool { return !r.Health().Running })
	// The claim loop ends while the write still waits. A claim statement
	// it sent just before Stop began may still be under way: enqueued
	// before that statement's snapshot, the next instruction would be
	// claimed (and handed back unsent), so it is enqueued once the loop
	// has ended.
	select {
	case <-run.loopDone:
	case <-time.After(10 * time.Second):
		t.Fatal("the claim loop did not end while the write waited for its lock")
	}
	b.enqueueOne(t, "late")
	claimed := func() bool {
		var n int
		err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox.attempts WHERE participant_id = 'late'`).Scan(&n)
		return err == nil && n > 0
	}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(StopRecordTimeout + 15*time.Second)
	for done := false; !done; {
		select {
		case err := <-stopped:
			t.Logf("Stop: %v", err)
			done = true
		case <-tick.C:
			if claimed() {
				t.Fatal("an instruction enqueued after Stop began was claimed")
			}
		case <-deadline:
			t.Fatal("Stop did not return while a write waited for a lock")
		}
	}
	if claimed() {
		t.Fatal("an instruction enqueued after Stop began was claimed")
	}
	if err := lock.Rollback(b.ctx); err != nil {
		t.Fatal(err)
	}
	if st := r.Stats(); st.Dispatched != 0 || st.LeftInFlight != 1 {
		t.Errorf("stats %+v, want the held outcome left in flight for the reaper", st)
	}
	b.verify(t, true)
}

// TestStopHandsBackClaimsWaitingForARailSlot: Stop hands back the claims
// not yet sent, including those waiting for a slot under the rail's
// concurrency cap when it begins. Before, they waited on through the stop
// (none handed back while the first call ran), held Stop up, and called
// the rail once the slot came free if their leases still left the rail's
// timeout.
func TestStopHandsBackClaimsWaitingForARailSlot(t *testing.T) {
	t.Parallel()
	b := setup(t, rails.SandboxOptions{})
	release := make(chan struct{})
	var calls atomic.Int64
	tr := funcTransport(func(_ context.Context, ins payment.Instruction) (rails.Result, error) {
		if calls.Add(1) == 1 {
			<-release
		}
		return rails.Result{Code: rails.SandboxAccepted, Reference: "ref-" + ins.IdempotencyKey}, nil
	})
	set, err := rails.NewSet(rails.Options{Type: "sandbox", Profile: payment.Generic{}, Transport: tr, Codes: rails.SandboxCodes,
		Timeout: 2 * time.Second, MaxConcurrency: 1, Breaker: rails.BreakerOptions{Disabled: true}})
	if err != nil {
		t.Fatal(err)
	}
	b.rails = set
	b.enqueue(t, 3, 3)
	r := b.newRelayer(t, b.config("capped"))
	if err := r.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	b.waitInFlight(t, 3) // one in the rail, two waiting for its slot
	for deadline := time.Now().Add(30 * time.Second); calls.Load() == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the rail was never called")
		}
	}

	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		stopped <- r.Stop(ctx)
	}()
	// Well within the claims' leases, so that claims still waiting when
	// the first call ends have the time to call the rail.
	deadline := time.Now().Add(5 * time.Second)
	for r.Stats().Released < 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	released := r.Stats().Released
	close(release)
	if err := <-stopped; err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if st := r.Stats(); released != 2 || calls.Load() != 1 || st.Dispatched != 1 {
		t.Fatalf("while the first call ran: %d released; after Stop: %d rail calls, stats %+v; want the two waiting handed back unsent",
			released, calls.Load(), st)
	}
	var pendingRows int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox.pending`).Scan(&pendingRows); err != nil || pendingRows != 2 {
		t.Fatalf("%d pending rows (%v), want the two handed back", pendingRows, err)
	}
	b.verify(t, true)
}

// TestPersistentOrderingConflictsAreLogged: a claim refused by the
// one-in-flight-per-participant index is a race with another relayer and
// is retried quietly; one refused every time (a participant's second row
// due beside its instruction in flight: a broken invariant) stops every
// claim of the relayer, so it says so. Before, it retried every Debounce
// without a word.
func TestPersistentOrderingConflictsAreLogged(t *testing.T) {
	t.Parallel()
	b := setup(t, rails.SandboxOptions{})
	b.enqueue(t, 2, 1) // p000's first and second
	st, err := store.New("")
	if err != nil {
		t.Fatal(err)
	}
	held, err := st.Claim(b.ctx, b.pool, store.ClaimParams{RelayerID: "elsewhere", Limit: 1,
		Leases: map[string]time.Duration{"sandbox": time.Hour}})
	if err != nil || len(held) != 1 {
		t.Fatalf("claim: %v %v", held, err)
	}
	// The corruption: the second made due beside the first in flight.
	if _, err := b.pool.Exec(b.ctx, `UPDATE outbox.pending SET next_attempt_at = now() WHERE participant_id = 'p000'`); err != nil {
		t.Fatal(err)
	}
	var (
		mu   sync.Mutex
		logs strings.Builder
	)
	cfg := b.config("conflicted")
	cfg.Logger = slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logs.Write(p)
	}), nil))
	r := b.newRelayer(t, cfg)
	r.testHooks.persistentConflict = 200 * time.Millisecond
	if err := r.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		mu.Lock()
		got := strings.Contains(logs.String(), "run `outbox audit verify`")
		mu.Unlock()
		if got {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no log line about the conflicts after 30 s:\n%s", logs.String())
		}
	}
}

// writerFunc is an io.Writer made of a function.
type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// TestClaimThatCommitsAfterStopIsReleasedUnsent: a claim under way when
// Stop begins is not cancelled (its caller would lose what it committed,
// stranded in flight until the reaper), and what it took is handed back
// without calling the rail: RELEASED, back in pending at once with its
// retry budget untouched, nothing paid. The claim is held on a lock (a
// SHARE lock on the in-flight table blocks its insert, not the relayer's
// reads) until Stop has begun. Nothing else checks that a stopping
// relayer sends nothing: the rolling-deploy fault scenario counts
// RELEASED rows but only logs the count.
func TestClaimThatCommitsAfterStopIsReleasedUnsent(t *testing.T) {
	t.Parallel()
	b := setup(t, rails.SandboxOptions{})
	var calls sync.Map
	b.useTransport(t, funcTransport(func(_ context.Context, ins payment.Instruction) (rails.Result, error) {
		calls.Store(ins.InstructionID, true)
		return rails.Result{Code: rails.SandboxAccepted, Reference: "ref-" + ins.IdempotencyKey}, nil
	}), 30*time.Second)
	const total = 3
	b.enqueue(t, total, total) // one head each of three participants

	lock, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback(context.WithoutCancel(b.ctx))
	if _, err := lock.Exec(b.ctx, `LOCK TABLE outbox.inflight IN SHARE MODE`); err != nil {
		t.Fatal(err)
	}
	r := b.newRelayer(t, b.config("released"))
	if err := r.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the claim to wait for the lock", func() bool {
		var waiting bool
		err := b.pool.QueryRow(b.ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock')`).Scan(&waiting)
		return err == nil && waiting
	})
	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		stopped <- r.Stop(ctx)
	}()
	waitFor(t, 10*time.Second, "Stop to begin", func() bool { return !r.Health().Running })
	if err := lock.Rollback(b.ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatalf("Stop: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Stop did not return")
	}

	calls.Range(func(id, _ any) bool {
		t.Errorf("the rail was called for %v, claimed after Stop began", id)
		return true
	})
	if st := r.Stats(); st.Claimed != total || st.Released != total || st.Dispatched != 0 || st.LeftInFlight != 0 {
		t.Fatalf("stats %+v, want %d claimed and all released, nothing dispatched or left in flight", st, total)
	}
	var released, pendingNow, budgetUsed int
	if err := b.pool.QueryRow(b.ctx, `SELECT
		(SELECT count(*) FROM outbox.attempts WHERE state = 'RETRYABLE' AND error_code = 'RELEASED'),
		(SELECT count(*) FROM outbox.pending WHERE next_attempt_at <= now()),
		(SELECT count(*) FROM outbox.pending WHERE attempt_count <> 0)`).Scan(&released, &pendingNow, &budgetUsed); err != nil {
		t.Fatal(err)
	}
	if released != total || pendingNow != total || budgetUsed != 0 {
		t.Fatalf("%d RELEASED attempts, %d due again, %d with their budget used; want %d, %d, 0", released, pendingNow, budgetUsed, total, total)
	}
	b.verify(t, true)
}

// startInDeafCall enqueues one instruction and starts a relayer (id
// relayerID) whose rail ignores cancellation and answers only once release
// is closed; it returns once the rail is in the call. The rail must be in
// the call when a test's Stop begins: a claim committed whose dispatch
// starts after Stop is released without calling the rail, and Stop then
// has nothing to wait for. Stop gives up waiting for the call after 50 ms.
func (b *testBundle) startInDeafCall(t *testing.T, relayerID string) (*Relayer, chan struct{}) {
	t.Helper()
	release := make(chan struct{})
	called := make(chan struct{})
	b.useTransport(t, funcTransport(func(_ context.Context, ins payment.Instruction) (rails.Result, error) {
		close(called)
		<-release // ignores ctx on purpose
		return rails.Result{Code: rails.SandboxAccepted, Reference: "ref-" + ins.IdempotencyKey}, nil
	}), 30*time.Second)
	b.enqueue(t, 1, 1)
	r := b.newRelayer(t, b.config(relayerID))
	r.testHooks.abandonWait = 50 * time.Millisecond
	if err := r.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-called:
	case <-time.After(30 * time.Second):
		t.Fatal("the rail was never called")
	}
	return r, release
}

// TestRetriesOfAnOutageAreLoggedInSummary: a rail that answers every call
// with a retryable refusal that does not open its breaker (rate limited:
// the rail is up, it wants us slower, say for a spent daily quota) is
// retried at the pace of the backoff, for every instruction queued. Each
// retried attempt logged a WARN line with its ids, thousands a second for
// as long as the rail refused, which the archive holds already. Now the
// first of a rail's and code's retries in a minute is logged, the rest at
// debug, and the next line says how many were not logged.
func TestRetriesOfAnOutageAreLoggedInSummary(t *testing.T) {
	t.Parallel()
	b := setup(t, rails.SandboxOptions{})
	b.useTransport(t, funcTransport(func(context.Context, payment.Instruction) (rails.Result, error) {
		return rails.Result{Code: rails.SandboxRateLimited, Message: "slow down"}, nil
	}), 2*time.Second)
	var (
		mu   sync.Mutex
		logs strings.Builder
	)
	cfg := b.config("rate-limited")
	cfg.MaxAttempts = 1000
	cfg.Logger = slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logs.Write(p)
	}), nil))
	r := b.start(t, cfg)
	b.enqueue(t, 20, 20)
	for deadline := time.Now().Add(60 * time.Second); r.Stats().Retried < 300; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not retried 300 times within a minute: %+v", r.Stats())
		}
	}
	mu.Lock()
	lines := strings.Count(logs.String(), `msg="attempt failed: will retry"`)
	mu.Unlock()
	if retried := r.Stats().Retried; lines > 2 {
		t.Fatalf("%d lines logged for %d retried attempts of one rail refusing with one code, want one a minute", lines, retried)
	}
}

// TestRetryLogSaysHowManyItDidNotLog: after a rail's and code's minute,
// the next retry of that rail and code is logged again, with the number
// of those that were not; another rail or code has a minute of its own.
func TestRetryLogSaysHowManyItDidNotLog(t *testing.T) {
	t.Parallel()
	var l retryLog
	at := time.Unix(1_000_000, 0)
	limited, down := retryLogKey{"ach", "RAIL_RATE_LIMITED"}, retryLogKey{"ach", "RAIL_UNAVAILABLE"}
	type took struct {
		log    bool
		hidden int64
	}
	take := func(k retryLogKey, after time.Duration) took {
		log, hidden := l.take(k, at.Add(after))
		return took{log, hidden}
	}
	got := []took{take(limited, 0), take(limited, time.Second), take(down, 2*time.Second), take(limited, 59*time.Second),
		take(limited, retryLogEvery), take(limited, retryLogEvery+time.Second)}
	want := []took{{true, 0}, {false, 0}, {true, 0}, {false, 0}, {true, 2}, {false, 0}}
	if !slices.Equal(got, want) {
		t.Fatalf("took %v, want %v", got, want)
	}
}
