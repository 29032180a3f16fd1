package rails_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/ledgerline/outbox/rails"
)

// instruction returns a valid envelope for rail carrying p.
func instruction(rail string, p *rails.Payment) rails.Instruction {
	return rails.Instruction{
		InstructionID:  "ins-1",
		ParticipantID:  "acme",
		IdempotencyKey: "key-1",
		RailType:       rail,
		Payment:        p,
	}
}

// pay returns an instruction paying amount of currency to dest.
func pay(rail string, amount int64, currency, dest string) rails.Instruction {
	return instruction(rail, &rails.Payment{AmountMinor: amount, Currency: currency, Destination: dest})
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
	if !errors.Is(err, rails.ErrValidation) {
		t.Fatalf("error %v does not match ErrValidation", err)
	}
	var verr *rails.ValidationError
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
		{"021000022", rails.ReasonChecksum},
		{"123456789", rails.ReasonChecksum},
		{"026009594", rails.ReasonChecksum},
		{"02100002", rails.ReasonInvalid},   // 8 digits
		{"0210000210", rails.ReasonInvalid}, // 10 digits
		{"", rails.ReasonInvalid},
		{"02100002A", rails.ReasonInvalid},
		{"-21000021", rails.ReasonInvalid},
		{"０21000021", rails.ReasonInvalid}, // full-width zero
		{"000000000", rails.ReasonInvalid}, // placeholder; passes the checksum
		{"130000019", rails.ReasonInvalid}, // prefix 13, valid checksum
		{"200000017", rails.ReasonInvalid}, // prefix 20
		{"330000013", rails.ReasonInvalid}, // prefix 33
		{"600000015", rails.ReasonInvalid}, // prefix 60
		{"730000011", rails.ReasonInvalid}, // prefix 73
		{"810000012", rails.ReasonInvalid}, // prefix 81
		{"990000013", rails.ReasonInvalid}, // prefix 99
	} {
		field := ""
		if tc.reason != "" {
			field = rails.FieldDestination
		}
		t.Run(tc.routing, func(t *testing.T) {
			t.Parallel()
			checkErr(t, rails.ValidateABA(tc.routing), field, tc.reason)
		})
	}
}

func TestACH(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		limits   rails.Limits
		currency string
		dest     string
		field    string
		reason   string
	}{
		{"chase", rails.Limits{}, "USD", "021000021:123456789", "", ""},
		{"min account", rails.Limits{}, "USD", "011000015:1234", "", ""},
		{"max account", rails.Limits{}, "USD", "026009593:12345678901234567", "", ""},
		{"EUR not by default", rails.Limits{}, "EUR", "021000021:123456789", rails.FieldCurrency, rails.ReasonCurrencyNotAllowed},
		{"CAD when configured", rails.Limits{Currencies: []string{"USD", "CAD"}}, "CAD", "021000021:123456789", "", ""},
		{"USD not configured", rails.Limits{Currencies: []string{"CAD"}}, "USD", "021000021:123456789", rails.FieldCurrency, rails.ReasonCurrencyNotAllowed},
		{"checksum", rails.Limits{}, "USD", "021000022:123456789", rails.FieldDestination, rails.ReasonChecksum},
		{"no separator", rails.Limits{}, "USD", "021000021123456789", rails.FieldDestination, rails.ReasonInvalid},
		{"account too short", rails.Limits{}, "USD", "021000021:123", rails.FieldDestination, rails.ReasonInvalid},
		{"account too long", rails.Limits{}, "USD", "021000021:123456789012345678", rails.FieldDestination, rails.ReasonInvalid},
		{"account letters", rails.Limits{}, "USD", "021000021:12345678X", rails.FieldDestination, rails.ReasonInvalid},
		{"account spaces", rails.Limits{}, "USD", "021000021:1234 5678", rails.FieldDestination, rails.ReasonInvalid},
		{"second separator", rails.Limits{}, "USD", "021000021:1234:5678", rails.FieldDestination, rails.ReasonInvalid},
		{"empty", rails.Limits{}, "USD", "", rails.FieldDestination, rails.ReasonRequired},
		{"control character", rails.Limits{}, "USD", "021000021:1234\n5678", rails.FieldDestination, rails.ReasonInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := rails.ACH{Limits: tc.limits}
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
		tc{name: "BIC required", dest: "DE89370400440532013000", requireBIC: true, field: rails.FieldDestination, reason: rails.ReasonInvalid},
		tc{name: "empty BIC", dest: "DE89370400440532013000:", field: rails.FieldDestination, reason: rails.ReasonInvalid},
		tc{name: "bad BIC", dest: "DE89370400440532013000:DEUT1EFF", field: rails.FieldDestination, reason: rails.ReasonInvalid},
		tc{name: "check digits", dest: "DE88370400440532013000", field: rails.FieldDestination, reason: rails.ReasonChecksum},
		tc{name: "check digits 00", dest: "DE00370400440532013000", field: rails.FieldDestination, reason: rails.ReasonChecksum},
		tc{name: "typo in account", dest: "NL91ABNA0417164301", field: rails.FieldDestination, reason: rails.ReasonChecksum},
		tc{name: "transposed digits", dest: "BE68539007547043", field: rails.FieldDestination, reason: rails.ReasonChecksum},
		tc{name: "too short for DE", dest: "DE8937040044053201300", field: rails.FieldDestination, reason: rails.ReasonInvalid},
		tc{name: "letter where DE has digits", dest: "DE89370400440532O13000", field: rails.FieldDestination, reason: rails.ReasonInvalid},
		tc{name: "US has no IBAN", dest: "US64SVBKUS6S3300958879", field: rails.FieldDestination, reason: rails.ReasonInvalid},
		tc{name: "Brazil", dest: "BR1800360305000010009795493C1", field: rails.FieldDestination, reason: rails.ReasonNotSEPA},
		tc{name: "Turkey", dest: "TR330006100519786457841326", field: rails.FieldDestination, reason: rails.ReasonNotSEPA},
		tc{name: "Montenegro per banking v1.4.0", dest: "ME25505000012345678951", field: rails.FieldDestination, reason: rails.ReasonNotSEPA},
		tc{name: "punctuation", dest: "DE89-3704-0044-0532-0130-00", field: rails.FieldDestination, reason: rails.ReasonInvalid},
		// 'ı' upper-cases to 'I' under Unicode rules; it must not pass as one.
		tc{name: "dotless i", dest: "NL91ABNA0417164300ı", field: rails.FieldDestination, reason: rails.ReasonInvalid},
		tc{name: "too long", dest: strings.Repeat("DE89370400440532013000", 2), field: rails.FieldDestination, reason: rails.ReasonInvalid},
	)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			p := rails.SEPA{RequireBIC: c.requireBIC}
			checkErr(t, p.Validate(pay("sepa", 1000, "EUR", c.dest)), c.field, c.reason)
		})
	}
	t.Run("USD not by default", func(t *testing.T) {
		t.Parallel()
		checkErr(t, rails.SEPA{}.Validate(pay("sepa", 1000, "USD", sepaIBANs[0])), rails.FieldCurrency, rails.ReasonCurrencyNotAllowed)
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
		{"digit in country", "USD", "DEUT1EFF:123", rails.ReasonInvalid},
		{"BIC too short", "USD", "DEUTDEF:123", rails.ReasonInvalid},
		{"BIC 9 characters", "USD", "DEUTDEFF5:123", rails.ReasonInvalid},
		{"unknown country", "USD", "DEUTZZFF:123", rails.ReasonInvalid},
		{"no account", "USD", "DEUTDEFF:", rails.ReasonInvalid},
		{"no separator", "USD", "DEUTDEFF", rails.ReasonInvalid},
		{"35 characters", "USD", "DEUTDEFF:" + strings.Repeat("A", 35), rails.ReasonInvalid},
		{"punctuation", "USD", "DEUTDEFF:12-34", rails.ReasonInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			field := ""
			if tc.reason != "" {
				field = rails.FieldDestination
			}
			checkErr(t, rails.Wire{}.Validate(pay("wire", 5000, tc.currency, tc.dest)), field, tc.reason)
		})
	}
}

// TestDestinationMasked: destinations are personal data; messages show at
// most their last four characters.
func TestDestinationMasked(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		profile        rails.Profile
		currency, dest string
		secret, reason string
	}{
		{rails.ACH{}, "USD", "021000021:12345678X", "12345678", rails.ReasonInvalid},
		{rails.ACH{}, "USD", "021000022:123456789", "021000022", rails.ReasonChecksum},
		{rails.SEPA{}, "EUR", "DE88370400440532013000", "370400440532", rails.ReasonChecksum},
		{rails.SEPA{}, "EUR", "DE89370400440532013000:DEUT1EFF", "DEUT1EFF", rails.ReasonInvalid},
		{rails.Wire{}, "EUR", "DEUTDEFF:1234567890-", "1234567890", rails.ReasonInvalid},
	} {
		err := tc.profile.Validate(pay("x", 100, tc.currency, tc.dest))
		checkErr(t, err, rails.FieldDestination, tc.reason)
		if strings.Contains(err.Error(), tc.secret) {
			t.Errorf("error %q echoes %q", err, tc.secret)
		}
	}
}

func TestEvent(t *testing.T) {
	t.Parallel()
	ev := func(meta string) rails.Instruction {
		ins := instruction("usage", nil)
		ins.Metadata = json.RawMessage(meta)
		return ins
	}
	withPayment := ev(`{"k":1}`)
	withPayment.Payment = &rails.Payment{AmountMinor: 1, Currency: "USD", Destination: "x"}
	for _, tc := range []struct {
		name          string
		ins           rails.Instruction
		field, reason string
	}{
		{"object", ev(`{"meter":"api_calls","count":42}`), "", ""},
		{"padded object", ev(" {}\n"), "", ""},
		{"payment", withPayment, rails.FieldAmount, rails.ReasonNotAllowed},
		{"missing", ev(""), rails.FieldMetadata, rails.ReasonRequired},
		{"blank", ev(" \t"), rails.FieldMetadata, rails.ReasonRequired},
		{"null", ev("null"), rails.FieldMetadata, rails.ReasonInvalid},
		{"array", ev(`[{"k":1}]`), rails.FieldMetadata, rails.ReasonInvalid},
		{"string", ev(`"{}"`), rails.FieldMetadata, rails.ReasonInvalid},
		{"truncated", ev(`{"k":`), rails.FieldMetadata, rails.ReasonInvalid},
		{"two objects", ev(`{}{}`), rails.FieldMetadata, rails.ReasonInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			checkErr(t, rails.Event{}.Validate(tc.ins), tc.field, tc.reason)
		})
	}
	if (rails.Event{}).MovesMoney() {
		t.Error("Event must not move money")
	}
}

func TestGenericPattern(t *testing.T) {
	t.Parallel()
	p, err := rails.ProfileByName("generic", rails.Limits{}, rails.ProfileOptions{DestinationPattern: `ACME-[0-9]{6}`})
	if err != nil {
		t.Fatal(err)
	}
	// A leftmost-first alternation whose first branch matches a prefix: the
	// whole destination still matches the pattern and must be accepted.
	alt := rails.Generic{DestinationPattern: regexp.MustCompile(`[0-9]{4}|[0-9]{4}-[0-9]{2}`)}
	for _, tc := range []struct {
		name    string
		profile rails.Profile
		dest    string
		reason  string
	}{
		{"match", p, "ACME-123456", ""},
		{"prefix", p, "xACME-123456", rails.ReasonInvalid},
		{"suffix", p, "ACME-1234567", rails.ReasonInvalid},
		{"other", p, "ACME-12345", rails.ReasonInvalid},
		{"empty", p, "", rails.ReasonRequired},
		{"alternation short", alt, "1234", ""},
		{"alternation long", alt, "1234-56", ""},
		{"alternation partial", alt, "1234-5", rails.ReasonInvalid},
		{"no pattern", rails.Generic{}, "anything printable", ""},
		{"no pattern, control", rails.Generic{}, "tab\there", rails.ReasonInvalid},
		{"no pattern, too long", rails.Generic{}, strings.Repeat("x", 257), rails.ReasonTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			field := ""
			if tc.reason != "" {
				field = rails.FieldDestination
			}
			checkErr(t, tc.profile.Validate(pay("generic", 1, "USD", tc.dest)), field, tc.reason)
		})
	}
}

func TestLimits(t *testing.T) {
	t.Parallel()
	limits := rails.Limits{Currencies: []string{"USD", "EUR"}, MinAmountMinor: 100, MaxAmountMinor: 10_000}
	for _, tc := range []struct {
		name          string
		amount        int64
		currency      string
		field, reason string
	}{
		{"min", 100, "USD", "", ""},
		{"max", 10_000, "EUR", "", ""},
		{"below min", 99, "USD", rails.FieldAmount, rails.ReasonOutOfLimits},
		{"above max", 10_001, "USD", rails.FieldAmount, rails.ReasonOutOfLimits},
		{"currency not allowed", 500, "GBP", rails.FieldCurrency, rails.ReasonCurrencyNotAllowed},
		{"unknown currency", 500, "EUX", rails.FieldCurrency, rails.ReasonUnknownCurrency},
		{"zero", 0, "USD", rails.FieldAmount, rails.ReasonNotPositive},
		{"negative", -100, "USD", rails.FieldAmount, rails.ReasonNotPositive},
		{"overflow", rails.MaxAmountMinor + 1, "USD", rails.FieldAmount, rails.ReasonOverflow},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for _, p := range []rails.Profile{
				rails.Generic{Limits: limits},
				rails.Wire{Limits: limits},
			} {
				checkErr(t, p.Validate(pay("r", tc.amount, tc.currency, "DEUTDEFF:123")), tc.field, tc.reason)
			}
		})
	}
	t.Run("no payment", func(t *testing.T) {
		t.Parallel()
		for _, p := range []rails.Profile{rails.ACH{}, rails.SEPA{}, rails.Wire{}, rails.Generic{}} {
			checkErr(t, p.Validate(instruction("r", nil)), rails.FieldAmount, rails.ReasonRequired)
		}
	})
}

func TestEnvelope(t *testing.T) {
	t.Parallel()
	valid := pay("ach", 100, "USD", "021000021:123456789")
	for _, tc := range []struct {
		name          string
		edit          func(*rails.Instruction)
		field, reason string
	}{
		{"valid", func(*rails.Instruction) {}, "", ""},
		{"optional ids", func(i *rails.Instruction) { i.TenantID, i.CorrelationID = "t1", "c1" }, "", ""},
		{"instruction id", func(i *rails.Instruction) { i.InstructionID = "" }, rails.FieldInstructionID, rails.ReasonRequired},
		{"participant id", func(i *rails.Instruction) { i.ParticipantID = "" }, rails.FieldParticipantID, rails.ReasonRequired},
		{"idempotency key", func(i *rails.Instruction) { i.IdempotencyKey = "" }, rails.FieldIdempotencyKey, rails.ReasonRequired},
		{"rail", func(i *rails.Instruction) { i.RailType = "" }, rails.FieldRail, rails.ReasonRequired},
		{"blank key", func(i *rails.Instruction) { i.IdempotencyKey = "   " }, rails.FieldIdempotencyKey, rails.ReasonRequired},
		{"control in participant", func(i *rails.Instruction) { i.ParticipantID = "acme\x00" }, rails.FieldParticipantID, rails.ReasonInvalid},
		{"DEL in key", func(i *rails.Instruction) { i.IdempotencyKey = "k\x7f" }, rails.FieldIdempotencyKey, rails.ReasonInvalid},
		{"newline in correlation", func(i *rails.Instruction) { i.CorrelationID = "a\nb" }, rails.FieldCorrelationID, rails.ReasonInvalid},
		{"invalid UTF-8", func(i *rails.Instruction) { i.InstructionID = "ins-\xff" }, rails.FieldInstructionID, rails.ReasonInvalid},
		{"oversize instruction id", func(i *rails.Instruction) { i.InstructionID = strings.Repeat("i", 201) }, rails.FieldInstructionID, rails.ReasonTooLarge},
		{"oversize tenant", func(i *rails.Instruction) { i.TenantID = strings.Repeat("t", 201) }, rails.FieldTenantID, rails.ReasonTooLarge},
		{"200 bytes is fine", func(i *rails.Instruction) { i.InstructionID = strings.Repeat("i", 200) }, "", ""},
		{"metadata array", func(i *rails.Instruction) { i.Metadata = json.RawMessage(`[]`) }, rails.FieldMetadata, rails.ReasonInvalid},
		{"metadata object", func(i *rails.Instruction) { i.Metadata = json.RawMessage(`{"memo":"rent"}`) }, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ins := valid
			tc.edit(&ins)
			// Every profile shares the envelope checks.
			for _, p := range []rails.Profile{rails.ACH{}, rails.Generic{}} {
				checkErr(t, p.Validate(ins), tc.field, tc.reason)
			}
		})
	}
}

func TestProfileByName(t *testing.T) {
	t.Parallel()
	usd := rails.Limits{Currencies: []string{"USD"}}
	for _, tc := range []struct {
		name    string
		profile string
		limits  rails.Limits
		opts    rails.ProfileOptions
		want    rails.Profile // nil: an error is expected
	}{
		{"ach", "ach", usd, rails.ProfileOptions{}, rails.ACH{Limits: usd}},
		{"sepa", "sepa", rails.Limits{}, rails.ProfileOptions{RequireBIC: true}, rails.SEPA{RequireBIC: true}},
		{"wire", "wire", rails.Limits{MaxAmountMinor: 5}, rails.ProfileOptions{}, rails.Wire{Limits: rails.Limits{MaxAmountMinor: 5}}},
		{"generic", "generic", rails.Limits{}, rails.ProfileOptions{}, rails.Generic{}},
		{"event", "event", rails.Limits{}, rails.ProfileOptions{}, rails.Event{}},
		{"unknown", "swift", rails.Limits{}, rails.ProfileOptions{}, nil},
		{"case matters", "ACH", rails.Limits{}, rails.ProfileOptions{}, nil},
		{"empty", "", rails.Limits{}, rails.ProfileOptions{}, nil},
		{"pattern on ach", "ach", rails.Limits{}, rails.ProfileOptions{DestinationPattern: "x"}, nil},
		{"require_bic on wire", "wire", rails.Limits{}, rails.ProfileOptions{RequireBIC: true}, nil},
		{"bad pattern", "generic", rails.Limits{}, rails.ProfileOptions{DestinationPattern: "("}, nil},
		{"limits on event", "event", usd, rails.ProfileOptions{}, nil},
		{"withdrawn currency", "wire", rails.Limits{Currencies: []string{"DEM"}}, rails.ProfileOptions{}, nil},
		{"min above max", "ach", rails.Limits{MinAmountMinor: 10, MaxAmountMinor: 5}, rails.ProfileOptions{}, nil},
		{"negative", "ach", rails.Limits{MinAmountMinor: -1}, rails.ProfileOptions{}, nil},
		{"max too large", "ach", rails.Limits{MaxAmountMinor: rails.MaxAmountMinor + 1}, rails.ProfileOptions{}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := rails.ProfileByName(tc.profile, tc.limits, tc.opts)
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
