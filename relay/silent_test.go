package relay_test

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/ledgerline/outbox/engine"
	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/pending"
	"github.com/ledgerline/outbox/rails"
	"github.com/ledgerline/outbox/reaper"
	"github.com/ledgerline/outbox/relay"
)

// funcTransport adapts a function to rails.Transport.
type funcTransport func(ctx context.Context, ins payment.Instruction) (rails.Result, error)

func (f funcTransport) Send(ctx context.Context, ins payment.Instruction) (rails.Result, error) {
	return f(ctx, ins)
}

// testLogger logs to stderr only when OUTBOX_TEST_LOG is set.
func testLogger() *slog.Logger {
	if os.Getenv("OUTBOX_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return slog.New(slog.DiscardHandler)
}

// TestStopWhileTheDatabaseIsSilentKeepsItsBound: a service whose database
// stops answering (every connection black-holed, as behind a dead network
// path) while an outcome waits to be recorded stops within what README
// promises a program sizing its shutdown grace: the stop timeout, then at
// most engine.StopRecordTimeout (10 s) for recording, the outcome left in
// flight for the reaper. It took 5 s more: after recording was abandoned,
// the relayer's removal of its idle registration waited its own 5 s for
// the same silent database. And when the outcome's write had begun before
// Stop (it may hand off, so it counts as a dispatch), Stop waited for it
// to the deadline, gave it the 5 s a cancelled dispatch gets, and only
// then the whole 10 s for recording: 16 s (the wait below makes that
// order certain).
func TestStopWhileTheDatabaseIsSilentKeepsItsBound(t *testing.T) {
	t.Parallel()
	direct, proxied, proxy := testdb.NewProxied(t, 4, 4)
	release, answered := make(chan struct{}), make(chan struct{})
	transport := funcTransport(func(ctx context.Context, ins payment.Instruction) (rails.Result, error) {
		defer close(answered) // one instruction, one call
		select {
		case <-release:
			return rails.Result{Code: rails.SandboxAccepted, Reference: "ref-" + ins.IdempotencyKey}, nil
		case <-ctx.Done():
			return rails.Result{}, ctx.Err()
		}
	})
	set, err := rails.NewSet(rails.Options{Type: "sandbox", Profile: payment.Generic{}, Transport: transport,
		Codes: rails.SandboxCodes, Timeout: 3 * time.Minute}) // past the waits below
	if err != nil {
		t.Fatal(err)
	}
	svc, err := relay.New(proxied, relay.Config{Relayer: engine.Config{Rails: set, PollInterval: time.Minute, Logger: testLogger()},
		Reaper: reaper.Config{Interval: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := pending.Enqueue(t.Context(), direct, pending.Instruction{InstructionID: "a", ParticipantID: "p",
		IdempotencyKey: "a", RailType: "sandbox", AmountMinor: 100, Currency: "USD", Destination: "acct-1"}); err != nil {
		t.Fatal(err)
	}
	// Claimed, and the claim loop idle (its claims found nothing, and it
	// registered idle again after the claim: it waits for a notification
	// or its refresh): no claim is in progress when the database goes
	// silent (Stop waits for one, see README). The registration is the
	// sign, not a count of hot polls: a claim woken otherwise (the
	// notification of the enqueue arriving after a claim had taken the
	// instruction) counts as empty too, and the relayer then registered
	// after two hot polls, never reaching the three this waited for (1
	// run in 8 under load).
	var claimedBy time.Time // the database's time once the claim was seen
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if claimedBy.IsZero() && svc.Relayer().Stats().Claimed == 1 {
			if err := direct.QueryRow(t.Context(), `SELECT clock_timestamp()`).Scan(&claimedBy); err != nil {
				t.Fatal(err)
			}
		}
		if !claimedBy.IsZero() {
			var idle bool
			if err := direct.QueryRow(t.Context(), `SELECT EXISTS (SELECT 1 FROM outbox.relayer_idle
				WHERE relayer_id = $1 AND idle_since > $2)`, svc.Relayer().ID(), claimedBy).Scan(&idle); err != nil {
				t.Fatal(err)
			}
			if idle {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("not claimed, or the claim loop not idle: %+v", svc.Relayer().Stats())
		}
	}
	// Registered, it may still be at work, and a claim in flight at the
	// black hole (or begun before Stop) holds Stop for its own 30 s: its
	// registration's look for writers that might have enqueued without
	// notifying polls the database every 50 ms at most while any writer of
	// the cluster (the test cluster is shared) runs, for up to the poll
	// interval, and claims now and then (1 run in 8 under load took 40 s).
	// No statement in flight and none for 200 ms: it waits for its next
	// refresh, IdleRefresh (3 s) after its wait began.
	for deadline := time.Now().Add(90 * time.Second); !proxy.QuietFor(200 * time.Millisecond); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the relayer's statements never paused for 200 ms: %+v", svc.Relayer().Stats())
		}
	}
	idle := svc.Relayer().Stats()
	t.Logf("black-holed %d connections", proxy.HoldExisting())
	close(release) // the rail answers; its outcome cannot be recorded
	// The outcome reaches the recorder, whose write (with a hand-off: the
	// instruction is dispatched) begins before Stop and hangs.
	<-answered
	time.Sleep(300 * time.Millisecond)

	const stopTimeout = time.Second
	ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	started := time.Now()
	before := svc.Relayer().Stats()
	err = svc.Stop(ctx)
	took := time.Since(started)
	t.Logf("Stop returned after %v: %v", took.Round(time.Millisecond), err)
	// wakes counts the claim loop's wakeups (each one a claim).
	wakes := func(st engine.Stats) int64 { return st.Polls + st.HotPolls + st.Notifications }
	after := svc.Relayer().Stats()
	t.Logf("since the black hole: claim loop wakes %d before Stop, %d once it returned; claims %d, %d",
		wakes(before)-wakes(idle), wakes(after)-wakes(idle), before.Claims-idle.Claims, after.Claims-idle.Claims)
	if bound := stopTimeout + engine.StopRecordTimeout + 2*time.Second; took > bound {
		t.Errorf("Stop took %v, past the documented bound of the stop timeout and %v more (%v with slack)",
			took.Round(time.Millisecond), engine.StopRecordTimeout, bound)
	}
	if st := svc.Relayer().Stats(); st.LeftInFlight != 1 {
		t.Errorf("stats %+v, want the outcome left in flight for the reaper", st)
	}
}
