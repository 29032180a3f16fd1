package payment_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/jacoelho/banking/bic"
	"github.com/jacoelho/banking/iban"
	"github.com/ledgerline/outbox/payment"
)

// requireValidationError fails unless err is a *ValidationError, matching
// ErrValidation, with a field among fields and a reason.
func requireValidationError(t *testing.T, err error, fields ...string) {
	t.Helper()
	var verr *payment.ValidationError
	if !errors.As(err, &verr) || !errors.Is(err, payment.ErrValidation) {
		t.Fatalf("error %v (%T) is not a *ValidationError", err, err)
	}
	if verr.Reason == "" {
		t.Fatalf("error %v has no reason", err)
	}
	for _, f := range fields {
		if verr.Field == f {
			return
		}
	}
	t.Fatalf("error %v names field %q, want one of %q", err, verr.Field, fields)
}

func requireInRange(t *testing.T, v int64) {
	t.Helper()
	if v < -payment.MaxAmountMinor || v > payment.MaxAmountMinor {
		t.Fatalf("%d is outside ±MaxAmountMinor", v)
	}
}

// formatMinor writes minor units as a major-unit decimal with digits
// fractional digits: formatMinor(-5, 2) == "-0.05".
func formatMinor(v int64, digits int) string {
	sign := ""
	if v < 0 {
		sign, v = "-", -v
	}
	s := strconv.FormatInt(v, 10)
	if digits == 0 {
		return sign + s
	}
	if len(s) <= digits {
		s = strings.Repeat("0", digits-len(s)+1) + s
	}
	return sign + s[:len(s)-digits] + "." + s[len(s)-digits:]
}

func FuzzParseAmount(f *testing.F) {
	for _, tc := range parseAmountCases {
		f.Add(tc.in, tc.currency)
	}
	for _, cur := range []string{"JPY", "KWD", "EUR", "DEM", "usd", "XXX", ""} {
		f.Add("12.345", cur)
	}
	f.Fuzz(func(t *testing.T, s, cur string) {
		v, err := payment.ParseAmount(s, cur)
		if err != nil {
			requireValidationError(t, err, payment.FieldAmount, payment.FieldCurrency)
			return
		}
		requireInRange(t, v)
		digits, err := payment.CurrencyDigits(cur)
		if err != nil {
			t.Fatalf("ParseAmount accepted currency %q that CurrencyDigits rejects: %v", cur, err)
		}
		formatted := formatMinor(v, digits)
		back, err := payment.ParseAmount(formatted, cur)
		if err != nil || back != v {
			t.Fatalf("%q %s -> %d -> %q -> %d, %v", s, cur, v, formatted, back, err)
		}
		// Without minor units, major and minor amounts are the same language.
		if digits == 0 {
			if m, err := payment.ParseAmountMinor(s); err != nil || m != v {
				t.Fatalf("%q %s: ParseAmount %d, ParseAmountMinor %d, %v", s, cur, v, m, err)
			}
		}
	})
}

func FuzzParseAmountMinor(f *testing.F) {
	for _, tc := range parseAmountMinorCases {
		f.Add(tc.in)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := payment.ParseAmountMinor(s)
		if err != nil {
			requireValidationError(t, err, payment.FieldAmount)
			return
		}
		requireInRange(t, v)
		formatted := strconv.FormatInt(v, 10)
		if back, err := payment.ParseAmountMinor(formatted); err != nil || back != v {
			t.Fatalf("%q -> %d -> %q -> %d, %v", s, v, formatted, back, err)
		}
		// Plain integers must agree with strconv (which also takes '+').
		if !strings.ContainsAny(s, ".") {
			if want, err := strconv.ParseInt(s, 10, 64); err != nil || want != v {
				t.Fatalf("%q: got %d, strconv says %d, %v", s, v, want, err)
			}
		}
	})
}

// fuzzDestination validates a payment to a fuzzed destination: the
// envelope and money fields are valid, so any error must be a destination
// error. It returns whether the destination was accepted.
func fuzzDestination(t *testing.T, p payment.Profile, currency, dest string) bool {
	t.Helper()
	err := p.Validate(pay("r", 1000, currency, dest))
	if err == nil {
		return true
	}
	requireValidationError(t, err, payment.FieldDestination)
	return false
}

// isPrintableASCII: every accepted bank destination is plain ASCII, so what
// was validated is exactly what the rail receives.
func isPrintableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

func FuzzDestinationACH(f *testing.F) {
	for _, r := range []string{"021000021", "011000015", "026009593", "021000022", "123456789", "000000000", "130000019", "02100002"} {
		f.Add(r + ":123456789")
	}
	f.Add("021000021:1234")
	f.Add("021000021:12345678901234567")
	f.Add("021000021:1234:5678")
	f.Add("021000021")
	f.Add("")
	f.Fuzz(func(t *testing.T, dest string) {
		if !fuzzDestination(t, payment.ACH{}, "USD", dest) {
			return
		}
		routing, account, _ := strings.Cut(dest, ":")
		if len(routing) != 9 || !isDigits(routing) || len(account) < 4 || len(account) > 17 || !isDigits(account) {
			t.Fatalf("accepted %q", dest)
		}
		// Independent oracle for the ABA checksum.
		sum := 0
		for i, w := range []int{3, 7, 1, 3, 7, 1, 3, 7, 1} {
			sum += w * int(routing[i]-'0')
		}
		if sum%10 != 0 {
			t.Fatalf("accepted %q with a bad checksum", dest)
		}
	})
}

func isDigits(s string) bool {
	return s != "" && strings.Trim(s, "0123456789") == ""
}

func FuzzDestinationSEPA(f *testing.F) {
	for _, v := range sepaIBANs {
		f.Add(v, false)
		f.Add(iban.PaperFormat(v)+":DEUTDEFF", true)
	}
	for _, v := range []string{"DE88370400440532013000", "BR1800360305000010009795493C1", "ME25505000012345678951",
		"fr14 2004 1010 0505 0001 3m02 606", "DE89370400440532013000:DEUT1EFF", "NL91ABNA0417164300ı", ""} {
		f.Add(v, false)
	}
	f.Fuzz(func(t *testing.T, dest string, requireBIC bool) {
		if !fuzzDestination(t, payment.SEPA{RequireBIC: requireBIC}, "EUR", dest) {
			return
		}
		if !isPrintableASCII(dest) {
			t.Fatalf("accepted non-ASCII %q", dest)
		}
		acct, code, hasBIC := strings.Cut(dest, ":")
		norm := strings.ToUpper(strings.ReplaceAll(acct, " ", ""))
		if err := iban.Validate(norm); err != nil {
			t.Fatalf("accepted %q: %v", dest, err)
		}
		if sepa, err := iban.IsSEPA(norm); err != nil || !sepa {
			t.Fatalf("accepted non-SEPA %q", dest)
		}
		if requireBIC && !hasBIC {
			t.Fatalf("accepted %q without a BIC", dest)
		}
		if _, err := bic.Parse(strings.ToUpper(code)); hasBIC && err != nil {
			t.Fatalf("accepted BIC in %q: %v", dest, err)
		}
	})
}

func FuzzDestinationWire(f *testing.F) {
	for _, v := range []string{"DEUTDEFF:DE89370400440532013000", "DEUTDEFF500:0532013000", "NWBKGB2L:31926819",
		"deutdeff:1", "DEUT1EFF:123", "DEUTDEF:123", "DEUTDEFF:", "DEUTDEFF", "DEUTDEFF:12-34", ""} {
		f.Add(v)
	}
	f.Fuzz(func(t *testing.T, dest string) {
		if !fuzzDestination(t, payment.Wire{}, "JPY", dest) {
			return
		}
		if !isPrintableASCII(dest) {
			t.Fatalf("accepted non-ASCII %q", dest)
		}
		code, account, _ := strings.Cut(dest, ":")
		if _, err := bic.Parse(strings.ToUpper(code)); err != nil {
			t.Fatalf("accepted BIC in %q: %v", dest, err)
		}
		if len(account) < 1 || len(account) > 34 || strings.ContainsAny(account, ": -") {
			t.Fatalf("accepted account in %q", dest)
		}
	})
}
