package attempts_test

import (
	"context"
	"fmt"

	"github.com/ledgerline/outbox/attempts"
	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/pending"
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
