package outboxtest_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/outboxtest"
	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/pending"
	"github.com/ledgerline/outbox/rails"
)

// TestDrainOnAPoolSendsARetriedInstructionOnce: an instruction answered
// "try again later" is retried after a backoff drawn at random, and Drain
// does not wait for it. On a pool (each pass its own transaction, its own
// now()), a draw near zero made the instruction due again within the same
// Drain, which sent it a second time: a test asserting one outcome per
// instruction failed now and then (with 300 such instructions, in most
// runs). A Drain sends each instruction at most once per retry it makes
// due, so here exactly once.
func TestDrainOnAPoolSendsARetriedInstructionOnce(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := testdb.New(t)
	const n = 300
	ins := make([]pending.Instruction, n)
	for i := range ins {
		ins[i] = payout(fmt.Sprintf("r%d", i), fmt.Sprintf("p%d", i), 10)
	}
	if _, err := pending.EnqueueBatch(ctx, pool, ins); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	sent := map[string]int{}
	busy := outboxtest.TransportFunc(func(_ context.Context, in payment.Instruction) (rails.Result, error) {
		mu.Lock()
		defer mu.Unlock()
		sent[in.IdempotencyKey]++
		return rails.Result{Code: "BUSY"}, nil
	})
	recorded := outboxtest.Drain(ctx, t, pool, outboxtest.Relay{Transport: busy,
		Codes: rails.CodeTable{"BUSY": {Outcome: rails.Retryable}}})
	if len(recorded) != n {
		t.Errorf("%d outcomes for %d instructions each sent once", len(recorded), n)
	}
	for key, k := range sent {
		if k != 1 {
			t.Errorf("%s sent %d times by one Drain", key, k)
		}
	}
}
