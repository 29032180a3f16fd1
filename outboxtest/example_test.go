package outboxtest_test

import (
	"cmp"
	"context"
	"fmt"
	"testing"

	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/outboxtest"
	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/pending"
	"github.com/ledgerline/outbox/rails"
)

// A service's test asserts that its code enqueued the payout, inside the
// test's transaction, and sees what the rail would be sent.
func Example() {
	ctx := context.Background()
	var t testing.TB = exampleT{} // in a real test: the *testing.T
	pool := testdb.ForExample()
	tx, err := pool.Begin(ctx)
	if err != nil {
		panic(err)
	}
	defer tx.Rollback(ctx) // the test leaves nothing behind

	// The code under test.
	if _, err := pending.Enqueue(ctx, tx, pending.Instruction{
		InstructionID: "payout-7", ParticipantID: "merchant-42", IdempotencyKey: "payout-7",
		RailType: "sandbox", AmountMinor: 1250, Currency: "USD", Destination: "acct-42",
	}); err != nil {
		panic(err)
	}

	got := outboxtest.RequireEnqueued(ctx, t, tx, outboxtest.Want{InstructionID: "payout-7", AmountMinor: 1250, Currency: "USD"})
	fmt.Println("enqueued:", got.ParticipantID, got.SequenceID, got.Destination)

	recorded := outboxtest.RelayOnce(ctx, t, tx, outboxtest.Relay{
		Transport: outboxtest.TransportFunc(func(_ context.Context, ins payment.Instruction) (rails.Result, error) {
			fmt.Println("rail called with key", ins.IdempotencyKey)
			return rails.Result{Code: "OK", Reference: "psp-1"}, nil
		}),
	})
	fmt.Println("outcome:", recorded[0].Result(), recorded[0].RailReference)
	// Output:
	// enqueued: merchant-42 1 acct-42
	// rail called with key payout-7
	// outcome: dispatched psp-1
}

// exampleT stands in for the test's *testing.T in this runnable example.
type exampleT struct{ testing.TB }

func (exampleT) Helper()                      {}
func (exampleT) Fatalf(f string, args ...any) { panic(fmt.Sprintf(f, args...)) }

// With ordering on, a relay pass sends at most one instruction per
// participant; Drain makes passes until nothing is due, so a test sees a
// participant's whole queue sent, in sequence order, and what each
// answer recorded.
func ExampleDrain() {
	ctx := context.Background()
	var t testing.TB = exampleT{} // in a real test: the *testing.T
	pool := testdb.ForExample()
	tx, err := pool.Begin(ctx)
	if err != nil {
		panic(err)
	}
	defer tx.Rollback(ctx)

	for i, amount := range []int64{500, 99_999_00, 700} {
		key := fmt.Sprintf("payout-%d", i+1)
		if _, err := pending.Enqueue(ctx, tx, pending.Instruction{
			InstructionID: key, ParticipantID: "merchant-42", IdempotencyKey: key,
			RailType: "sandbox", AmountMinor: amount, Currency: "USD", Destination: "acct-42",
		}); err != nil {
			panic(err)
		}
	}

	// A fake rail that declines large payouts.
	rail := outboxtest.TransportFunc(func(_ context.Context, ins payment.Instruction) (rails.Result, error) {
		if ins.Payment.AmountMinor > 1_000_00 {
			return rails.Result{Code: "DECLINED"}, nil
		}
		return rails.Result{Code: "OK"}, nil
	})
	recorded := outboxtest.Drain(ctx, t, tx, outboxtest.Relay{
		Transport: rail,
		Codes: rails.CodeTable{
			"OK":       {Outcome: rails.Dispatched},
			"DECLINED": {Outcome: rails.Failed, Error: rails.CodeRailRejected},
		},
	})
	for _, r := range recorded {
		fmt.Printf("%s %s %s\n", r.IdempotencyKey, r.Result(), cmp.Or(r.ErrorCode, "-"))
	}
	outboxtest.RequireNotEnqueued(ctx, t, tx, outboxtest.Want{ParticipantID: "merchant-42"})
	// Output:
	// payout-1 dispatched -
	// payout-2 dead RAIL_REJECTED
	// payout-3 dispatched -
}

// A test requires exactly the instructions its code enqueued for a
// merchant, in the order the relayer will send them: a payout the code
// forgot, one too many, or two swapped fail it, line by line.
func ExampleRequireManyEnqueued() {
	ctx := context.Background()
	var t testing.TB = exampleT{} // in a real test: the *testing.T
	pool := testdb.ForExample()
	tx, err := pool.Begin(ctx)
	if err != nil {
		panic(err)
	}
	defer tx.Rollback(ctx)

	// The code under test: a refund, then the corrected payout.
	for _, in := range []pending.Instruction{
		{InstructionID: "refund-3", ParticipantID: "merchant-42", IdempotencyKey: "refund-3",
			RailType: "sandbox", AmountMinor: 1250, Currency: "USD", Destination: "acct-42"},
		{InstructionID: "payout-4", ParticipantID: "merchant-42", IdempotencyKey: "payout-4",
			RailType: "sandbox", AmountMinor: 990, Currency: "USD", Destination: "acct-42"},
	} {
		if _, err := pending.Enqueue(ctx, tx, in); err != nil {
			panic(err)
		}
	}

	got := outboxtest.RequireManyEnqueued(ctx, t, tx, outboxtest.Participant{ParticipantID: "merchant-42"},
		outboxtest.Want{InstructionID: "refund-3", AmountMinor: 1250},
		outboxtest.Want{InstructionID: "payout-4", AmountMinor: 990},
	)
	for _, e := range got {
		fmt.Println(e.SequenceID, e.InstructionID, e.AmountMinor)
	}
	// Output:
	// 1 refund-3 1250
	// 2 payout-4 990
}
