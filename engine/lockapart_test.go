package engine

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/rails"
)

// TestWriteRefusedOnOneLockRecordsTheOthers: one outcome write holds the
// outcomes of two participants, one of whose sequences rows a producer's
// open transaction holds. The write waits for the lock up to the
// relayer's lock_timeout (5 s by default) and is refused (55P03). Before
// the fix the whole batch was sent again, and refused again, for as long
// as the lock was held: the other participant's outcome too, past its
// lease (the reaper requeued it and it was sent a second time). Now a
// batch refused on a lock is written participant by participant: the
// free one's outcome is recorded while the lock is held, and the held
// one's once it is gone.
func TestWriteRefusedOnOneLockRecordsTheOthers(t *testing.T) {
	t.Parallel()
	pool := testdb.NewWithConfig(t, func(c *pgxpool.Config) {
		c.MaxConns = 8
		c.ConnConfig.RuntimeParams["lock_timeout"] = "100"
	})
	b := setupOn(t, pool, rails.SandboxOptions{})
	b.enqueueOne(t, "held")
	b.enqueueOne(t, "free")
	lock := b.lockParticipant(t, "held")

	r, err := New(b.pool, b.config("apart"))
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.New("")
	if err != nil {
		t.Fatal(err)
	}
	claimed, err := st.Claim(b.ctx, b.pool, store.ClaimParams{RelayerID: "apart", Limit: 2, Leases: map[string]time.Duration{"sandbox": time.Hour}})
	if err != nil || len(claimed) != 2 {
		t.Fatalf("claimed %d (%v), want 2", len(claimed), err)
	}
	// The held participant's outcome first, as a write would have it.
	if claimed[0].ParticipantID != "held" {
		claimed[0], claimed[1] = claimed[1], claimed[0]
	}
	ru := r.newRun()
	defer ru.rec.abandon()
	if err := ru.slots.Acquire(b.ctx, 2); err != nil {
		t.Fatal(err)
	}
	batch := make([]pendingOutcome, len(claimed))
	for i, c := range claimed {
		batch[i] = pendingOutcome{Outcome: r.outcome(c, rails.Decision{Outcome: rails.Dispatched, RailCalled: true, Answered: true}, time.Millisecond)}
	}
	w := <-ru.rec.writers
	done := make(chan struct{})
	go func() {
		defer close(done)
		ru.rec.flushChunk(w, batch, false, 0)
	}()
	dispatched := func(participant string) bool {
		var n int
		if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox.attempts WHERE participant_id = $1 AND state = 'DISPATCHED'`,
			participant).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	}
	waitFor(t, 10*time.Second, "the free participant's outcome recorded while the other's lock is held", func() bool { return dispatched("free") })
	if dispatched("held") {
		t.Fatal("the held participant's outcome was recorded while its lock was held")
	}
	if err := lock.Rollback(b.ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the write did not end once the lock was gone")
	}
	if !dispatched("held") {
		t.Fatal("the held participant's outcome was not recorded once its lock was gone")
	}
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	if err := ru.slots.Acquire(ctx, int64(ru.cfg.MaxConcurrency)); err != nil {
		t.Fatalf("the write did not give back its slots: %v", err)
	}
	b.verify(t, true)
}
