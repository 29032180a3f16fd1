package engine

import (
	"context"
	"testing"
	"time"

	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/rails"
)

// TestClaimLoopSurvivesBlackHoledConnections: when the connections a
// relayer's pool holds go silent for good (the primary died without
// resetting them; new connections reach the new primary), every
// statement of the claim loop must give up on its connection within the
// relayer's statement deadline, so that the next one opens a fresh
// connection. A statement without a deadline on such a connection hangs
// until TCP gives up, about 15 minutes on Linux, and the claim loop with
// it: nothing is claimed meanwhile. Before the fix the check for suspects
// (store.SuspectsDue, which the claim loop runs four times a second before
// its claim) had no deadline, and the instruction enqueued after the hole
// was never dispatched.
func TestClaimLoopSurvivesBlackHoledConnections(t *testing.T) {
	t.Parallel()
	// Every connection the pool may hold is open (and idle) before the
	// hole, so that the claim loop's next statements all take silent ones.
	direct, proxied, proxy := testdb.NewProxied(t, 4, 4)

	b := setupOn(t, proxied, rails.SandboxOptions{Seed: 1})
	rc := b.config("r-hole")
	rc.PollOnly = true
	r, err := New(proxied, rc)
	if err != nil {
		t.Fatal(err)
	}
	const deadline = time.Second
	r.testHooks.statementDeadline = deadline
	if err := r.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = r.Stop(ctx)
	})

	enqueue := func(i int) {
		t.Helper()
		if _, err := b.producer.Enqueue(b.ctx, direct, instruction("hole", i)); err != nil {
			t.Fatal(err)
		}
	}
	enqueue(0)
	statsOnceDispatched(t, r, 1)
	if n, want := proxied.Stat().TotalConns(), proxied.Config().MaxConns; n != want {
		t.Fatalf("the pool has %d connections, want %d", n, want)
	}

	held := proxy.HoldExisting()
	t.Logf("black-holed %d connections", held)
	// The claim loop runs into the silent connections within a claim or
	// two; then the next instruction arrives.
	time.Sleep(3 * deadline)
	enqueue(1)
	// Each silent connection costs a statement deadline at most, the claim
	// loop's backoff a few seconds more (claimBackoffCap, 5 s), and its
	// pool slot 15 s more: pgx closes a connection whose statement timed
	// out in the background, reading it until the server's close or 15 s,
	// and the pool opens no connection in its place until then (with all
	// four silent, the instruction waited 13-17 s under load, of the 20 s
	// this allowed before).
	within := 10*deadline + 10*time.Second + 15*time.Second
	start := time.Now()
	for r.Stats().Dispatched < 2 {
		if time.Since(start) > within {
			t.Fatalf("the instruction enqueued after the black hole was not dispatched within %s: %+v", within, r.Stats())
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("dispatched %s after it was enqueued", time.Since(start).Round(time.Millisecond))
}

// TestListenerSurvivesABlackHoledConnection: when the listener's
// connection goes silent for good (the primary died without resetting it,
// or a firewall dropped it while it was idle; new connections reach the
// database), the relayer must notice and listen on a fresh connection.
// Before, the listener waited for notifications on the silent connection
// for as long as the process ran: the relayer kept reporting itself
// listening, kept registering idle (so producers paid for NOTIFY), and
// heard of no instruction again, each one waiting for the next poll.
func TestListenerSurvivesABlackHoledConnection(t *testing.T) {
	t.Parallel()
	direct, proxied, proxy := testdb.NewProxied(t, 4, 0)

	b := setupOn(t, proxied, rails.SandboxOptions{Seed: 1})
	rc := b.config("r-silent-listener")
	// Polls too rare to stand in for the notifications this test waits
	// for: only the idle registration's refresh claims meanwhile.
	rc.PollInterval, rc.IdleRefresh = time.Minute, 5*time.Second
	r, err := New(proxied, rc)
	if err != nil {
		t.Fatal(err)
	}
	r.testHooks.statementDeadline = time.Second
	r.testHooks.listenCheck = 500 * time.Millisecond
	if err := r.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = r.Stop(ctx)
	})

	enqueued := 0
	enqueue := func() {
		t.Helper()
		if _, err := b.producer.Enqueue(b.ctx, direct, instruction("silent", enqueued)); err != nil {
			t.Fatal(err)
		}
		enqueued++
	}
	// Notified: the listener works before the hole.
	notifiedAfter := func(before int64, within time.Duration) bool {
		for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if r.Stats().Notifications > before {
				return true
			}
		}
		return false
	}
	for start := time.Now(); !r.Health().Listening; time.Sleep(10 * time.Millisecond) {
		if time.Since(start) > 30*time.Second {
			t.Fatalf("the relayer was not listening 30 s after its start: %+v", r.Health())
		}
	}
	for n := r.Stats().Notifications; ; {
		time.Sleep(200 * time.Millisecond) // registered idle
		enqueue()
		if notifiedAfter(n, 2*time.Second) {
			break
		}
		if enqueued > 10 {
			t.Fatalf("no notification before the black hole: %+v", r.Stats())
		}
	}
	statsOnceDispatched(t, r, int64(enqueued))

	held := proxy.HoldExisting()
	t.Logf("black-holed %d connections", held)
	before := r.Stats().Notifications
	// Each enqueue notifies whoever listens; a listener that noticed the
	// hole and listens again on a new connection hears one within a check
	// and a round trip.
	start := time.Now()
	for !notifiedAfter(before, time.Second) {
		if time.Since(start) > 30*time.Second {
			t.Fatalf("no notification reached the relayer in %s after its listener's connection went silent (health %+v, stats %+v)",
				time.Since(start).Round(time.Second), r.Health(), r.Stats())
		}
		enqueue()
	}
	t.Logf("notified again %s after the black hole", time.Since(start).Round(time.Millisecond))
	statsOnceDispatched(t, r, int64(enqueued))
}
