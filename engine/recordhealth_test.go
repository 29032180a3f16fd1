package engine

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/rails"
)

// TestRecordErrorHoldsWhileOneWriterFails: with two outcome writers, one
// can keep failing (here refused on a participant's lock a producer's
// open transaction holds, again and again) while the other writes every
// other participant's outcomes. Health.RecordError was the last write's
// error whichever writer made it, so each success of the free writer
// cleared it and /readyz flapped between ready and not every few
// milliseconds while the held outcome stayed unrecorded. It now stays
// set while any writer's last try failed, and clears once that writer's
// write succeeds.
func TestRecordErrorHoldsWhileOneWriterFails(t *testing.T) {
	t.Parallel()
	pool := testdb.NewWithConfig(t, func(c *pgxpool.Config) {
		c.MaxConns = 8
		c.ConnConfig.RuntimeParams["lock_timeout"] = "50"
	})
	b := setupOn(t, pool, rails.SandboxOptions{})
	b.enqueueOne(t, "held")
	lock := b.lockParticipant(t, "held")
	cfg := b.config("flap")
	cfg.OutcomeWriters, cfg.FlushSize = 2, 1
	r := b.start(t, cfg)
	waitFor(t, 10*time.Second, "the held participant's write to fail on its lock", func() bool {
		return r.Health().RecordError != nil
	})
	// Free participants' outcomes are written by the other writer while
	// the held one keeps failing: RecordError must not clear.
	cleared := 0
	for i := range 40 {
		b.enqueueOne(t, fmt.Sprintf("free-%d", i))
		time.Sleep(5 * time.Millisecond)
		if r.Health().RecordError == nil {
			cleared++
		}
	}
	if got := r.Stats().Dispatched; got == 0 {
		t.Fatal("no free participant's outcome recorded while the held one failed")
	}
	if cleared > 0 {
		t.Errorf("RecordError read nil %d times of 40 while a writer kept failing", cleared)
	}
	if err := lock.Rollback(b.ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "RecordError cleared once the held outcome is recorded", func() bool {
		return r.Health().RecordError == nil && r.Stats().Dispatched == 41
	})
	b.waitDrained(t, 10*time.Second)
	b.verify(t, true)
}
