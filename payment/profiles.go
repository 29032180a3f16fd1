package payment

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/jacoelho/banking/bic"
	"github.com/jacoelho/banking/iban"
)

// maxDestinationBytes bounds every destination before any parsing: the
// longest legitimate one (a 34-character IBAN in paper format plus a BIC) is
// far shorter, and a bound keeps the bank-code libraries away from huge input.
const maxDestinationBytes = 256

// ACH validates US ACH payments. The destination is "<routing>:<account>":
// a 9-digit ABA routing number (see [ValidateABA]) and an account number of
// 4 to 17 digits. Currencies default to USD when Limits.Currencies is empty.
type ACH struct {
	Limits
}

// MovesMoney implements [Profile].
func (ACH) MovesMoney() bool { return true }

// Validate implements [Profile].
func (a ACH) Validate(ins Instruction) error {
	dest, err := validateMoney(ins, a.Limits, "USD")
	if err != nil {
		return err
	}
	routing, account, ok := strings.Cut(dest, ":")
	if !ok {
		return Invalid(FieldDestination, ReasonInvalid, "ACH destination must be <routing>:<account>")
	}
	if err := ValidateABA(routing); err != nil {
		return err
	}
	if len(account) < 4 || len(account) > 17 || !allDigits(account) {
		return Invalid(FieldDestination, ReasonInvalid, "ACH account number %q must be 4 to 17 digits", mask(account))
	}
	return nil
}

// ValidateABA checks a US ABA routing number: nine ASCII digits, a first
// two digits in a range the Federal Reserve assigns (00–12 banks, 21–32
// thrifts, 61–72 electronic transactions, 80 traveller's cheques), and the
// ABA checksum 3·d1 + 7·d2 + d3 + 3·d4 + 7·d5 + d6 + 3·d7 + 7·d8 + d9 ≡ 0
// (mod 10). The all-zero number passes both rules but is only ever a
// placeholder, so it is rejected too. Errors name [FieldDestination].
func ValidateABA(routing string) error {
	if len(routing) != 9 || !allDigits(routing) {
		return Invalid(FieldDestination, ReasonInvalid, "ABA routing number %q must be 9 digits", mask(routing))
	}
	if routing == "000000000" {
		return Invalid(FieldDestination, ReasonInvalid, "ABA routing number is a placeholder")
	}
	switch p := int(routing[0]-'0')*10 + int(routing[1]-'0'); {
	case p <= 12, p >= 21 && p <= 32, p >= 61 && p <= 72, p == 80:
	default:
		return Invalid(FieldDestination, ReasonInvalid, "ABA routing number %q has an unassigned prefix", mask(routing))
	}
	sum := 0
	for i := 0; i < 9; i++ {
		sum += int(routing[i]-'0') * [3]int{3, 7, 1}[i%3]
	}
	if sum%10 != 0 {
		return Invalid(FieldDestination, ReasonChecksum, "ABA routing number %q fails the checksum", mask(routing))
	}
	return nil
}

// SEPA validates SEPA credit transfers. The destination is "<IBAN>" or
// "<IBAN>:<BIC>". The IBAN may be written in paper format (spaces, any
// letter case); it must pass the country's IBAN rules and check digits, and
// its country must be a SEPA member as github.com/jacoelho/banking (v1.4.0)
// records it: the EU/EEA states, Switzerland, the United Kingdom, Monaco,
// San Marino, Andorra, Vatican City, Gibraltar and the French overseas
// departments and collectivities with their own IBAN prefix (GF, GP, MQ,
// RE, YT, BL, MF). It does not count Saint Pierre and Miquelon (PM) nor the
// countries the EPC admitted in 2024–25 (Albania, Montenegro, Moldova, North
// Macedonia): their IBANs are rejected with [ReasonNotSEPA] until the
// library catches up. Currencies default to EUR.
type SEPA struct {
	Limits
	// RequireBIC makes the "<IBAN>:<BIC>" form mandatory, for schemes or
	// banks that still route on the BIC.
	RequireBIC bool
}

// MovesMoney implements [Profile].
func (SEPA) MovesMoney() bool { return true }

// Validate implements [Profile].
func (s SEPA) Validate(ins Instruction) error {
	dest, err := validateMoney(ins, s.Limits, "EUR")
	if err != nil {
		return err
	}
	acct, code, hasBIC := strings.Cut(dest, ":")
	if err := validateSEPAIBAN(acct); err != nil {
		return err
	}
	if !hasBIC {
		if s.RequireBIC {
			return Invalid(FieldDestination, ReasonInvalid, "SEPA destination must be <IBAN>:<BIC> on this rail")
		}
		return nil
	}
	return validateBIC(code)
}

// validateSEPAIBAN checks an IBAN in electronic or paper format and its
// SEPA membership.
func validateSEPAIBAN(s string) error {
	// Normalise by hand rather than with strings.ToUpper: Unicode case
	// mapping turns 'ı' into 'I' and 'ſ' into 'S', which would let a
	// non-ASCII destination pass as an IBAN the rail then cannot read.
	norm := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == ' ':
		case c >= 'a' && c <= 'z':
			norm = append(norm, c-'a'+'A')
		case c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
			norm = append(norm, c)
		default:
			return Invalid(FieldDestination, ReasonInvalid, "IBAN may only contain letters, digits and spaces")
		}
	}
	// 34 is the longest IBAN ISO 13616 allows; 5 keeps ReplaceChecksum's
	// length precondition below.
	if len(norm) < 5 || len(norm) > 34 {
		return Invalid(FieldDestination, ReasonInvalid, "IBAN %q has an impossible length", mask(string(norm)))
	}
	v := string(norm)
	if err := iban.Validate(v); err != nil {
		// The library reports every failure as the same error value, so
		// tell a check-digit failure apart structurally: with corrected
		// check digits the IBAN would be valid.
		if fixed, ferr := iban.ReplaceChecksum(v); ferr == nil && fixed != v && iban.Validate(fixed) == nil {
			return Invalid(FieldDestination, ReasonChecksum, "IBAN %q has wrong check digits", mask(v))
		}
		return Invalid(FieldDestination, ReasonInvalid, "IBAN %q is not valid for its country", mask(v))
	}
	if sepa, err := iban.IsSEPA(v); err != nil || !sepa {
		return Invalid(FieldDestination, ReasonNotSEPA, "IBAN country %s is not a SEPA member", v[:2])
	}
	return nil
}

// Wire validates international wire transfers. The destination is
// "<BIC>:<account>": a valid BIC8 or BIC11 and an account of 1 to 34 ASCII
// letters and digits (an IBAN or a local account number; it is not checked
// further because local formats vary by country). Every active currency is
// accepted unless Limits.Currencies says otherwise.
type Wire struct {
	Limits
}

// MovesMoney implements [Profile].
func (Wire) MovesMoney() bool { return true }

// Validate implements [Profile].
func (w Wire) Validate(ins Instruction) error {
	dest, err := validateMoney(ins, w.Limits)
	if err != nil {
		return err
	}
	code, account, ok := strings.Cut(dest, ":")
	if !ok {
		return Invalid(FieldDestination, ReasonInvalid, "wire destination must be <BIC>:<account>")
	}
	if err := validateBIC(code); err != nil {
		return err
	}
	if len(account) < 1 || len(account) > 34 || !allAlnum(account) {
		return Invalid(FieldDestination, ReasonInvalid, "wire account %q must be 1 to 34 letters or digits", mask(account))
	}
	return nil
}

// validateBIC checks an ISO 9362 BIC (8 or 11 characters). Lower case is
// accepted like it is for IBANs; the bic package itself wants upper case.
func validateBIC(code string) error {
	if !allAlnum(code) {
		return Invalid(FieldDestination, ReasonInvalid, "BIC may only contain letters and digits")
	}
	if _, err := bic.Parse(strings.ToUpper(code)); err != nil { // ASCII only: checked above
		return Invalid(FieldDestination, ReasonInvalid, "BIC %q is not valid", mask(code))
	}
	return nil
}

// validateMoney runs the checks every money profile shares (envelope,
// payment, destination text) and returns the destination. defaultCurrencies
// apply when the limits name none.
func validateMoney(ins Instruction, l Limits, defaultCurrencies ...string) (string, error) {
	if err := validateEnvelope(ins); err != nil {
		return "", err
	}
	if len(l.Currencies) == 0 {
		l.Currencies = defaultCurrencies
	}
	if err := l.validatePayment(ins); err != nil {
		return "", err
	}
	dest := ins.Payment.Destination
	if err := ValidateText(FieldDestination, dest, maxDestinationBytes); err != nil {
		return "", err
	}
	return dest, nil
}

// mask hides an account identifier in messages, which end up in logs and
// the archive: only the last four characters are shown, and only when that
// is at most half of the value.
func mask(s string) string {
	r := []rune(s)
	if len(r) < 8 {
		return "****"
	}
	return "****" + string(r[len(r)-4:])
}

func allAlnum(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z') {
			return false
		}
	}
	return true
}

// ProfileOptions are the profile-specific settings of [ProfileByName].
type ProfileOptions struct {
	// DestinationPattern (generic only) is a regular expression the whole
	// destination must match; it is anchored at both ends when compiled.
	DestinationPattern string `json:"destination_pattern,omitempty"`
	// RequireBIC (sepa only) makes the BIC part of the destination mandatory.
	RequireBIC bool `json:"require_bic,omitempty"`
}

// ProfileByName builds a profile from configuration: name is one of "ach",
// "sepa", "wire", "generic" or "event". Limits and options are checked, and
// an option the profile does not use is an error rather than being silently
// ignored: a misspelled rail configuration must not relax validation.
func ProfileByName(name string, limits Limits, opts ProfileOptions) (Profile, error) {
	if opts.DestinationPattern != "" && name != "generic" {
		return nil, fmt.Errorf("payment: profile %q takes no destination pattern", name)
	}
	if opts.RequireBIC && name != "sepa" {
		return nil, fmt.Errorf("payment: profile %q takes no require_bic option", name)
	}
	if err := checkLimits(limits); err != nil {
		return nil, fmt.Errorf("payment: profile %q: %w", name, err)
	}
	switch name {
	case "ach":
		return ACH{Limits: limits}, nil
	case "sepa":
		return SEPA{Limits: limits, RequireBIC: opts.RequireBIC}, nil
	case "wire":
		return Wire{Limits: limits}, nil
	case "generic":
		g := Generic{Limits: limits}
		if opts.DestinationPattern != "" {
			re, err := regexp.Compile(`^(?:` + opts.DestinationPattern + `)$`)
			if err != nil {
				return nil, fmt.Errorf("payment: profile %q: destination pattern: %w", name, err)
			}
			g.DestinationPattern = re
		}
		return g, nil
	case "event":
		if len(limits.Currencies) > 0 || limits.MinAmountMinor != 0 || limits.MaxAmountMinor != 0 {
			return nil, fmt.Errorf("payment: profile %q moves no money and takes no limits", name)
		}
		return Event{}, nil
	}
	return nil, fmt.Errorf("payment: unknown profile %q (want ach, sepa, wire, generic or event)", name)
}

// checkLimits rejects limits that could never be met or that name a
// currency no payment can carry.
func checkLimits(l Limits) error {
	for _, c := range l.Currencies {
		if err := ValidateCurrency(c); err != nil {
			return err
		}
	}
	switch {
	case l.MinAmountMinor < 0 || l.MaxAmountMinor < 0:
		return fmt.Errorf("amount limits must not be negative")
	case l.MinAmountMinor > MaxAmountMinor || l.MaxAmountMinor > MaxAmountMinor:
		return fmt.Errorf("amount limits must not exceed %d", MaxAmountMinor)
	case l.MaxAmountMinor > 0 && l.MinAmountMinor > l.MaxAmountMinor:
		return fmt.Errorf("min_amount_minor %d is above max_amount_minor %d", l.MinAmountMinor, l.MaxAmountMinor)
	}
	return nil
}
