package store_test

import (
	"errors"
	"testing"

	"github.com/ledgerline/outbox/internal/store"
)

// TestReplayShownWaitsForAnAcknowledgement: an acknowledgement that holds
// the dead letter's row while ReplayShown runs commits first; the replay,
// which waited for it, sees it and does nothing (ErrDeadLetterChanged), so
// the payment acknowledged as refunded by hand is not sent. Without the
// acknowledgement the same call replays.
func TestReplayShownWaitsForAnAcknowledgement(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	id := b.enqueue(t, "p1", "k1")
	b.record(t, recordOutcome(t, b.claimOne(t, "r1", longLease), "r1", store.Failed))
	dl, err := b.st.DeadLetter(b.ctx, b.pool, id)
	if err != nil || dl == nil {
		t.Fatalf("dead letter: %v %v", dl, err)
	}
	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(b.ctx)
	if ok, err := b.st.Acknowledge(b.ctx, tx, id, "bob", "refunded by hand"); err != nil || !ok {
		t.Fatalf("acknowledge: %v %v", ok, err)
	}
	conn := b.conn(t)
	replayed := make(chan error, 1)
	go func() {
		_, err := b.st.ReplayShown(b.ctx, conn, id, dl.FailedAt, "alice", "customer asked again")
		replayed <- err
	}()
	b.waitBlockedBy(t, conn.Conn().PgConn().PID(), b.backendOf(t, tx), replayed) // the acknowledgement's row lock
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-replayed; !errors.Is(err, store.ErrDeadLetterChanged) {
		t.Fatalf("replay after a concurrent acknowledgement: %v, want ErrDeadLetterChanged", err)
	}
	if dl, err := b.st.DeadLetter(b.ctx, b.pool, id); err != nil || dl == nil || dl.AcknowledgedAt == nil {
		t.Fatalf("the dead letter after the refused replay: %+v %v, want it there, acknowledged", dl, err)
	}

	other := b.enqueue(t, "p2", "k2")
	b.record(t, recordOutcome(t, b.claimOne(t, "r1", longLease), "r1", store.Failed))
	dl, err = b.st.DeadLetter(b.ctx, b.pool, other)
	if err != nil || dl == nil {
		t.Fatalf("dead letter: %v %v", dl, err)
	}
	if ok, err := b.st.ReplayShown(b.ctx, b.pool, other, dl.FailedAt, "alice", "account fixed"); err != nil || !ok {
		t.Fatalf("replay of the dead letter shown: %v %v", ok, err)
	}
}

// TestReplayAsReadOfAnAcknowledgedDeadLetter: a dead letter read
// acknowledged is replayed as read (its acknowledgement is the action it
// had); once replayed it failed again, and the same read no longer
// replays it (ErrDeadLetterChanged, nothing done): the new failure stays a
// dead letter.
func TestReplayAsReadOfAnAcknowledgedDeadLetter(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	id := b.enqueue(t, "p1", "k1")
	b.record(t, recordOutcome(t, b.claimOne(t, "r1", longLease), "r1", store.Failed))
	if ok, err := b.st.Acknowledge(b.ctx, b.pool, id, "bob", "refunded by hand"); err != nil || !ok {
		t.Fatalf("acknowledge: %v %v", ok, err)
	}
	dl, err := b.st.DeadLetter(b.ctx, b.pool, id)
	if err != nil || dl == nil || dl.AcknowledgedAt == nil {
		t.Fatalf("dead letter: %+v %v, want it acknowledged", dl, err)
	}
	if ok, err := b.st.ReplayAsRead(b.ctx, b.pool, *dl, "alice", "refund bounced"); err != nil || !ok {
		t.Fatalf("replay of the acknowledged dead letter as read: %v %v", ok, err)
	}
	b.record(t, recordOutcome(t, b.claimOne(t, "r1", longLease), "r1", store.Failed))
	if ok, err := b.st.ReplayAsRead(b.ctx, b.pool, *dl, "carol", "same read"); ok || !errors.Is(err, store.ErrDeadLetterChanged) {
		t.Fatalf("replay of the same read after it failed again: %v %v, want ErrDeadLetterChanged", ok, err)
	}
	if w := b.where(t, id); !w.dead {
		t.Fatalf("the new failure: %+v, want a dead letter", w)
	}
	got, _ := b.trail(t, id)
	wantTrail(t, got, "DISPATCHING#1", "FAILED#1", "ACKNOWLEDGED#1", "REPLAYED#0", "DISPATCHING#1", "FAILED#1")
	b.verifyOK(t)
}
