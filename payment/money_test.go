package payment_test

import (
	"testing"

	"github.com/ledgerline/outbox/payment"
)

func TestValidateCurrency(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		code, reason string // reason "" means valid
	}{
		{"USD", ""},
		{"EUR", ""},
		{"JPY", ""},
		{"KWD", ""},
		{"CHF", ""},
		{"DEM", payment.ReasonUnknownCurrency}, // replaced by EUR
		{"FRF", payment.ReasonUnknownCurrency},
		{"HRK", payment.ReasonUnknownCurrency}, // Croatia joined the euro in 2023
		{"VEF", payment.ReasonUnknownCurrency}, // replaced by VES
		{"SLL", payment.ReasonUnknownCurrency}, // replaced by SLE
		{"ZWL", payment.ReasonUnknownCurrency}, // replaced by ZWG
		{"XXX", payment.ReasonUnknownCurrency}, // "no currency"
		{"XTS", payment.ReasonUnknownCurrency}, // reserved for testing
		{"XAU", payment.ReasonUnknownCurrency}, // gold
		{"XDR", payment.ReasonUnknownCurrency}, // IMF special drawing right
		// Active fund and accounting codes: valid ISO 4217, but nothing
		// settles in them.
		{"USN", payment.ReasonUnknownCurrency}, // US dollar next day
		{"CLF", payment.ReasonUnknownCurrency}, // Chilean Unidad de Fomento
		{"UYW", payment.ReasonUnknownCurrency}, // Unidad previsional
		{"UYI", payment.ReasonUnknownCurrency}, // Uruguayan indexed units
		{"CHE", payment.ReasonUnknownCurrency}, // WIR euro
		{"CHW", payment.ReasonUnknownCurrency}, // WIR franc
		{"BOV", payment.ReasonUnknownCurrency}, // Bolivian Mvdol
		{"MXV", payment.ReasonUnknownCurrency}, // Mexican Unidad de Inversion
		{"COU", payment.ReasonUnknownCurrency}, // Colombian Unidad de Valor Real
		{"XAD", payment.ReasonUnknownCurrency}, // Arab accounting dinar
		// ... while the settlement currencies they index stay valid.
		{"CLP", ""},
		{"UYU", ""},
		{"MXN", ""},
		{"COP", ""},
		{"BOB", ""},
		{"XOF", ""}, // a real currency despite the X
		{"usd", payment.ReasonUnknownCurrency},
		{"US", payment.ReasonUnknownCurrency},
		{"USDD", payment.ReasonUnknownCurrency},
		{"", payment.ReasonRequired},
	} {
		t.Run(tc.code, func(t *testing.T) {
			t.Parallel()
			field := ""
			if tc.reason != "" {
				field = payment.FieldCurrency
			}
			checkErr(t, payment.ValidateCurrency(tc.code), field, tc.reason)
		})
	}
}

func TestCurrencyDigits(t *testing.T) {
	t.Parallel()
	for code, want := range map[string]int{"USD": 2, "EUR": 2, "JPY": 0, "KWD": 3} {
		if got, err := payment.CurrencyDigits(code); err != nil || got != want {
			t.Errorf("CurrencyDigits(%s) = %d, %v; want %d", code, got, err, want)
		}
	}
	_, err := payment.CurrencyDigits("DEM")
	checkErr(t, err, payment.FieldCurrency, payment.ReasonUnknownCurrency)
}

func TestValidateAmount(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		amount int64
		reason string
	}{
		{1, ""},
		{payment.MaxAmountMinor, ""},
		{0, payment.ReasonNotPositive},
		{-1, payment.ReasonNotPositive},
		{-payment.MaxAmountMinor, payment.ReasonNotPositive},
		{payment.MaxAmountMinor + 1, payment.ReasonOverflow},
	} {
		field := ""
		if tc.reason != "" {
			field = payment.FieldAmount
		}
		checkErr(t, payment.ValidateAmount(tc.amount), field, tc.reason)
	}
}

// amountCase is one parse case; reason "" means the parse succeeds with want.
type amountCase struct {
	in, currency string
	want         int64
	reason       string
}

// parseAmountMinorCases are shared with the fuzz seed corpus.
var parseAmountMinorCases = []amountCase{
	{in: "1250", want: 1250},
	{in: "0", want: 0},
	{in: "-42", want: -42},
	{in: "007", want: 7},
	{in: "10.0", want: 10},
	{in: "10.000", want: 10},
	{in: "9007199254740991", want: payment.MaxAmountMinor},
	{in: "-9007199254740991", want: -payment.MaxAmountMinor},
	{in: "00000000000000000000000001", want: 1}, // leading zeros are not magnitude
	{in: "10.5", reason: payment.ReasonExcessPrecision},
	{in: "10.05", reason: payment.ReasonExcessPrecision},
	{in: "9007199254740992", reason: payment.ReasonOverflow},
	{in: "-9007199254740992", reason: payment.ReasonOverflow},
	{in: "99999999999999999", reason: payment.ReasonOverflow},
	{in: "123456789012345678901234567890", reason: payment.ReasonOverflow},
	{in: "", reason: payment.ReasonRequired},
	{in: "1e3", reason: payment.ReasonInvalid},
	{in: "+5", reason: payment.ReasonInvalid},
	{in: "--1", reason: payment.ReasonInvalid},
	{in: "-", reason: payment.ReasonInvalid},
	{in: "1.", reason: payment.ReasonInvalid},
	{in: ".5", reason: payment.ReasonInvalid},
	{in: "1.2.3", reason: payment.ReasonInvalid},
	{in: " 1", reason: payment.ReasonInvalid},
	{in: "1,000", reason: payment.ReasonInvalid},
	{in: "１２", reason: payment.ReasonInvalid}, // full-width digits
	{in: "0x10", reason: payment.ReasonInvalid},
	{in: "NaN", reason: payment.ReasonInvalid},
}

func TestParseAmountMinor(t *testing.T) {
	t.Parallel()
	for _, tc := range parseAmountMinorCases {
		t.Run(tc.in, func(t *testing.T) {
			t.Parallel()
			got, err := payment.ParseAmountMinor(tc.in)
			if tc.reason == "" {
				checkErr(t, err, "", "")
				if got != tc.want {
					t.Fatalf("ParseAmountMinor(%q) = %d, want %d", tc.in, got, tc.want)
				}
				return
			}
			checkErr(t, err, payment.FieldAmount, tc.reason)
		})
	}
}

// parseAmountCases are shared with the fuzz seed corpus.
var parseAmountCases = []amountCase{
	{in: "12.34", currency: "USD", want: 1234},
	{in: "12.3", currency: "USD", want: 1230},
	{in: "12", currency: "USD", want: 1200},
	{in: "12.340", currency: "USD", want: 1234}, // trailing zeros carry no precision
	{in: "12.34000000000000000000", currency: "USD", want: 1234},
	{in: "0.01", currency: "EUR", want: 1},
	{in: "-0.50", currency: "EUR", want: -50},
	{in: "1500", currency: "JPY", want: 1500},
	{in: "1500.0", currency: "JPY", want: 1500},
	{in: "1.005", currency: "KWD", want: 1005},
	{in: "90071992547409.91", currency: "USD", want: payment.MaxAmountMinor},
	{in: "9007199254740991", currency: "JPY", want: payment.MaxAmountMinor},
	{in: "12.345", currency: "USD", reason: payment.ReasonExcessPrecision},
	{in: "1.5", currency: "JPY", reason: payment.ReasonExcessPrecision},
	{in: "1.0005", currency: "KWD", reason: payment.ReasonExcessPrecision},
	{in: "90071992547409.92", currency: "USD", reason: payment.ReasonOverflow},
	{in: "9007199254740992", currency: "JPY", reason: payment.ReasonOverflow},
	{in: "9007199254740992", currency: "USD", reason: payment.ReasonOverflow},
	{in: "123456789012345678901234567890", currency: "USD", reason: payment.ReasonOverflow},
	{in: "1e3", currency: "USD", reason: payment.ReasonInvalid},
	{in: "+5", currency: "USD", reason: payment.ReasonInvalid},
	{in: "1.", currency: "USD", reason: payment.ReasonInvalid},
	{in: ".5", currency: "USD", reason: payment.ReasonInvalid},
	{in: "--1", currency: "USD", reason: payment.ReasonInvalid},
	{in: "１２", currency: "USD", reason: payment.ReasonInvalid},
	{in: "", currency: "USD", reason: payment.ReasonRequired},
}

func TestParseAmount(t *testing.T) {
	t.Parallel()
	for _, tc := range parseAmountCases {
		t.Run(tc.currency+" "+tc.in, func(t *testing.T) {
			t.Parallel()
			got, err := payment.ParseAmount(tc.in, tc.currency)
			if tc.reason == "" {
				checkErr(t, err, "", "")
				if got != tc.want {
					t.Fatalf("ParseAmount(%q, %s) = %d, want %d", tc.in, tc.currency, got, tc.want)
				}
				return
			}
			checkErr(t, err, payment.FieldAmount, tc.reason)
		})
	}
	t.Run("currency", func(t *testing.T) {
		t.Parallel()
		for _, code := range []string{"DEM", "XXX", "usd"} {
			_, err := payment.ParseAmount("1.00", code)
			checkErr(t, err, payment.FieldCurrency, payment.ReasonUnknownCurrency)
		}
		_, err := payment.ParseAmount("1.00", "")
		checkErr(t, err, payment.FieldCurrency, payment.ReasonRequired)
	})
}
