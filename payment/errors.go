package payment

import (
	"errors"
	"fmt"
)

// ErrValidation matches every [*ValidationError] with errors.Is.
var ErrValidation = errors.New("validation failed")

// Validation reasons carried in [ValidationError.Reason]. They are stable and
// machine-readable; Message is for people.
const (
	ReasonRequired           = "required"
	ReasonInvalid            = "invalid"
	ReasonNotPositive        = "not_positive"
	ReasonOverflow           = "overflow"
	ReasonExcessPrecision    = "excess_precision"
	ReasonUnknownCurrency    = "unknown_currency"
	ReasonCurrencyNotAllowed = "currency_not_allowed"
	ReasonOutOfLimits        = "out_of_limits"
	ReasonChecksum           = "checksum"
	ReasonNotSEPA            = "not_sepa"
	ReasonTooLarge           = "too_large"
	ReasonUnknownRail        = "unknown_rail"
	ReasonNotAllowed         = "not_allowed"
)

// ValidationError says which field of an instruction is wrong and why. It is
// returned before anything is written or sent.
type ValidationError struct {
	Field   string // the field as named in the JSON input, e.g. "amount_minor"
	Reason  string // one of the Reason* constants
	Message string // human-readable detail; never contains secrets
}

// Error implements error.
func (e *ValidationError) Error() string {
	return fmt.Sprintf("invalid %s: %s", e.Field, e.Message)
}

// Is makes errors.Is(err, ErrValidation) true for every ValidationError.
func (e *ValidationError) Is(target error) bool { return target == ErrValidation }

// Invalid builds a ValidationError; profiles implemented outside this
// package return it too.
func Invalid(field, reason, format string, args ...any) *ValidationError {
	return &ValidationError{Field: field, Reason: reason, Message: fmt.Sprintf(format, args...)}
}
