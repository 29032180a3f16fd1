package payment

import (
	"strings"

	"github.com/bojanz/currency"
)

// MaxAmountMinor is the largest amount accepted anywhere: 2^53-1 minor units.
// Larger values do not survive a JSON round trip through IEEE-754 doubles (which
// many rail endpoints use), so they are rejected as an overflow rather than
// silently rounded somewhere downstream.
const MaxAmountMinor int64 = 1<<53 - 1

// Field names used in validation errors; they match the JSON input fields.
const (
	FieldInstructionID  = "instruction_id"
	FieldParticipantID  = "participant_id"
	FieldIdempotencyKey = "idempotency_key"
	FieldRail           = "rail"
	FieldAmount         = "amount_minor"
	FieldCurrency       = "currency"
	FieldDestination    = "destination"
	FieldMetadata       = "metadata"
	FieldPayload        = "payload"
	FieldTenantID       = "tenant_id"
	FieldCorrelationID  = "correlation_id"
)

// ValidateCurrency checks that code is an active ISO 4217 currency code in
// canonical (upper-case) form that payments can settle in. Withdrawn codes
// (DEM, HRK, SLL, ...), the non-currency codes (XXX, XTS, XDR, metals) and
// the fund and accounting codes of [nonSettlementCodes] (USN, CLF, CHE, ...)
// are rejected, all with the same [*ValidationError] (Reason
// [ReasonUnknownCurrency]).
func ValidateCurrency(code string) error {
	if code == "" {
		return Invalid(FieldCurrency, ReasonRequired, "currency is required")
	}
	if !currency.IsValid(code) {
		return Invalid(FieldCurrency, ReasonUnknownCurrency, "%q is not an active ISO 4217 currency code", code)
	}
	if nonSettlementCodes[code] {
		return Invalid(FieldCurrency, ReasonUnknownCurrency, "%q is an ISO 4217 fund or accounting code, not a settlement currency", code)
	}
	return nil
}

// nonSettlementCodes are active ISO 4217 codes that the currency library
// accepts but that no payment settles in: funds codes (next-day dollars,
// indexed units, WIR money) and units of account. A rail paying "1000 CLF"
// would pay an inflation-indexed accounting unit, not pesos.
var nonSettlementCodes = map[string]bool{
	"BOV": true, // Bolivian Mvdol (funds code)
	"CHE": true, // WIR euro (complementary currency)
	"CHW": true, // WIR franc (complementary currency)
	"CLF": true, // Chilean Unidad de Fomento (indexed unit of account)
	"COU": true, // Colombian Unidad de Valor Real (unit of account)
	"MXV": true, // Mexican Unidad de Inversion (unit of account)
	"USN": true, // US dollar next day (funds code)
	"UYI": true, // Uruguay peso en unidades indexadas (funds code)
	"UYW": true, // Unidad previsional (Uruguayan unit of account)
	"XAD": true, // Arab accounting dinar (unit of account of the Arab Monetary Fund)
}

// CurrencyDigits returns the number of minor-unit digits of a valid currency
// (2 for USD, 0 for JPY, 3 for KWD).
func CurrencyDigits(code string) (int, error) {
	if err := ValidateCurrency(code); err != nil {
		return 0, err
	}
	d, _ := currency.GetDigits(code)
	return int(d), nil
}

// ValidateAmount checks that an amount in minor units is positive and within
// [MaxAmountMinor].
func ValidateAmount(amountMinor int64) error {
	if amountMinor <= 0 {
		return Invalid(FieldAmount, ReasonNotPositive, "amount must be greater than zero, got %d", amountMinor)
	}
	if amountMinor > MaxAmountMinor {
		return Invalid(FieldAmount, ReasonOverflow, "amount %d exceeds the maximum %d", amountMinor, MaxAmountMinor)
	}
	return nil
}

// ParseAmountMinor parses an amount written in minor units, as it appears in
// JSON input ("1250"). A fractional part that is not zero ("12.5") is excess
// precision; exponents and signs other than a leading '-' are invalid; values
// beyond [MaxAmountMinor] overflow. The result is not checked for positivity:
// use [ValidateAmount].
func ParseAmountMinor(s string) (int64, error) {
	intPart, frac, err := splitDecimal(FieldAmount, s)
	if err != nil {
		return 0, err
	}
	if strings.Trim(frac, "0") != "" {
		return 0, Invalid(FieldAmount, ReasonExcessPrecision, "%q has a fraction of a minor unit", s)
	}
	return digitsToMinor(s, intPart, "")
}

// ParseAmount parses a decimal amount in major units ("12.34") for currency
// and returns it in minor units (1234 for USD). More fractional digits than the
// currency has is excess precision, unless the extra digits are zeros.
func ParseAmount(s, currencyCode string) (int64, error) {
	digits, err := CurrencyDigits(currencyCode)
	if err != nil {
		return 0, err
	}
	intPart, frac, err := splitDecimal(FieldAmount, s)
	if err != nil {
		return 0, err
	}
	if len(frac) > digits {
		if strings.Trim(frac[digits:], "0") != "" {
			return 0, Invalid(FieldAmount, ReasonExcessPrecision,
				"%q has more than %d decimal places for %s", s, digits, currencyCode)
		}
		frac = frac[:digits]
	}
	frac += strings.Repeat("0", digits-len(frac))
	return digitsToMinor(s, intPart, frac)
}

// splitDecimal splits "[-]digits[.digits]" into its integer and fractional
// digit strings; the sign stays on the integer part.
func splitDecimal(field, s string) (intPart, frac string, err error) {
	if s == "" {
		return "", "", Invalid(field, ReasonRequired, "amount is required")
	}
	body := strings.TrimPrefix(s, "-")
	intPart, frac, hasDot := strings.Cut(body, ".")
	if intPart == "" || (hasDot && frac == "") || !allDigits(intPart) || !allDigits(frac) {
		return "", "", Invalid(field, ReasonInvalid, "%q is not a plain decimal number", s)
	}
	if len(body) != len(s) {
		intPart = "-" + intPart
	}
	return intPart, frac, nil
}

// digitsToMinor combines integer and (already scaled) fractional digits into
// minor units, rejecting anything beyond MaxAmountMinor.
func digitsToMinor(orig, intPart, frac string) (int64, error) {
	neg := strings.HasPrefix(intPart, "-")
	all := strings.TrimLeft(strings.TrimPrefix(intPart, "-")+frac, "0")
	if len(all) > 16 { // MaxAmountMinor has 16 digits; more cannot fit
		return 0, Invalid(FieldAmount, ReasonOverflow, "%q exceeds the maximum amount", orig)
	}
	var v int64
	for _, c := range all {
		v = v*10 + int64(c-'0')
	}
	if v > MaxAmountMinor {
		return 0, Invalid(FieldAmount, ReasonOverflow, "%q exceeds the maximum amount", orig)
	}
	if neg {
		v = -v
	}
	return v, nil
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
