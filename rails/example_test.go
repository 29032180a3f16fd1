package rails_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/rails"
)

func ExampleParseAmount() {
	for _, in := range []struct{ amount, currency string }{
		{"12.34", "USD"},
		{"12.340", "USD"}, // trailing zeros carry no precision
		{"1500", "JPY"},
		{"1.005", "KWD"},
		{"12.345", "USD"}, // a fraction of a cent
		{"1e3", "USD"},
	} {
		minor, err := payment.ParseAmount(in.amount, in.currency)
		if err != nil {
			var verr *payment.ValidationError
			errors.As(err, &verr)
			fmt.Println(in.amount, in.currency, "->", verr.Reason)
			continue
		}
		fmt.Println(in.amount, in.currency, "->", minor)
	}
	// Output:
	// 12.34 USD -> 1234
	// 12.340 USD -> 1234
	// 1500 JPY -> 1500
	// 1.005 KWD -> 1005
	// 12.345 USD -> excess_precision
	// 1e3 USD -> invalid
}

func ExampleCatalog_Validate() {
	catalog := payment.Catalog{"ach": payment.ACH{}}
	ins := payment.Instruction{
		InstructionID:  "inv-2024-0001",
		ParticipantID:  "acme",
		IdempotencyKey: "inv-2024-0001/1",
		RailType:       "ach",
		Payment:        &payment.Payment{AmountMinor: 125_00, Currency: "USD", Destination: "021000021:123456789"},
	}
	fmt.Println(catalog.Validate(ins))

	ins.Payment.Destination = "021000022:123456789" // one digit off
	var verr *payment.ValidationError
	if errors.As(catalog.Validate(ins), &verr) {
		fmt.Println(verr.Field, verr.Reason)
	}
	// Output:
	// <nil>
	// destination checksum
}

func ExampleCodeTable_Decide() {
	table := rails.SandboxCodes
	for _, res := range []rails.Result{
		{Code: rails.SandboxAccepted, Reference: "sbx_1"},
		{Code: rails.SandboxRejected},
		{Code: "ON_HOLD"}, // not in the table: retried, and flagged
	} {
		d := table.Decide(res, nil)
		if d.ErrorCode == "" { // a dispatched payment carries no error code
			fmt.Println(res.Code, d.Outcome, d.Reference)
			continue
		}
		fmt.Println(res.Code, d.Outcome, d.ErrorCode)
	}
	// No answer at all: the rail may have acted, so it is retried with the
	// same idempotency key.
	d := table.Decide(rails.Result{}, context.DeadlineExceeded)
	fmt.Println(d.Outcome, d.ErrorCode)
	// Output:
	// ACCEPTED DISPATCHED sbx_1
	// REJECTED FAILED RAIL_REJECTED
	// ON_HOLD RETRYABLE UNKNOWN_RAIL_CODE
	// RETRYABLE RAIL_TIMEOUT
}
