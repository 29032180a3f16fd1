package engine

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/pending"
	"github.com/ledgerline/outbox/rails"
)

// TestASlowRailDoesNotStarveTheOthers: a rail that answers slowly, but
// answers (its breaker stays closed), at its concurrency cap, with a
// backlog older than another rail's work. Claims take the oldest due
// instructions across rails, and before the fix they took the slow
// rail's whatever its cap: every slot of the relayer held one of them,
// waiting for a rail slot, and the other rail's instruction was claimed
// only once the slow rail's whole backlog had been (payments to a healthy
// rail held up for as long as the slow one's backlog lasts). Now a rail
// whose dispatches fill its cap is left out of claims and hand-offs until
// one of them returns, so the other rail's instruction is dispatched
// while the slow rail's backlog still waits.
func TestASlowRailDoesNotStarveTheOthers(t *testing.T) {
	t.Parallel()
	b := setup(t, rails.SandboxOptions{})
	slow := rails.NewSandbox(rails.SandboxOptions{LatencyMin: 200 * time.Millisecond, LatencyMax: 200 * time.Millisecond})
	set, err := rails.NewSet(
		rails.Options{Type: "slow", Profile: payment.Generic{}, Transport: slow, Timeout: 5 * time.Second, MaxConcurrency: 1,
			Breaker: rails.BreakerOptions{Disabled: true}},
		rails.Options{Type: "fast", Profile: payment.Generic{}, Transport: rails.NewSandbox(rails.SandboxOptions{}), Timeout: 5 * time.Second,
			Breaker: rails.BreakerOptions{Disabled: true}})
	if err != nil {
		t.Fatal(err)
	}
	producer, err := pending.NewProducer(pending.Config{Rails: set.Catalog()})
	if err != nil {
		t.Fatal(err)
	}
	const backlog = 30
	ins := func(rail string, i int) pending.Instruction {
		return pending.Instruction{InstructionID: fmt.Sprintf("%s-%d", rail, i), ParticipantID: fmt.Sprintf("%s-p%d", rail, i),
			IdempotencyKey: fmt.Sprintf("%s-k%d", rail, i), RailType: rail, AmountMinor: 100, Currency: "USD", Destination: "acct-1"}
	}
	var batch []pending.Instruction
	for i := range backlog {
		batch = append(batch, ins("slow", i))
	}
	for _, in := range [][]pending.Instruction{batch, {ins("fast", 0)}} {
		if err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
			_, err := producer.EnqueueBatch(b.ctx, tx, in)
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	cfg := b.config("r-slow")
	cfg.Rails, cfg.MaxConcurrency = set, 4
	b.start(t, cfg)

	var fastDone bool
	var slowPending int
	for deadline := time.Now().Add(60 * time.Second); !fastDone; time.Sleep(5 * time.Millisecond) {
		if err := b.pool.QueryRow(b.ctx, `SELECT
			EXISTS (SELECT FROM outbox.attempts WHERE rail_type = 'fast' AND state = 'DISPATCHED'),
			(SELECT count(*) FROM outbox.pending WHERE rail_type = 'slow')`).Scan(&fastDone, &slowPending); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("the fast rail's instruction was never dispatched")
		}
	}
	if slowPending == 0 {
		t.Fatalf("the fast rail's instruction was dispatched only once the slow rail's whole backlog of %d was claimed", backlog)
	}
}
