package store_test

import (
	"strings"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"

	"github.com/ledgerline/outbox/internal/store"
)

// retryWait is a retry time no test outlives.
const retryWait = time.Hour

// dueAt returns when the pending instruction id is due (infinity while it
// waits) and the retry time it keeps while it waits (zero for none).
func (b *recordBundle) dueAt(t *testing.T, id uuid.UUID) (due string, retryAt time.Time) {
	t.Helper()
	var r *time.Time
	if err := b.pool.QueryRow(b.ctx, `SELECT CASE WHEN next_attempt_at = 'infinity' THEN 'infinity'
		WHEN next_attempt_at <= now() THEN 'now' WHEN next_attempt_at > now() + interval '50 minutes' THEN 'in an hour'
		ELSE 'soon' END, retry_at FROM outbox.pending WHERE outbox_id = $1`, id).Scan(&due, &r); err != nil {
		t.Fatalf("%s: %v", id, err)
	}
	if r != nil {
		retryAt = *r
	}
	return due, retryAt
}

// wantDue checks when id is due and whether it keeps a retry time.
func (b *recordBundle) wantDue(t *testing.T, id uuid.UUID, due string, keepsRetry bool) {
	t.Helper()
	got, retryAt := b.dueAt(t, id)
	if got != due || retryAt.IsZero() == keepsRetry {
		t.Fatalf("%s is due %s (retry time kept: %v), want due %s (kept: %v)", id, got, retryAt, due, keepsRetry)
	}
}

// dispatchHandingOff records c DISPATCHED with a hand-off of one slot, as
// a relayer does, and returns what the hand-off claimed.
func (b *recordBundle) dispatchHandingOff(t *testing.T, c store.Claimed, relayer string) []store.Claimed {
	t.Helper()
	_, handed, err := b.st.Record(b.ctx, b.pool, []store.Outcome{recordOutcome(t, c, relayer, store.Dispatched)},
		store.HandoffParams{RelayerID: relayer, Limit: 1, Leases: map[string]time.Duration{"sandbox": longLease}})
	if err != nil {
		t.Fatal(err)
	}
	return handed
}

// retryIn records c RETRYABLE, due again after delay.
func (b *recordBundle) retryIn(t *testing.T, c store.Claimed, relayer string, delay time.Duration) {
	t.Helper()
	retry := recordOutcome(t, c, relayer, store.Retryable)
	retry.RetryDelay = delay
	b.record(t, retry)
}

// TestRetryBehindAReplayKeepsItsRetryTime guards a retry recorded while a
// replayed lower sequence of its participant is pending: it waits behind
// the replayed instruction, and when that one is dispatched the hand-off
// must not claim the retry before its retry time. It was written waiting
// with no time at all and handed off at once: a rail that had said "not
// before" was called again immediately.
func TestRetryBehindAReplayKeepsItsRetryTime(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	replayed, third, held := b.replayedBehindInFlight(t, "r1", longLease)
	b.retryIn(t, held, "r1", retryWait)
	b.wantDue(t, replayed, "now", false)
	b.wantDue(t, held.OutboxID, "infinity", true)
	b.verifyOK(t)

	c := b.claimOne(t, "r2", longLease)
	if c.OutboxID != replayed {
		t.Fatalf("claimed %s, want the replayed %s", c.OutboxID, replayed)
	}
	if handed := b.dispatchHandingOff(t, c, "r2"); len(handed) != 0 {
		t.Fatalf("the hand-off claimed %s before its retry time", handed[0].OutboxID)
	}
	b.wantDue(t, held.OutboxID, "in an hour", false)
	b.wantDue(t, third, "infinity", false)
	b.verifyOK(t)
}

// TestRetryBehindAReplayIsHandedOffOnceItsTimeHasPassed: a retry time
// kept behind a replay that has passed when the replayed instruction ends
// no longer holds the retry, which the hand-off claims at once.
func TestRetryBehindAReplayIsHandedOffOnceItsTimeHasPassed(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	replayed, third, held := b.replayedBehindInFlight(t, "r1", longLease)
	b.retryIn(t, held, "r1", 300*time.Millisecond)
	b.wantDue(t, held.OutboxID, "infinity", true)
	c := b.claimOne(t, "r2", longLease)
	if c.OutboxID != replayed {
		t.Fatalf("claimed %s, want the replayed %s", c.OutboxID, replayed)
	}
	_, retryAt := b.dueAt(t, held.OutboxID)
	b.waitPast(t, retryAt)
	handed := b.dispatchHandingOff(t, c, "r2")
	if len(handed) != 1 || handed[0].OutboxID != held.OutboxID {
		t.Fatalf("the hand-off claimed %v, want the retry %s", handed, held.OutboxID)
	}
	b.record(t, recordOutcome(t, handed[0], "r2", store.Dispatched))
	b.verifyOK(t)
	b.wantHeadThenRest(t, third)
}

// waitPast waits (bounded) until the database's clock is past at.
func (b *recordBundle) waitPast(t *testing.T, at time.Time) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var past bool
		if err := b.pool.QueryRow(b.ctx, `SELECT $1 < now()`, at).Scan(&past); err != nil {
			t.Fatal(err)
		}
		if past {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", at)
		}
	}
}

// headWaitingToRetry enqueues three instructions of p1, fails the first
// (a dead letter) and records the second RETRYABLE, due in an hour: the
// participant's head waits for its retry, the third behind it.
func (b *recordBundle) headWaitingToRetry(t *testing.T) (dead, retried, third uuid.UUID) {
	t.Helper()
	dead = b.enqueue(t, "p1", "k1")
	retried = b.enqueue(t, "p1", "k2")
	third = b.enqueue(t, "p1", "k3")
	b.record(t, recordOutcome(t, b.claimOne(t, "r1", longLease), "r1", store.Failed))
	c := b.claimOne(t, "r1", longLease)
	if c.OutboxID != retried {
		t.Fatalf("claimed %s, want %s", c.OutboxID, retried)
	}
	b.retryIn(t, c, "r1", retryWait)
	b.wantDue(t, retried, "in an hour", false)
	return dead, retried, third
}

// TestReplayKeepsTheRetryTimeOfTheHeadItPutsBehind guards a replay of a
// dead letter whose participant's head waits for its retry: the replayed
// instruction becomes the head and the retry waits behind it, keeping its
// time; when the replayed one is dispatched, or cancelled, the retry is
// due at that time, not at once (it was, and the hand-off claimed it).
func TestReplayKeepsTheRetryTimeOfTheHeadItPutsBehind(t *testing.T) {
	t.Parallel()
	for _, end := range []string{"dispatched", "cancelled"} {
		t.Run(end, func(t *testing.T) {
			t.Parallel()
			b := setupRecord(t)
			dead, retried, third := b.headWaitingToRetry(t)
			b.replay(t, dead)
			b.wantDue(t, dead, "now", false)
			b.wantDue(t, retried, "infinity", true)
			b.verifyOK(t)
			if end == "cancelled" {
				b.cancel(t, dead, true)
			} else {
				c := b.claimOne(t, "r2", longLease)
				if c.OutboxID != dead {
					t.Fatalf("claimed %s, want the replayed %s", c.OutboxID, dead)
				}
				if handed := b.dispatchHandingOff(t, c, "r2"); len(handed) != 0 {
					t.Fatalf("the hand-off claimed %s before its retry time", handed[0].OutboxID)
				}
			}
			b.wantDue(t, retried, "in an hour", false)
			b.wantDue(t, third, "infinity", false)
			b.verifyOK(t)
		})
	}
}

// TestOrderingSwitchKeepsRetryTimes guards `outbox migrate ordering-off`
// and `ordering-on`: switching
// ordering off makes waiting rows due, a retry kept behind a replay at
// its retry time; switching it on again puts rows behind their head, a
// retry among them keeping its time.
func TestOrderingSwitchKeepsRetryTimes(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	dead, retried, third := b.headWaitingToRetry(t)
	b.replay(t, dead)
	if err := b.st.SetOrdered(b.ctx, b.pool, false); err != nil {
		t.Fatal(err)
	}
	b.wantDue(t, dead, "now", false)
	b.wantDue(t, retried, "in an hour", false)
	b.wantDue(t, third, "now", false)
	if err := b.st.SetOrdered(b.ctx, b.pool, true); err != nil {
		t.Fatal(err)
	}
	b.wantDue(t, dead, "now", false)
	b.wantDue(t, retried, "infinity", true)
	b.wantDue(t, third, "infinity", false)
	b.verifyOK(t)
	c := b.claimOne(t, "r2", longLease)
	if handed := b.dispatchHandingOff(t, c, "r2"); c.OutboxID != dead || len(handed) != 0 {
		t.Fatalf("claimed %s and handed off %v, want %s and nothing", c.OutboxID, handed, dead)
	}
	b.wantDue(t, retried, "in an hour", false)
}

// TestVerifyReportsAClaimBeforeItsRetryTime: audit verify's check of
// retry times fails on a retry claimed early (its due time moved by hand,
// as the hand-off did before migration 039).
func TestVerifyReportsAClaimBeforeItsRetryTime(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	_, retried, _ := b.headWaitingToRetry(t)
	if _, err := b.pool.Exec(b.ctx, `UPDATE outbox.pending SET next_attempt_at = now() WHERE outbox_id = $1`, retried); err != nil {
		t.Fatal(err)
	}
	if c := b.claimOne(t, "r2", longLease); c.OutboxID != retried {
		t.Fatalf("claimed %s, want %s", c.OutboxID, retried)
	}
	r, err := b.st.Verify(b.ctx, b.pool, store.VerifyOptions{Ordered: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Violations) != 1 || r.Violations[0].Invariant != 5 ||
		!strings.Contains(r.Violations[0].Detail, "before") || !strings.Contains(r.Violations[0].Detail, retried.String()) {
		t.Fatalf("violations %v, want the early claim of %s", r.Violations, retried)
	}
}

// TestPoisonedReplayKeepsTheRetryTimeBehindIt guards the reaper's
// promotion: a replayed instruction whose relayers keep dying becomes a
// dead letter again (the zombie limit, here 1), and the retry that waited
// behind it is due at its retry time, not at once.
func TestPoisonedReplayKeepsTheRetryTimeBehindIt(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	dead, retried, _ := b.headWaitingToRetry(t)
	b.replay(t, dead)
	for _, wantPoisoned := range []bool{false, true} {
		c := b.claimOne(t, "dies", shortLease)
		if c.OutboxID != dead {
			t.Fatalf("claimed %s, want the replayed %s", c.OutboxID, dead)
		}
		b.waitExpired(t, c)
		reaped, err := b.st.Reap(b.ctx, b.pool, 10, "test-reaper", 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(reaped) != 1 || reaped[0].DeadLettered != wantPoisoned {
			t.Fatalf("reaped %+v, want %s poisoned: %v", reaped, dead, wantPoisoned)
		}
		if !wantPoisoned {
			b.wantDue(t, retried, "infinity", true)
		}
	}
	b.wantDue(t, retried, "in an hour", false)
	b.verifyOK(t)
}

// TestWithdrawnCopyHandsOnAtTheRetryTime guards the withdrawal of a
// reaper's copy by its claim's late outcome (withdraw.go), the one path
// besides an outcome's own hand-off that ends a participant's head: the
// replayed instruction ahead of a retry is reaped and its slow relayer's
// DISPATCHED comes late, withdrawing the copy; the retry behind it is then
// due at its retry time, neither at once nor left waiting.
func TestWithdrawnCopyHandsOnAtTheRetryTime(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	replayed, third, held := b.replayedBehindInFlight(t, "r1", longLease)
	b.retryIn(t, held, "r1", retryWait)
	slow := b.claimOne(t, "slow", shortLease)
	if slow.OutboxID != replayed {
		t.Fatalf("claimed %s, want the replayed %s", slow.OutboxID, replayed)
	}
	b.reap(t, slow)
	rec := b.record(t, recordOutcome(t, slow, "slow", store.Dispatched))
	if !rec[0].Late || !rec[0].Withdrew {
		t.Fatalf("recorded %+v, want late and the copy withdrawn", rec[0])
	}
	b.wantDue(t, held.OutboxID, "in an hour", false)
	b.wantDue(t, third, "infinity", false)
	b.verifyOK(t)
}
