package rails_test

import (
	"testing"

	"github.com/ledgerline/outbox/rails"
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
		{"DEM", rails.ReasonUnknownCurrency}, // replaced by EUR
		{"FRF", rails.ReasonUnknownCurrency},
		{"HRK", rails.ReasonUnknownCurrency}, // Croatia joined the euro in 2023
		{"VEF", rails.ReasonUnknownCurrency}, // replaced by VES
		{"SLL", rails.ReasonUnknownCurrency}, // replaced by SLE
		{"ZWL", rails.ReasonUnknownCurrency}, // replaced by ZWG
		{"XXX", rails.ReasonUnknownCurrency}, // "no currency"
		{"XTS", rails.ReasonUnknownCurrency}, // reserved for testing
		{"XAU", rails.ReasonUnknownCurrency}, // gold
		{"XDR", rails.ReasonUnknownCurrency}, // IMF special drawing right
		// Active fund and accounting codes: valid ISO 4217, but nothing
		// settles in them.
		{"USN", rails.ReasonUnknownCurrency}, // US dollar next day
		{"CLF", rails.ReasonUnknownCurrency}, // Chilean Unidad de Fomento
		{"UYW", rails.ReasonUnknownCurrency}, // Unidad previsional
		{"UYI", rails.ReasonUnknownCurrency}, // Uruguayan indexed units
		{"CHE", rails.ReasonUnknownCurrency}, // WIR euro
		{"CHW", rails.ReasonUnknownCurrency}, // WIR franc
		{"BOV", rails.ReasonUnknownCurrency}, // Bolivian Mvdol
		{"MXV", rails.ReasonUnknownCurrency}, // Mexican Unidad de Inversion
		{"COU", rails.ReasonUnknownCurrency}, // Colombian Unidad de Valor Real
		{"XAD", rails.ReasonUnknownCurrency}, // Arab accounting dinar
		// ... while the settlement currencies they index stay valid.
		{"CLP", ""},
		{"UYU", ""},
		{"MXN", ""},
		{"COP", ""},
		{"BOB", ""},
		{"XOF", ""}, // a real currency despite the X
		{"usd", rails.ReasonUnknownCurrency},
		{"US", rails.ReasonUnknownCurrency},
		{"USDD", rails.ReasonUnknownCurrency},
		{"", rails.ReasonRequired},
	} {
		t.Run(tc.code, func(t *testing.T) {
			t.Parallel()
			field := ""
			if tc.reason != "" {
				field = rails.FieldCurrency
			}
			checkErr(t, rails.ValidateCurrency(tc.code), field, tc.reason)
		})
	}
}

func TestCurrencyDigits(t *testing.T) {
	t.Parallel()
	for code, want := range map[string]int{"USD": 2, "EUR": 2, "JPY": 0, "KWD": 3} {
		if got, err := rails.CurrencyDigits(code); err != nil || got != want {
			t.Errorf("CurrencyDigits(%s) = %d, %v; want %d", code, got, err, want)
		}
	}
	_, err := rails.CurrencyDigits("DEM")
	checkErr(t, err, rails.FieldCurrency, rails.ReasonUnknownCurrency)
}

func TestValidateAmount(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		amount int64
		reason string
	}{
		{1, ""},
		{rails.MaxAmountMinor, ""},
		{0, rails.ReasonNotPositive},
		{-1, rails.ReasonNotPositive},
		{-rails.MaxAmountMinor, rails.ReasonNotPositive},
		{rails.MaxAmountMinor + 1, rails.ReasonOverflow},
	} {
		field := ""
		if tc.reason != "" {
			field = rails.FieldAmount
		}
		checkErr(t, rails.ValidateAmount(tc.amount), field, tc.reason)
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
	{in: "9007199254740991", want: rails.MaxAmountMinor},
	{in: "-9007199254740991", want: -rails.MaxAmountMinor},
	{in: "00000000000000000000000001", want: 1}, // leading zeros are not magnitude
	{in: "10.5", reason: rails.ReasonExcessPrecision},
	{in: "10.05", reason: rails.ReasonExcessPrecision},
	{in: "9007199254740992", reason: rails.ReasonOverflow},
	{in: "-9007199254740992", reason: rails.ReasonOverflow},
	{in: "99999999999999999", reason: rails.ReasonOverflow},
	{in: "123456789012345678901234567890", reason: rails.ReasonOverflow},
	{in: "", reason: rails.ReasonRequired},
	{in: "1e3", reason: rails.ReasonInvalid},
	{in: "+5", reason: rails.ReasonInvalid},
	{in: "--1", reason: rails.ReasonInvalid},
	{in: "-", reason: rails.ReasonInvalid},
	{in: "1.", reason: rails.ReasonInvalid},
	{in: ".5", reason: rails.ReasonInvalid},
	{in: "1.2.3", reason: rails.ReasonInvalid},
	{in: " 1", reason: rails.ReasonInvalid},
	{in: "1,000", reason: rails.ReasonInvalid},
	{in: "１２", reason: rails.ReasonInvalid}, // full-width digits
	{in: "0x10", reason: rails.ReasonInvalid},
	{in: "NaN", reason: rails.ReasonInvalid},
}

func TestParseAmountMinor(t *testing.T) {
	t.Parallel()
	for _, tc := range parseAmountMinorCases {
		t.Run(tc.in, func(t *testing.T) {
			t.Parallel()
			got, err := rails.ParseAmountMinor(tc.in)
			if tc.reason == "" {
				checkErr(t, err, "", "")
				if got != tc.want {
					t.Fatalf("ParseAmountMinor(%q) = %d, want %d", tc.in, got, tc.want)
				}
				return
			}
			checkErr(t, err, rails.FieldAmount, tc.reason)
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
	{in: "90071992547409.91", currency: "USD", want: rails.MaxAmountMinor},
	{in: "9007199254740991", currency: "JPY", want: rails.MaxAmountMinor},
	{in: "12.345", currency: "USD", reason: rails.ReasonExcessPrecision},
	{in: "1.5", currency: "JPY", reason: rails.ReasonExcessPrecision},
	{in: "1.0005", currency: "KWD", reason: rails.ReasonExcessPrecision},
	{in: "90071992547409.92", currency: "USD", reason: rails.ReasonOverflow},
	{in: "9007199254740992", currency: "JPY", reason: rails.ReasonOverflow},
	{in: "9007199254740992", currency: "USD", reason: rails.ReasonOverflow},
	{in: "123456789012345678901234567890", currency: "USD", reason: rails.ReasonOverflow},
	{in: "1e3", currency: "USD", reason: rails.ReasonInvalid},
	{in: "+5", currency: "USD", reason: rails.ReasonInvalid},
	{in: "1.", currency: "USD", reason: rails.ReasonInvalid},
	{in: ".5", currency: "USD", reason: rails.ReasonInvalid},
	{in: "--1", currency: "USD", reason: rails.ReasonInvalid},
	{in: "１２", currency: "USD", reason: rails.ReasonInvalid},
	{in: "", currency: "USD", reason: rails.ReasonRequired},
}

func TestParseAmount(t *testing.T) {
	t.Parallel()
	for _, tc := range parseAmountCases {
		t.Run(tc.currency+" "+tc.in, func(t *testing.T) {
			t.Parallel()
			got, err := rails.ParseAmount(tc.in, tc.currency)
			if tc.reason == "" {
				checkErr(t, err, "", "")
				if got != tc.want {
					t.Fatalf("ParseAmount(%q, %s) = %d, want %d", tc.in, tc.currency, got, tc.want)
				}
				return
			}
			checkErr(t, err, rails.FieldAmount, tc.reason)
		})
	}
	t.Run("currency", func(t *testing.T) {
		t.Parallel()
		for _, code := range []string{"DEM", "XXX", "usd"} {
			_, err := rails.ParseAmount("1.00", code)
			checkErr(t, err, rails.FieldCurrency, rails.ReasonUnknownCurrency)
		}
		_, err := rails.ParseAmount("1.00", "")
		checkErr(t, err, rails.FieldCurrency, rails.ReasonRequired)
	})
}
