package engine

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ledgerline/outbox/rails"
)

// TestNoStrandUnderRacingProducers: producers commit instruction n+1 of a
// participant while relayers record instruction n of the same participant
// and hand its successor on, over and over (few participants, one
// instruction per transaction, two relayers draining as they come). A
// participant whose next instruction waited for a hand-off that never came
// would be stranded: pending forever, never due. Every instruction must be
// dispatched in sequence order, with one head per participant throughout
// (audit verify), and without the fallback poll (10 s) rescuing anyone:
// nothing waits at 'infinity' for a poll.
func TestNoStrandUnderRacingProducers(t *testing.T) {
	t.Parallel()
	const participants, each, producers = 4, 150, 8
	b := setup(t, rails.SandboxOptions{})
	var relayers []*Relayer
	for i := range 2 {
		cfg := b.config(fmt.Sprintf("racer-%d", i))
		cfg.PollInterval = 10 * time.Second
		relayers = append(relayers, b.start(t, cfg))
	}
	// Producer k enqueues the instructions i ≡ k (mod producers) of every
	// participant, one per transaction, so each participant's stream is fed
	// by several producers at once.
	var wg sync.WaitGroup
	errs := make(chan error, producers)
	for k := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := k; i < each; i += producers {
				for p := range participants {
					if _, err := b.producer.Enqueue(b.ctx, b.pool, instruction(fmt.Sprintf("race-%d", p), i)); err != nil {
						errs <- err
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	b.waitDrained(t, 2*time.Minute)

	rep := b.verify(t, true)
	if rep.Dispatched != participants*each || rep.DispatchedTwice != 0 {
		t.Fatalf("report %+v: want %d dispatched once each", rep, participants*each)
	}
	var handoffs, polls int64
	for _, r := range relayers {
		handoffs += r.Stats().Handoffs
		polls += r.Stats().Polls
	}
	t.Logf("%d hand-offs, %d fallback polls", handoffs, polls)
	if handoffs == 0 {
		t.Fatal("no hand-off happened: the race this test is about did not take place")
	}
}

// TestHandoffsNeedNoClaims: a participant's queue drained by hand-offs
// alone gives no slot back until its end, so it prompts no claims: a write
// whose every slot went to a successor used to wake the claim loop anyway,
// one empty claim per write (about 200 here). What claims remain are the
// first, the hot polls while nothing else comes (doubling from Debounce)
// and the one after the last outcome.
func TestHandoffsNeedNoClaims(t *testing.T) {
	t.Parallel()
	const each = 200
	st := drainOnePollOnlyRelayer(t, 1, each, true)
	if st.Handoffs != each-1 {
		t.Fatalf("stats %+v: want %d hand-offs (every instruction after the first)", st, each-1)
	}
	if st.Claims > each/10 {
		t.Fatalf("stats %+v: %d claims for %d hand-offs, want at most %d", st, st.Claims, st.Handoffs, each/10)
	}
	t.Logf("%d claims, %d hand-offs, %d hot polls", st.Claims, st.Handoffs, st.HotPolls)
}

// TestBusyParticipantsShareWrites: a few busy participants are drained by
// hand-offs, and each write waits the moment it takes for the outcomes of
// the hand-offs the last write dispatched (recorder.hold), so every write
// carries all of them: each participant moves one instruction per write.
// Without the wait they split into groups that take turns, each
// participant moving once every two writes (3.6 to 6.7 outcomes per write
// of 10 in `outbox bench`).
//
// On an instant rail recorder.gather (yields, no clock) often collects the
// hand-offs' outcomes too, so a relayer without hold passed this test now
// and then. Here the rail answers each call in 2 to 8 ms, spread at
// random, so gather's yields find the outcomes after the first still out,
// and each outcome write sleeps 50 ms in the database (a statement
// trigger, this test's database only): hold waits for the hand-offs (up
// to twice their mean dispatch time, never half a write), and without it
// the outcomes that come back during a write make the next one, the
// groups alternate, and writes carry about 5 outcomes, every time.
func TestBusyParticipantsShareWrites(t *testing.T) {
	t.Parallel()
	const participants, each = 10, 30
	st := drainOnePollOnlyRelayerWith(t, participants, each, true,
		rails.SandboxOptions{Seed: 1, LatencyMin: 2 * time.Millisecond, LatencyMax: 8 * time.Millisecond}, 50*time.Millisecond)
	perWrite := float64(st.Dispatched) / float64(st.OutcomeWrites)
	t.Logf("%d outcomes in %d writes (%.1f per write), %d hand-offs", st.Dispatched, st.OutcomeWrites, perWrite, st.Handoffs)
	if perWrite < 0.8*participants {
		t.Fatalf("stats %+v: %.1f outcomes per write, want at least %.0f of the %d busy participants in each", st, perWrite, 0.8*participants, participants)
	}
}

// TestUnorderedDrainRefillsInItsWrites: with ordering off, the write that
// records a batch's outcomes claims the next batch for the slots it frees
// (the hand-off's refill), so a queue is drained one transaction per batch:
// the claims that find work are those that fill the relayer's slots at
// the start, however long the queue. Without the refill every write was
// followed by a claim (about 40 here, with writes of 100).
func TestUnorderedDrainRefillsInItsWrites(t *testing.T) {
	t.Parallel()
	const participants, each = 100, 40
	st := drainOnePollOnlyRelayer(t, participants, each, false)
	t.Logf("%d claims, %d outcome writes, %d hand-offs", st.Claims, st.OutcomeWrites, st.Handoffs)
	if st.Handoffs < participants*each/2 {
		t.Fatalf("stats %+v: %d of %d instructions handed off by writes, want most", st, st.Handoffs, participants*each)
	}
	if st.ClaimBatches > st.OutcomeWrites/3 {
		t.Fatalf("stats %+v: %d claims found work for %d outcome writes, want the writes to claim", st, st.ClaimBatches, st.OutcomeWrites)
	}
}

// TestTrickleLeavesClaimsToTheClaimLoop: at a steady trickle the claim
// loop's claims never come back full, so outcome writes do not refill
// their slots from the due queue (a scan of it in every write, which cost
// latency at 1,000/s): the claim loop's hot polls pick new work up.
func TestTrickleLeavesClaimsToTheClaimLoop(t *testing.T) {
	t.Parallel()
	b := setup(t, rails.SandboxOptions{})
	b.unordered(t)
	r := b.start(t, b.config("trickle"))
	const n = 40
	for i := range n {
		if _, err := b.producer.Enqueue(b.ctx, b.pool, instruction(fmt.Sprintf("t%02d", i), 0)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	b.waitDrained(t, time.Minute)
	st := statsOnceDispatched(t, r, n)
	t.Logf("%d claims, %d outcome writes, %d hand-offs", st.Claims, st.OutcomeWrites, st.Handoffs)
	if st.Dispatched != n || st.Handoffs != 0 {
		t.Fatalf("stats %+v: want %d dispatched, all claimed by the claim loop", st, n)
	}
}

// drainOnePollOnlyRelayer enqueues each instructions for every one of
// participants, drains them with one relayer that polls only once a minute
// (so what it claims comes from its own wakeups and hand-offs), checks
// that all were dispatched (in order, if ordered), and returns the
// relayer's stats.
func drainOnePollOnlyRelayer(t *testing.T, participants, each int, ordered bool) Stats {
	t.Helper()
	return drainOnePollOnlyRelayerWith(t, participants, each, ordered, rails.SandboxOptions{}, 0)
}

// drainOnePollOnlyRelayerWith is drainOnePollOnlyRelayer on a sandbox rail
// of sandbox, and, with writeDelay, every statement that writes the
// archive sleeping that long first (a trigger in this test's database):
// writes that take a known least time, whatever the machine.
func drainOnePollOnlyRelayerWith(t *testing.T, participants, each int, ordered bool, sandbox rails.SandboxOptions, writeDelay time.Duration) Stats {
	t.Helper()
	b := setup(t, sandbox)
	if !ordered {
		b.unordered(t)
	}
	b.enqueue(t, participants*each, participants)
	if writeDelay > 0 {
		if _, err := b.pool.Exec(b.ctx, fmt.Sprintf(`
CREATE FUNCTION outbox.test_slow_write() RETURNS trigger LANGUAGE plpgsql AS
  $$BEGIN PERFORM pg_sleep(%f); RETURN NULL; END$$;
CREATE TRIGGER test_slow_write BEFORE INSERT ON outbox.attempts
  FOR EACH STATEMENT EXECUTE FUNCTION outbox.test_slow_write()`, writeDelay.Seconds())); err != nil {
			t.Fatal(err)
		}
	}
	cfg := b.config("drainer")
	cfg.PollOnly, cfg.PollInterval = true, time.Minute
	r := b.start(t, cfg)
	b.waitDrained(t, 2*time.Minute) // a loaded machine: 200 writes one after another
	if rep := b.verify(t, ordered); rep.Dispatched != int64(participants*each) {
		t.Fatalf("report %+v: want %d dispatched", rep, participants*each)
	}
	return statsOnceDispatched(t, r, int64(participants*each))
}
