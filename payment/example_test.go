package payment_test

import (
	"errors"
	"fmt"

	"github.com/ledgerline/outbox/payment"
)

// A producer turns a decimal amount typed in major units into integer minor
// units of its currency: never a float, and a digit the currency does not
// have is refused rather than rounded away.
func ExampleParseAmount() {
	cents, err := payment.ParseAmount("12.34", "USD")
	fmt.Println(cents, err)
	yen, err := payment.ParseAmount("1250", "JPY")
	fmt.Println(yen, err)

	_, err = payment.ParseAmount("12.345", "USD")
	var verr *payment.ValidationError
	if errors.As(err, &verr) {
		fmt.Println(verr.Field, verr.Reason)
	}
	// Output:
	// 1234 <nil>
	// 1250 <nil>
	// amount_minor excess_precision
}

// A rail's profile validates an instruction before anything is written or
// sent; the error names the field at fault, as the JSON input spells it,
// and is payment.ErrValidation for errors.Is.
func ExampleProfileByName() {
	sepa, err := payment.ProfileByName("sepa", payment.Limits{}, payment.ProfileOptions{})
	if err != nil {
		fmt.Println(err)
		return
	}
	ins := payment.Instruction{
		InstructionID:  "payout-1",
		ParticipantID:  "merchant-7",
		IdempotencyKey: "payouts:payout-1",
		RailType:       "sepa",
		Payment:        &payment.Payment{AmountMinor: 1250, Currency: "EUR", Destination: "DE89 3704 0044 0532 0130 00"},
	}
	fmt.Println(sepa.Validate(ins))

	ins.Payment.Destination = "DE89 3704 0044 0532 0130 01" // one digit off
	err = sepa.Validate(ins)
	var verr *payment.ValidationError
	if errors.As(err, &verr) {
		fmt.Println(errors.Is(err, payment.ErrValidation), verr.Field, verr.Reason)
	}
	// Output:
	// <nil>
	// true destination checksum
}
