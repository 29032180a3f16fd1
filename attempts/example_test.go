package attempts_test

import (
	"context"
	"fmt"
	"time"

	"github.com/ledgerline/outbox/attempts"
	"github.com/ledgerline/outbox/engine"
	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/pending"
	"github.com/ledgerline/outbox/rails"
)

// Verify checks the invariants (docs/architecture.md) by query, in one snapshot.
func ExampleArchive_Verify() {
	ctx := context.Background()
	pool := testdb.ForExample()
	if _, err := pending.Enqueue(ctx, pool, pending.Instruction{
		InstructionID: "payout-1", ParticipantID: "merchant-7", IdempotencyKey: "payout-1",
		RailType: "sandbox", AmountMinor: 1250, Currency: "USD", Destination: "acct-42",
	}); err != nil {
		panic(err)
	}
	archive, _ := attempts.New("")
	report, err := archive.Verify(ctx, pool, attempts.VerifyOptions{Ordered: true})
	if err != nil {
		panic(err)
	}
	fmt.Println("instructions:", report.Instructions, "pending:", report.Pending, "ok:", report.OK())
	// Output: instructions: 1 pending: 1 ok: true
}

// DeadLettersAfter walks the dead letters a page at a time, however many
// an outage left: each page starts after the last dead letter of the one
// before.
func ExampleArchive_DeadLettersAfter() {
	ctx := context.Background()
	pool := testdb.ForExample()
	for i := range 5 {
		if _, err := pending.Enqueue(ctx, pool, pending.Instruction{
			InstructionID: fmt.Sprintf("payout-%d", i), ParticipantID: fmt.Sprintf("merchant-%d", i),
			IdempotencyKey: fmt.Sprintf("payout-%d", i), RailType: "sandbox", AmountMinor: 1250, Currency: "USD",
			Destination: "acct-42",
		}); err != nil {
			panic(err)
		}
	}
	// A rail that rejects every payment: five dead letters.
	set, err := rails.NewSet(rails.Options{Type: "sandbox", Profile: payment.Generic{},
		Transport: rails.NewSandbox(rails.SandboxOptions{TerminalRate: 1}), Timeout: time.Second})
	if err != nil {
		panic(err)
	}
	relayer, err := engine.New(nil, engine.Config{Rails: set, RelayerID: "example"})
	if err != nil {
		panic(err)
	}
	if _, err := relayer.RelayOnce(ctx, pool); err != nil {
		panic(err)
	}

	archive, _ := attempts.New("")
	const pageSize = 2
	var last *attempts.DeadLetter
	for page := 1; ; page++ {
		dls, err := archive.DeadLettersAfter(ctx, pool, false, last, pageSize)
		if err != nil {
			panic(err)
		}
		for _, d := range dls {
			fmt.Println("page", page, d.InstructionID, d.ErrorCode)
		}
		if len(dls) < pageSize {
			break
		}
		last = &dls[len(dls)-1]
	}
	// Output:
	// page 1 payout-0 RAIL_REJECTED
	// page 1 payout-1 RAIL_REJECTED
	// page 2 payout-2 RAIL_REJECTED
	// page 2 payout-3 RAIL_REJECTED
	// page 3 payout-4 RAIL_REJECTED
}
