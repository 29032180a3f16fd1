package store_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"

	"github.com/ledgerline/outbox/internal/store"
)

// cutOff records c's outcome as a relayer's stop records a call it cut
// off (engine.cutOff): RETRYABLE CUT_OFF_AT_STOP, outcome unknown, no
// attempt counted, due again after delay (the lease's remainder).
func (b *recordBundle) cutOff(t *testing.T, c store.Claimed, delay time.Duration) time.Time {
	t.Helper()
	o := recordOutcome(t, c, "r-1", store.Retryable)
	o.ErrorCode, o.ErrorMessage, o.RailCode = "CUT_OFF_AT_STOP", "rail call cut off by the relayer's stop deadline", ""
	o.CountAttempt, o.OutcomeUnknown, o.RetryDelay = false, true, delay
	b.record(t, o)
	var until time.Time
	if err := b.pool.QueryRow(b.ctx, `SELECT next_attempt_at FROM outbox.attempts WHERE attempt_id = $1`, o.AttemptID).Scan(&until); err != nil {
		t.Fatal(err)
	}
	return until
}

// refusedCancel fails unless a cancel of id is refused as one the rail
// may still act on until until, and wrote nothing: the instruction is
// still pending, its trail and its participant's count unchanged.
func (b *recordBundle) refusedCancel(t *testing.T, id uuid.UUID, until time.Time) {
	t.Helper()
	trailBefore, _ := b.trail(t, id)
	var queuedBefore, queuedAfter int64
	if err := b.pool.QueryRow(b.ctx, `SELECT coalesce(sum(queued), 0) FROM outbox.sequences`).Scan(&queuedBefore); err != nil {
		t.Fatal(err)
	}
	done, err := b.st.Cancel(b.ctx, b.pool, id, "olga", "fraud hold")
	var refusal *store.RailMayStillActError
	if done || !errors.Is(err, store.ErrRailMayStillAct) || !errors.As(err, &refusal) {
		t.Fatalf("cancel during the cut-off window: %v, %v (want ErrRailMayStillAct)", done, err)
	}
	if !refusal.Until.Equal(until) || refusal.OutboxID != id {
		t.Fatalf("refused until %s for %s, want %s for %s", refusal.Until, refusal.OutboxID, until, id)
	}
	if stamp := until.UTC().Format(time.RFC3339Nano); !strings.Contains(err.Error(), stamp) || !strings.Contains(err.Error(), "try again") {
		t.Fatalf("the refusal does not say when to try again (%s): %v", stamp, err)
	}
	if w := b.where(t, id); !w.pending {
		t.Fatal("a refused cancel removed the instruction")
	}
	if trailAfter, _ := b.trail(t, id); strings.Join(trailAfter, ",") != strings.Join(trailBefore, ",") {
		t.Fatalf("a refused cancel archived: %v, was %v", trailAfter, trailBefore)
	}
	if err := b.pool.QueryRow(b.ctx, `SELECT coalesce(sum(queued), 0) FROM outbox.sequences`).Scan(&queuedAfter); err != nil || queuedAfter != queuedBefore {
		t.Fatalf("a refused cancel changed the queued counts: %d, was %d (%v)", queuedAfter, queuedBefore, err)
	}
}

// TestCancelRefusedWhileTheRailMayStillAct: an instruction whose rail call
// a relayer's stop cut off cannot be cancelled until the time its relayer
// recorded for the retry (its claim's lease end), read from the archive:
// moving the pending row's due time (ordering does) changes nothing. The
// refusal is typed, names the time and writes nothing; from that time on
// the cancel goes through. A retry after RAIL_TIMEOUT (its call ran the
// whole rail timeout) is cancelled at once.
func TestCancelRefusedWhileTheRailMayStillAct(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)

	a1 := b.enqueue(t, "p-a", "a1")
	untilA := b.cutOff(t, b.claimOne(t, "r-1", longLease), time.Hour)
	b.refusedCancel(t, a1, untilA)
	// The pending row's due time is not the signal: made due now (as an
	// ordering promotion does) or put off for good (as a demotion behind a
	// replayed lower sequence does), the window still holds.
	for _, due := range []string{"now()", "'infinity'"} {
		if _, err := b.pool.Exec(b.ctx, `UPDATE outbox.pending SET next_attempt_at = `+due+` WHERE outbox_id = $1`, a1); err != nil {
			t.Fatal(err)
		}
		b.refusedCancel(t, a1, untilA)
	}
	if _, err := b.pool.Exec(b.ctx, `UPDATE outbox.pending SET next_attempt_at = $2 WHERE outbox_id = $1`, a1, untilA); err != nil {
		t.Fatal(err)
	}

	// A short window, ended by the database's clock: the cancel succeeds.
	b1 := b.enqueue(t, "p-b", "b1")
	untilB := b.cutOff(t, b.claimOne(t, "r-1", longLease), 1500*time.Millisecond)
	b.refusedCancel(t, b1, untilB)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var over bool
		if err := b.pool.QueryRow(b.ctx, `SELECT $1::timestamptz < now()`, untilB).Scan(&over); err != nil {
			t.Fatal(err)
		}
		if over {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the window did not end")
		}
	}
	b.cancel(t, b1, true)
	got, _ := b.trail(t, b1)
	wantTrail(t, got, "DISPATCHING#1", "RETRYABLE#1", "CANCELLED#1") // the cut-off call counted no attempt

	// A retry after a rail timeout: not refused.
	c1 := b.enqueue(t, "p-c", "c1")
	o := recordOutcome(t, b.claimOne(t, "r-1", longLease), "r-1", store.Retryable)
	o.ErrorCode, o.OutcomeUnknown, o.RetryDelay = "RAIL_TIMEOUT", true, time.Hour
	b.record(t, o)
	b.cancel(t, c1, true)
	b.verifyOK(t)
}
