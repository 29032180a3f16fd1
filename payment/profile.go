package payment

import (
	"bytes"
	"regexp"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/ledgerline/outbox/internal/strictjson"
)

// DefaultMaxPayloadBytes is the default limit on an instruction's encoded
// payload (payment fields plus metadata), counted as PostgreSQL writes the
// stored jsonb back: numbers in full, jsonb's spacing.
const DefaultMaxPayloadBytes = 64 << 10

// Profile validates instructions for one kind of rail. Producers run it at
// enqueue (nothing is written on failure) and relayers run it again right
// before dispatch (the rail is never called on failure).
type Profile interface {
	// MovesMoney reports whether instructions must carry a [Payment].
	MovesMoney() bool
	// Validate returns a [*ValidationError] naming the first bad field.
	Validate(Instruction) error
}

// Limits are a money rail's amount and currency limits, shared by every
// money profile.
type Limits struct {
	// Currencies the rail accepts; empty means every active ISO 4217 code.
	Currencies []string `json:"currencies,omitempty"`
	// MinAmountMinor and MaxAmountMinor bound the amount; zero means no bound
	// beyond "positive" and [MaxAmountMinor].
	MinAmountMinor int64 `json:"min_amount_minor,omitempty"`
	MaxAmountMinor int64 `json:"max_amount_minor,omitempty"`
}

// validatePayment runs the checks every money rail shares: a payment is
// present, the amount is positive and within limits, the currency is valid
// and accepted. The destination is the profile's own business.
func (l Limits) validatePayment(ins Instruction) error {
	p := ins.Payment
	if p == nil {
		return Invalid(FieldAmount, ReasonRequired, "rail %q moves money: amount_minor, currency and destination are required", ins.RailType)
	}
	if err := ValidateAmount(p.AmountMinor); err != nil {
		return err
	}
	if err := ValidateCurrency(p.Currency); err != nil {
		return err
	}
	if len(l.Currencies) > 0 && !slices.Contains(l.Currencies, p.Currency) {
		return Invalid(FieldCurrency, ReasonCurrencyNotAllowed, "rail %q does not accept %s", ins.RailType, p.Currency)
	}
	if l.MinAmountMinor > 0 && p.AmountMinor < l.MinAmountMinor {
		return Invalid(FieldAmount, ReasonOutOfLimits, "amount %d is below the rail minimum %d", p.AmountMinor, l.MinAmountMinor)
	}
	if l.MaxAmountMinor > 0 && p.AmountMinor > l.MaxAmountMinor {
		return Invalid(FieldAmount, ReasonOutOfLimits, "amount %d is above the rail maximum %d", p.AmountMinor, l.MaxAmountMinor)
	}
	return nil
}

// Generic is a money rail whose destination is checked against an optional
// pattern (anchored regular expression); without one, any non-empty
// printable destination of at most 256 bytes is accepted.
type Generic struct {
	Limits
	// DestinationPattern, when set, must match the whole destination.
	DestinationPattern *regexp.Regexp
}

// MovesMoney implements [Profile].
func (Generic) MovesMoney() bool { return true }

// Validate implements [Profile].
func (g Generic) Validate(ins Instruction) error {
	if err := validateEnvelope(ins); err != nil {
		return err
	}
	if err := g.validatePayment(ins); err != nil {
		return err
	}
	dest := ins.Payment.Destination
	if err := ValidateText(FieldDestination, dest, 256); err != nil {
		return err
	}
	if g.DestinationPattern != nil && !fullMatch(g.DestinationPattern, dest) {
		return Invalid(FieldDestination, ReasonInvalid, "destination does not match the rail's pattern")
	}
	return nil
}

// fullMatch reports whether re matches the whole of s. Leftmost-first
// matching can stop short of a whole-string match that exists (`a|ab` finds
// "a" in "ab"), so match on a leftmost-longest copy, which finds it.
func fullMatch(re *regexp.Regexp, s string) bool {
	longest := *re
	longest.Longest()
	loc := longest.FindStringIndex(s)
	return loc != nil && loc[0] == 0 && loc[1] == len(s)
}

// Event is a rail that moves no money (usage snapshots, notifications): the
// metadata is the event body and must be a JSON object; payment fields must
// be absent.
type Event struct{}

// MovesMoney implements [Profile].
func (Event) MovesMoney() bool { return false }

// Validate implements [Profile].
func (Event) Validate(ins Instruction) error {
	if err := validateEnvelope(ins); err != nil {
		return err
	}
	if ins.Payment != nil {
		return Invalid(FieldAmount, ReasonNotAllowed, "rail %q is an event rail and carries no money fields", ins.RailType)
	}
	if len(bytes.TrimSpace(ins.Metadata)) == 0 {
		return Invalid(FieldMetadata, ReasonRequired, "event rail %q needs a JSON object as metadata", ins.RailType)
	}
	return nil
}

// validateEnvelope checks what every instruction needs regardless of rail:
// identifiers present and printable, metadata a JSON object when given.
func validateEnvelope(ins Instruction) error {
	for _, f := range []struct {
		name, value string
		required    bool
	}{
		{FieldInstructionID, ins.InstructionID, true},
		{FieldParticipantID, ins.ParticipantID, true},
		{FieldIdempotencyKey, ins.IdempotencyKey, true},
		{FieldRail, ins.RailType, true},
		{FieldTenantID, ins.TenantID, false},
		{FieldCorrelationID, ins.CorrelationID, false},
	} {
		if f.value == "" {
			if f.required {
				return Invalid(f.name, ReasonRequired, "%s is required", f.name)
			}
			continue
		}
		if err := ValidateText(f.name, f.value, 200); err != nil {
			return err
		}
	}
	// A session's outbox.tenant of "*" means every tenant (docs/audit.md,
	// "Tenants"): a tenant of that name could never be read, replayed or
	// cancelled alone.
	if ins.TenantID == "*" {
		return Invalid(FieldTenantID, ReasonInvalid, "%s \"*\" is reserved: outbox.tenant = '*' means every tenant", FieldTenantID)
	}
	// The key travels in an HTTP header too (Idempotency-Key), whose
	// value loses its surrounding spaces on the wire: "k-1 " would reach
	// the rail as "k-1", another instruction's key. Beyond ASCII a header
	// has only raw bytes, which receivers and proxies may read as
	// ISO-8859-1 ("clé" as "clÃ©") or refuse: another key again.
	if k := ins.IdempotencyKey; k[0] == ' ' || k[len(k)-1] == ' ' {
		return Invalid(FieldIdempotencyKey, ReasonInvalid, "%s must not begin or end with a space", FieldIdempotencyKey)
	}
	if i := strings.IndexFunc(ins.IdempotencyKey, func(r rune) bool { return r >= utf8.RuneSelf }); i >= 0 {
		r, _ := utf8.DecodeRuneInString(ins.IdempotencyKey[i:])
		return Invalid(FieldIdempotencyKey, ReasonInvalid, "%s must be printable ASCII (it travels in an HTTP header), not %U", FieldIdempotencyKey, r)
	}
	if m := bytes.TrimSpace(ins.Metadata); len(m) > 0 {
		if m[0] != '{' {
			return Invalid(FieldMetadata, ReasonInvalid, "metadata must be a JSON object")
		}
		// Strict (no repeated or invalid names, valid UTF-8) and storable:
		// PostgreSQL refuses a \u0000, or a number numeric cannot hold
		// (0e-20000), only after the statement was sent, failing the whole
		// batch and the caller's transaction with it.
		if err := strictjson.CheckStorable(m); err != nil {
			return Invalid(FieldMetadata, ReasonInvalid, "metadata: %v", err)
		}
	}
	return nil
}

// ValidateText checks a text field of an instruction (ids, rail type,
// destination): present, at most max bytes, valid UTF-8, and free of
// characters that hide or change what a person reads in logs, headers,
// file names and the archive ([ControlRune]). Every path into the outbox
// (Go API, JSON lines, flags) goes through it.
func ValidateText(field, v string, max int) error {
	switch {
	case strings.TrimSpace(v) == "":
		return Invalid(field, ReasonRequired, "%s is required", field)
	case len(v) > max:
		return Invalid(field, ReasonTooLarge, "%s is longer than %d bytes", field, max)
	case !utf8.ValidString(v):
		return Invalid(field, ReasonInvalid, "%s is not valid UTF-8", field)
	}
	if i := strings.IndexFunc(v, ControlRune); i >= 0 {
		r, _ := utf8.DecodeRuneInString(v[i:])
		return Invalid(field, ReasonInvalid, "%s contains the control or format character %U", field, r)
	}
	return nil
}

// ControlRune reports whether r is a character no identifier may hold:
// C0 and C1 control characters (U+0000-U+001F, U+007F-U+009F, e.g. the
// NEL U+0085 that some log pipelines treat as a newline), the line and
// paragraph separators U+2028 and U+2029, and every default-ignorable code
// point ([defaultIgnorable]): format characters (bidi overrides such as
// U+202E that reverse what a person reads, zero-width characters) and
// the others that render as nothing (variation selectors, Hangul fillers,
// the combining grapheme joiner), which make two different keys look
// equal.
func ControlRune(r rune) bool {
	if r < 0x80 { // every identifier's common case, without the tables
		return r < 0x20 || r == 0x7f
	}
	return unicode.IsControl(r) || unicode.In(r, unicode.Zl, unicode.Zp) || unicode.In(r, defaultIgnorable...)
}

// defaultIgnorable is Unicode's Default_Ignorable_Code_Point property,
// which the unicode package has no table for, from the tables of its
// derivation (DerivedCoreProperties.txt): Other_Default_Ignorable_Code_Point
// (which holds the Hangul fillers U+115F, U+1160, U+3164 and U+FFA0, and
// U+034F), plus Cf, plus Variation_Selector, minus White_Space (none of
// these), minus the format characters that should stay visible
// (interlinear annotation marks, Egyptian hieroglyph format controls,
// prepended concatenation marks such as U+0600): those are Cf, and an
// identifier has no use for them either, so they stay refused.
var defaultIgnorable = []*unicode.RangeTable{
	unicode.Other_Default_Ignorable_Code_Point,
	unicode.Cf,
	unicode.Variation_Selector,
}

// Catalog maps rail types (what instructions carry) to their validation
// profile. Producers use it at enqueue; it knows nothing about transports.
type Catalog map[string]Profile

// DefaultCatalog is what exists when no rail configuration is loaded: the
// sandbox money rail and the generic event rail.
func DefaultCatalog() Catalog {
	return Catalog{
		"sandbox": Generic{},
		"event":   Event{},
	}
}

// Lookup returns the profile of a rail type or a ValidationError naming the
// rail field.
func (c Catalog) Lookup(railType string) (Profile, error) {
	if railType == "" {
		return nil, Invalid(FieldRail, ReasonRequired, "rail is required")
	}
	p, ok := c[railType]
	if !ok {
		return nil, Invalid(FieldRail, ReasonUnknownRail, "unknown rail type %q", railType)
	}
	return p, nil
}

// Validate validates ins with the profile of its rail type.
func (c Catalog) Validate(ins Instruction) error {
	p, err := c.Lookup(ins.RailType)
	if err != nil {
		return err
	}
	return p.Validate(ins)
}
