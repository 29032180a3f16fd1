package engine

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerline/outbox/pending"
	"github.com/ledgerline/outbox/rails"
)

// TestRecordedAtIsOnTheDatabasesClock: a relayer whose host clock is ten
// minutes off the database's reports each instruction's enqueue-to-outcome
// time (Recorded.RecordedAt - EnqueuedAt, outbox_dispatch_latency_seconds)
// as it was, not ten minutes more or less. EnqueuedAt is the database's
// created_at; RecordedAt was the host's time.Now, so the metric was off by
// the hosts' offset: minutes of latency that never happened for a clock
// ahead, negative observations that hid a real backlog for one behind.
// Both the running relayer's recorder (claims and hand-offs) and RelayOnce
// are checked.
func TestRecordedAtIsOnTheDatabasesClock(t *testing.T) {
	t.Parallel()
	const offset = 10 * time.Minute
	for _, shift := range []time.Duration{offset, -offset} {
		b := setup(t, rails.SandboxOptions{})
		const total = 40
		b.enqueue(t, total, 4) // 4 participants: most are handed off
		var (
			mu        sync.Mutex
			latencies []time.Duration
		)
		cfg := b.config("skewed")
		cfg.OnRecorded = func(recs []Recorded) {
			mu.Lock()
			defer mu.Unlock()
			for _, rec := range recs {
				if rec.Result() == ResultDispatched {
					latencies = append(latencies, rec.RecordedAt.Sub(rec.EnqueuedAt))
				}
			}
		}
		r := b.newRelayer(t, cfg)
		// The host's wall clock, shifted; its monotonic reading dropped,
		// as a clock set apart has none in common with the database.
		r.testHooks.wall = func() time.Time { return time.Now().Add(shift).Round(0) }
		if err := r.Start(b.ctx); err != nil {
			t.Fatal(err)
		}
		b.waitDrained(t, time.Minute)
		mu.Lock()
		got := append([]time.Duration(nil), latencies...)
		mu.Unlock()
		if len(got) != total {
			t.Fatalf("clock %v: %d dispatched outcomes observed, want %d", shift, len(got), total)
		}
		for _, l := range got {
			if l < 0 || l > offset/2 {
				t.Fatalf("clock %v: enqueue to outcome %v, want the time it took (well under %v)", shift, l, offset/2)
			}
		}

		if err := r.Stop(b.ctx); err != nil {
			t.Fatal(err)
		}
		if err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
			_, err := b.producer.EnqueueBatch(b.ctx, tx, []pending.Instruction{instruction(fmt.Sprintf("once%v", shift), 0)})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		once := b.newRelayer(t, b.config("skewed-once"))
		once.testHooks.wall = r.testHooks.wall
		recs, err := once.RelayOnce(b.ctx, b.pool)
		if err != nil || len(recs) != 1 {
			t.Fatalf("clock %v: RelayOnce = %d recorded, %v", shift, len(recs), err)
		}
		if l := recs[0].RecordedAt.Sub(recs[0].EnqueuedAt); l < 0 || l > offset/2 {
			t.Errorf("clock %v: RelayOnce: enqueue to outcome %v, want the time it took", shift, l)
		}
	}
}
