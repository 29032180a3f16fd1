package engine_test

import (
	"context"
	"fmt"
	"time"

	"github.com/ledgerline/outbox/engine"
	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/pending"
	"github.com/ledgerline/outbox/rails"
)

// A relayer dispatching to the in-memory sandbox rail.
func ExampleRelayer() {
	ctx := context.Background()
	pool := testdb.ForExample()

	sandbox := rails.NewSandbox(rails.SandboxOptions{})
	set, err := rails.NewSet(rails.Options{Type: "sandbox", Profile: payment.Generic{}, Transport: sandbox, Timeout: 5 * time.Second})
	if err != nil {
		panic(err)
	}
	if _, err := pending.Enqueue(ctx, pool, pending.Instruction{
		InstructionID: "payout-1", ParticipantID: "merchant-7", IdempotencyKey: "payout-1",
		RailType: "sandbox", AmountMinor: 1250, Currency: "USD", Destination: "acct-42",
	}); err != nil {
		panic(err)
	}

	relayer, err := engine.New(pool, engine.Config{Rails: set})
	if err != nil {
		panic(err)
	}
	if err := relayer.Start(ctx); err != nil {
		panic(err)
	}
	for deadline := time.Now().Add(30 * time.Second); relayer.Stats().Dispatched == 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_ = relayer.Stop(stopCtx)

	fmt.Println("dispatched:", relayer.Stats().Dispatched, "payments made by the rail:", sandbox.Stats().Payments)
	// Output: dispatched: 1 payments made by the rail: 1
}
