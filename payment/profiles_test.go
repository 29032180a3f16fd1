package payment_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/ledgerline/outbox/payment"
)

// instruction returns a valid envelope for rail carrying p.
func instruction(rail string, p *payment.Payment) payment.Instruction {
	return payment.Instruction{
		InstructionID:  "ins-1",
		ParticipantID:  "acme",
		IdempotencyKey: "key-1",
		RailType:       rail,
		Payment:        p,
	}
}

// pay returns an instruction paying amount of currency to dest.
func pay(rail string, amount int64, currency, dest string) payment.Instruction {
	return instruction(rail, &payment.Payment{AmountMinor: amount, Currency: currency, Destination: dest})
}

// checkErr asserts err is nil when field is empty, and otherwise a
// *ValidationError matching ErrValidation with that field and reason.
func checkErr(t *testing.T, err error, field, reason string) {
	t.Helper()
	if field == "" {
		if err != nil {
			t.Fatalf("unexpected error: %v", err)
		}
		return
	}
	if !errors.Is(err, payment.ErrValidation) {
		t.Fatalf("error %v does not match ErrValidation", err)
	}
	var verr *payment.ValidationError
	if !errors.As(err, &verr) {
		t.Fatalf("error %v is not a *ValidationError", err)
	}
	if verr.Field != field || verr.Reason != reason {
		t.Fatalf("got field %q reason %q, want %q %q (%v)", verr.Field, verr.Reason, field, reason, err)
	}
}

func TestValidateABA(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		routing, reason string // reason "" means valid
	}{
		{"021000021", ""}, // JPMorgan Chase, New York
		{"011000015", ""}, // Federal Reserve Bank of Boston
		{"026009593", ""}, // Bank of America
		{"322271627", ""}, // Chase, California: thrift range 21–32
		{"800000019", ""}, // traveller's cheques prefix 80
		{"720000018", ""}, // electronic range 61–72, upper end
		{"021000022", payment.ReasonChecksum},
		{"123456789", payment.ReasonChecksum},
		{"026009594", payment.ReasonChecksum},
		{"02100002", payment.ReasonInvalid},   // 8 digits
		{"0210000210", payment.ReasonInvalid}, // 10 digits
		{"", payment.ReasonInvalid},
		{"02100002A", payment.ReasonInvalid},
		{"-21000021", payment.ReasonInvalid},
		{"０21000021", payment.ReasonInvalid}, // full-width zero
		{"000000000", payment.ReasonInvalid}, // placeholder; passes the checksum
		{"130000019", payment.ReasonInvalid}, // prefix 13, valid checksum
		{"200000017", payment.ReasonInvalid}, // prefix 20
		{"330000013", payment.ReasonInvalid}, // prefix 33
		{"600000015", payment.ReasonInvalid}, // prefix 60
		{"730000011", payment.ReasonInvalid}, // prefix 73
		{"810000012", payment.ReasonInvalid}, // prefix 81
		{"990000013", payment.ReasonInvalid}, // prefix 99
	} {
		field := ""
		if tc.reason != "" {
			field = payment.FieldDestination
		}
		t.Run(tc.routing, func(t *testing.T) {
			t.Parallel()
			checkErr(t, payment.ValidateABA(tc.routing), field, tc.reason)
		})
	}
}

func TestACH(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		limits   payment.Limits
		currency string
		dest     string
		field    string
		reason   string
	}{
		{"chase", payment.Limits{}, "USD", "021000021:123456789", "", ""},
		{"min account", payment.Limits{}, "USD", "011000015:1234", "", ""},
		{"max account", payment.Limits{}, "USD", "026009593:12345678901234567", "", ""},
		{"EUR not by default", payment.Limits{}, "EUR", "021000021:123456789", payment.FieldCurrency, payment.ReasonCurrencyNotAllowed},
		{"CAD when configured", payment.Limits{Currencies: []string{"USD", "CAD"}}, "CAD", "021000021:123456789", "", ""},
		{"USD not configured", payment.Limits{Currencies: []string{"CAD"}}, "USD", "021000021:123456789", payment.FieldCurrency, payment.ReasonCurrencyNotAllowed},
		{"checksum", payment.Limits{}, "USD", "021000022:123456789", payment.FieldDestination, payment.ReasonChecksum},
		{"no separator", payment.Limits{}, "USD", "021000021123456789", payment.FieldDestination, payment.ReasonInvalid},
		{"account too short", payment.Limits{}, "USD", "021000021:123", payment.FieldDestination, payment.ReasonInvalid},
		{"account too long", payment.Limits{}, "USD", "021000021:123456789012345678", payment.FieldDestination, payment.ReasonInvalid},
		{"account letters", payment.Limits{}, "USD", "021000021:12345678X", payment.FieldDestination, payment.ReasonInvalid},
		{"account spaces", payment.Limits{}, "USD", "021000021:1234 5678", payment.FieldDestination, payment.ReasonInvalid},
		{"second separator", payment.Limits{}, "USD", "021000021:1234:5678", payment.FieldDestination, payment.ReasonInvalid},
		{"empty", payment.Limits{}, "USD", "", payment.FieldDestination, payment.ReasonRequired},
		{"control character", payment.Limits{}, "USD", "021000021:1234\n5678", payment.FieldDestination, payment.ReasonInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := payment.ACH{Limits: tc.limits}
			if !p.MovesMoney() {
				t.Fatal("ACH must move money")
			}
			checkErr(t, p.Validate(pay("ach", 1250, tc.currency, tc.dest)), tc.field, tc.reason)
		})
	}
}

// Real IBANs from the SWIFT registry examples and bank publications.
var sepaIBANs = []string{
	"DE89370400440532013000",
	"FR1420041010050500013M02606",
	"ES9121000418450200051332",
	"NL91ABNA0417164300",
	"IT60X0542811101000000123456",
	"BE68539007547034",
	"AT611904300234573201",
	"GB29NWBK60161331926819", // SEPA member, though not in the EU
	"CH9300762011623852957",  // idem
}

func TestSEPA(t *testing.T) {
	t.Parallel()
	type tc struct {
		name, dest, field, reason string
		requireBIC                bool
	}
	var cases []tc
	for _, v := range sepaIBANs {
		cases = append(cases, tc{name: v, dest: v})
	}
	cases = append(cases,
		tc{name: "paper format", dest: "DE89 3704 0044 0532 0130 00"},
		tc{name: "lower case", dest: "fr14 2004 1010 0505 0001 3m02 606"},
		tc{name: "with BIC", dest: "DE89370400440532013000:DEUTDEFF", requireBIC: true},
		tc{name: "paper format with BIC11", dest: "DE89 3704 0044 0532 0130 00:DEUTDEFF500", requireBIC: true},
		tc{name: "BIC required", dest: "DE89370400440532013000", requireBIC: true, field: payment.FieldDestination, reason: payment.ReasonInvalid},
		tc{name: "empty BIC", dest: "DE89370400440532013000:", field: payment.FieldDestination, reason: payment.ReasonInvalid},
		tc{name: "bad BIC", dest: "DE89370400440532013000:DEUT1EFF", field: payment.FieldDestination, reason: payment.ReasonInvalid},
		tc{name: "check digits", dest: "DE88370400440532013000", field: payment.FieldDestination, reason: payment.ReasonChecksum},
		tc{name: "check digits 00", dest: "DE00370400440532013000", field: payment.FieldDestination, reason: payment.ReasonChecksum},
		tc{name: "typo in account", dest: "NL91ABNA0417164301", field: payment.FieldDestination, reason: payment.ReasonChecksum},
		tc{name: "transposed digits", dest: "BE68539007547043", field: payment.FieldDestination, reason: payment.ReasonChecksum},
		tc{name: "too short for DE", dest: "DE8937040044053201300", field: payment.FieldDestination, reason: payment.ReasonInvalid},
		tc{name: "letter where DE has digits", dest: "DE89370400440532O13000", field: payment.FieldDestination, reason: payment.ReasonInvalid},
		tc{name: "US has no IBAN", dest: "US64SVBKUS6S3300958879", field: payment.FieldDestination, reason: payment.ReasonInvalid},
		tc{name: "Brazil", dest: "BR1800360305000010009795493C1", field: payment.FieldDestination, reason: payment.ReasonNotSEPA},
		tc{name: "Turkey", dest: "TR330006100519786457841326", field: payment.FieldDestination, reason: payment.ReasonNotSEPA},
		tc{name: "Montenegro per banking v1.4.0", dest: "ME25505000012345678951", field: payment.FieldDestination, reason: payment.ReasonNotSEPA},
		tc{name: "punctuation", dest: "DE89-3704-0044-0532-0130-00", field: payment.FieldDestination, reason: payment.ReasonInvalid},
		// 'ı' upper-cases to 'I' under Unicode rules; it must not pass as one.
		tc{name: "dotless i", dest: "NL91ABNA0417164300ı", field: payment.FieldDestination, reason: payment.ReasonInvalid},
		tc{name: "too long", dest: strings.Repeat("DE89370400440532013000", 2), field: payment.FieldDestination, reason: payment.ReasonInvalid},
	)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			p := payment.SEPA{RequireBIC: c.requireBIC}
			checkErr(t, p.Validate(pay("sepa", 1000, "EUR", c.dest)), c.field, c.reason)
		})
	}
	t.Run("USD not by default", func(t *testing.T) {
		t.Parallel()
		checkErr(t, payment.SEPA{}.Validate(pay("sepa", 1000, "USD", sepaIBANs[0])), payment.FieldCurrency, payment.ReasonCurrencyNotAllowed)
	})
}

func TestWire(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, currency, dest, reason string // reason "" means valid
	}{
		{"BIC8 and IBAN", "EUR", "DEUTDEFF:DE89370400440532013000", ""},
		{"BIC11", "EUR", "DEUTDEFF500:0532013000", ""},
		{"UK", "GBP", "NWBKGB2L:31926819", ""},
		{"JPY", "JPY", "BOTKJPJT:1234567", ""},
		{"KWD", "KWD", "NBOKKWKW:1", ""},
		{"lower-case BIC", "USD", "deutdeff:123", ""},
		{"34 characters", "USD", "DEUTDEFF:" + strings.Repeat("A1", 17), ""},
		{"digit in country", "USD", "DEUT1EFF:123", payment.ReasonInvalid},
		{"BIC too short", "USD", "DEUTDEF:123", payment.ReasonInvalid},
		{"BIC 9 characters", "USD", "DEUTDEFF5:123", payment.ReasonInvalid},
		{"unknown country", "USD", "DEUTZZFF:123", payment.ReasonInvalid},
		{"no account", "USD", "DEUTDEFF:", payment.ReasonInvalid},
		{"no separator", "USD", "DEUTDEFF", payment.ReasonInvalid},
		{"35 characters", "USD", "DEUTDEFF:" + strings.Repeat("A", 35), payment.ReasonInvalid},
		{"punctuation", "USD", "DEUTDEFF:12-34", payment.ReasonInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			field := ""
			if tc.reason != "" {
				field = payment.FieldDestination
			}
			checkErr(t, payment.Wire{}.Validate(pay("wire", 5000, tc.currency, tc.dest)), field, tc.reason)
		})
	}
}

// TestDestinationMasked: destinations are personal data; messages show at
// most their last four characters.
func TestDestinationMasked(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		profile        payment.Profile
		currency, dest string
		secret, reason string
	}{
		{payment.ACH{}, "USD", "021000021:12345678X", "12345678", payment.ReasonInvalid},
		{payment.ACH{}, "USD", "021000022:123456789", "021000022", payment.ReasonChecksum},
		{payment.SEPA{}, "EUR", "DE88370400440532013000", "370400440532", payment.ReasonChecksum},
		{payment.SEPA{}, "EUR", "DE89370400440532013000:DEUT1EFF", "DEUT1EFF", payment.ReasonInvalid},
		{payment.Wire{}, "EUR", "DEUTDEFF:1234567890-", "1234567890", payment.ReasonInvalid},
	} {
		err := tc.profile.Validate(pay("x", 100, tc.currency, tc.dest))
		checkErr(t, err, payment.FieldDestination, tc.reason)
		if strings.Contains(err.Error(), tc.secret) {
			t.Errorf("error %q echoes %q", err, tc.secret)
		}
	}
}

func TestEvent(t *testing.T) {
	t.Parallel()
	ev := func(meta string) payment.Instruction {
		ins := instruction("usage", nil)
		ins.Metadata = json.RawMessage(meta)
		return ins
	}
	withPayment := ev(`{"k":1}`)
	withPayment.Payment = &payment.Payment{AmountMinor: 1, Currency: "USD", Destination: "x"}
	for _, tc := range []struct {
		name          string
		ins           payment.Instruction
		field, reason string
	}{
		{"object", ev(`{"meter":"api_calls","count":42}`), "", ""},
		{"padded object", ev(" {}\n"), "", ""},
		{"payment", withPayment, payment.FieldAmount, payment.ReasonNotAllowed},
		{"missing", ev(""), payment.FieldMetadata, payment.ReasonRequired},
		{"blank", ev(" \t"), payment.FieldMetadata, payment.ReasonRequired},
		{"null", ev("null"), payment.FieldMetadata, payment.ReasonInvalid},
		{"array", ev(`[{"k":1}]`), payment.FieldMetadata, payment.ReasonInvalid},
		{"string", ev(`"{}"`), payment.FieldMetadata, payment.ReasonInvalid},
		{"truncated", ev(`{"k":`), payment.FieldMetadata, payment.ReasonInvalid},
		{"two objects", ev(`{}{}`), payment.FieldMetadata, payment.ReasonInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			checkErr(t, payment.Event{}.Validate(tc.ins), tc.field, tc.reason)
		})
	}
	if (payment.Event{}).MovesMoney() {
		t.Error("Event must not move money")
	}
}

func TestGenericPattern(t *testing.T) {
	t.Parallel()
	p, err := payment.ProfileByName("generic", payment.Limits{}, payment.ProfileOptions{DestinationPattern: `ACME-[0-9]{6}`})
	if err != nil {
		t.Fatal(err)
	}
	// A leftmost-first alternation whose first branch matches a prefix: the
	// whole destination still matches the pattern and must be accepted.
	alt := payment.Generic{DestinationPattern: regexp.MustCompile(`[0-9]{4}|[0-9]{4}-[0-9]{2}`)}
	for _, tc := range []struct {
		name    string
		profile payment.Profile
		dest    string
		reason  string
	}{
		{"match", p, "ACME-123456", ""},
		{"prefix", p, "xACME-123456", payment.ReasonInvalid},
		{"suffix", p, "ACME-1234567", payment.ReasonInvalid},
		{"other", p, "ACME-12345", payment.ReasonInvalid},
		{"empty", p, "", payment.ReasonRequired},
		{"alternation short", alt, "1234", ""},
		{"alternation long", alt, "1234-56", ""},
		{"alternation partial", alt, "1234-5", payment.ReasonInvalid},
		{"no pattern", payment.Generic{}, "anything printable", ""},
		{"no pattern, control", payment.Generic{}, "tab\there", payment.ReasonInvalid},
		{"no pattern, too long", payment.Generic{}, strings.Repeat("x", 257), payment.ReasonTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			field := ""
			if tc.reason != "" {
				field = payment.FieldDestination
			}
			checkErr(t, tc.profile.Validate(pay("generic", 1, "USD", tc.dest)), field, tc.reason)
		})
	}
}

func TestLimits(t *testing.T) {
	t.Parallel()
	limits := payment.Limits{Currencies: []string{"USD", "EUR"}, MinAmountMinor: 100, MaxAmountMinor: 10_000}
	for _, tc := range []struct {
		name          string
		amount        int64
		currency      string
		field, reason string
	}{
		{"min", 100, "USD", "", ""},
		{"max", 10_000, "EUR", "", ""},
		{"below min", 99, "USD", payment.FieldAmount, payment.ReasonOutOfLimits},
		{"above max", 10_001, "USD", payment.FieldAmount, payment.ReasonOutOfLimits},
		{"currency not allowed", 500, "GBP", payment.FieldCurrency, payment.ReasonCurrencyNotAllowed},
		{"unknown currency", 500, "EUX", payment.FieldCurrency, payment.ReasonUnknownCurrency},
		{"zero", 0, "USD", payment.FieldAmount, payment.ReasonNotPositive},
		{"negative", -100, "USD", payment.FieldAmount, payment.ReasonNotPositive},
		{"overflow", payment.MaxAmountMinor + 1, "USD", payment.FieldAmount, payment.ReasonOverflow},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for _, p := range []payment.Profile{
				payment.Generic{Limits: limits},
				payment.Wire{Limits: limits},
			} {
				checkErr(t, p.Validate(pay("r", tc.amount, tc.currency, "DEUTDEFF:123")), tc.field, tc.reason)
			}
		})
	}
	t.Run("no payment", func(t *testing.T) {
		t.Parallel()
		for _, p := range []payment.Profile{payment.ACH{}, payment.SEPA{}, payment.Wire{}, payment.Generic{}} {
			checkErr(t, p.Validate(instruction("r", nil)), payment.FieldAmount, payment.ReasonRequired)
		}
	})
}

func TestEnvelope(t *testing.T) {
	t.Parallel()
	valid := pay("ach", 100, "USD", "021000021:123456789")
	for _, tc := range []struct {
		name          string
		edit          func(*payment.Instruction)
		field, reason string
	}{
		{"valid", func(*payment.Instruction) {}, "", ""},
		{"optional ids", func(i *payment.Instruction) { i.TenantID, i.CorrelationID = "t1", "c1" }, "", ""},
		{"instruction id", func(i *payment.Instruction) { i.InstructionID = "" }, payment.FieldInstructionID, payment.ReasonRequired},
		{"participant id", func(i *payment.Instruction) { i.ParticipantID = "" }, payment.FieldParticipantID, payment.ReasonRequired},
		{"idempotency key", func(i *payment.Instruction) { i.IdempotencyKey = "" }, payment.FieldIdempotencyKey, payment.ReasonRequired},
		{"rail", func(i *payment.Instruction) { i.RailType = "" }, payment.FieldRail, payment.ReasonRequired},
		{"blank key", func(i *payment.Instruction) { i.IdempotencyKey = "   " }, payment.FieldIdempotencyKey, payment.ReasonRequired},
		{"control in participant", func(i *payment.Instruction) { i.ParticipantID = "acme\x00" }, payment.FieldParticipantID, payment.ReasonInvalid},
		{"DEL in key", func(i *payment.Instruction) { i.IdempotencyKey = "k\x7f" }, payment.FieldIdempotencyKey, payment.ReasonInvalid},
		// An HTTP rail sends the key in a header, which drops a value's
		// surrounding spaces: "k-1 " would reach it as "k-1", another key.
		{"trailing space in key", func(i *payment.Instruction) { i.IdempotencyKey = "k-1 " }, payment.FieldIdempotencyKey, payment.ReasonInvalid},
		{"leading space in key", func(i *payment.Instruction) { i.IdempotencyKey = " k-1" }, payment.FieldIdempotencyKey, payment.ReasonInvalid},
		{"inner space in key", func(i *payment.Instruction) { i.IdempotencyKey = "k 1" }, "", ""},
		{"newline in correlation", func(i *payment.Instruction) { i.CorrelationID = "a\nb" }, payment.FieldCorrelationID, payment.ReasonInvalid},
		{"invalid UTF-8", func(i *payment.Instruction) { i.InstructionID = "ins-\xff" }, payment.FieldInstructionID, payment.ReasonInvalid},
		{"oversize instruction id", func(i *payment.Instruction) { i.InstructionID = strings.Repeat("i", 201) }, payment.FieldInstructionID, payment.ReasonTooLarge},
		{"oversize tenant", func(i *payment.Instruction) { i.TenantID = strings.Repeat("t", 201) }, payment.FieldTenantID, payment.ReasonTooLarge},
		// "*" in the session's outbox.tenant means every tenant: a tenant
		// of that name could never be chosen alone.
		{"tenant named *", func(i *payment.Instruction) { i.TenantID = "*" }, payment.FieldTenantID, payment.ReasonInvalid},
		{"tenant with a * in it", func(i *payment.Instruction) { i.TenantID = "a*" }, "", ""},
		{"200 bytes is fine", func(i *payment.Instruction) { i.InstructionID = strings.Repeat("i", 200) }, "", ""},
		{"metadata array", func(i *payment.Instruction) { i.Metadata = json.RawMessage(`[]`) }, payment.FieldMetadata, payment.ReasonInvalid},
		{"metadata object", func(i *payment.Instruction) { i.Metadata = json.RawMessage(`{"memo":"rent"}`) }, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ins := valid
			tc.edit(&ins)
			// Every profile shares the envelope checks.
			for _, p := range []payment.Profile{payment.ACH{}, payment.Generic{}} {
				checkErr(t, p.Validate(ins), tc.field, tc.reason)
			}
		})
	}
}

func TestProfileByName(t *testing.T) {
	t.Parallel()
	usd := payment.Limits{Currencies: []string{"USD"}}
	for _, tc := range []struct {
		name    string
		profile string
		limits  payment.Limits
		opts    payment.ProfileOptions
		want    payment.Profile // nil: an error is expected
	}{
		{"ach", "ach", usd, payment.ProfileOptions{}, payment.ACH{Limits: usd}},
		{"sepa", "sepa", payment.Limits{}, payment.ProfileOptions{RequireBIC: true}, payment.SEPA{RequireBIC: true}},
		{"wire", "wire", payment.Limits{MaxAmountMinor: 5}, payment.ProfileOptions{}, payment.Wire{Limits: payment.Limits{MaxAmountMinor: 5}}},
		{"generic", "generic", payment.Limits{}, payment.ProfileOptions{}, payment.Generic{}},
		{"event", "event", payment.Limits{}, payment.ProfileOptions{}, payment.Event{}},
		{"unknown", "swift", payment.Limits{}, payment.ProfileOptions{}, nil},
		{"case matters", "ACH", payment.Limits{}, payment.ProfileOptions{}, nil},
		{"empty", "", payment.Limits{}, payment.ProfileOptions{}, nil},
		{"pattern on ach", "ach", payment.Limits{}, payment.ProfileOptions{DestinationPattern: "x"}, nil},
		{"require_bic on wire", "wire", payment.Limits{}, payment.ProfileOptions{RequireBIC: true}, nil},
		{"bad pattern", "generic", payment.Limits{}, payment.ProfileOptions{DestinationPattern: "("}, nil},
		{"limits on event", "event", usd, payment.ProfileOptions{}, nil},
		{"withdrawn currency", "wire", payment.Limits{Currencies: []string{"DEM"}}, payment.ProfileOptions{}, nil},
		{"min above max", "ach", payment.Limits{MinAmountMinor: 10, MaxAmountMinor: 5}, payment.ProfileOptions{}, nil},
		{"negative", "ach", payment.Limits{MinAmountMinor: -1}, payment.ProfileOptions{}, nil},
		{"max too large", "ach", payment.Limits{MaxAmountMinor: payment.MaxAmountMinor + 1}, payment.ProfileOptions{}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := payment.ProfileByName(tc.profile, tc.limits, tc.opts)
			if tc.want == nil {
				if err == nil {
					t.Fatalf("expected an error, got %#v", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %#v, want %#v", got, tc.want)
			}
			if got.MovesMoney() != (tc.profile != "event") {
				t.Fatalf("%s: MovesMoney = %v", tc.profile, got.MovesMoney())
			}
		})
	}
}
