// Package rails is the edge where money leaves the system: the [Rail] contract,
// payment validation per rail profile, the error taxonomy that turns a rail's
// explicit answer into an outcome, circuit breakers, and the built-in payment.
//
// Nothing in this package decides anything by matching error text: a rail
// answers with an explicit code, and a per-rail [CodeTable] maps that code to
// an [Outcome] and an [ErrorCode].
package payment

import (
	"encoding/json"

	"github.com/gofrs/uuid/v5"
)

// Payment is the money part of an instruction. Amounts are integer minor units
// of Currency (cents for USD, yen for JPY); floats never appear.
type Payment struct {
	AmountMinor int64  `json:"amount_minor"`
	Currency    string `json:"currency"`
	Destination string `json:"destination"`
}

// Instruction is what a rail validates and dispatches. Producers fill the
// identity and payment fields; the relayer adds OutboxID, SequenceID,
// AttemptNo and AttemptID when it dispatches.
type Instruction struct {
	OutboxID       uuid.UUID
	InstructionID  string
	ParticipantID  string
	SequenceID     int64
	IdempotencyKey string
	RailType       string
	TenantID       string
	CorrelationID  string
	AttemptNo      int
	// AttemptID is the id of the dispatch's DISPATCHING row in the
	// archive (uuid.Nil outside a relayer): what `outbox audit trail`
	// shows for this attempt.
	AttemptID uuid.UUID

	// Payment is nil for event payment.
	Payment *Payment
	// Metadata is free JSON (an object, or empty). For event rails it is the
	// event body itself.
	Metadata json.RawMessage
}

// Payload is what the outbox stores for an instruction (JSON) and relayers
// decode at dispatch: the payment fields and the metadata.
type Payload struct {
	AmountMinor int64           `json:"amount_minor,omitempty"`
	Currency    string          `json:"currency,omitempty"`
	Destination string          `json:"destination,omitempty"`
	Metadata    json.RawMessage `json:"metadata,omitempty"`
}

// Payment returns the payment the payload describes, or nil when it has no
// money field at all (an event). With movesMoney (the rail's profile says
// so) it always returns one, so that validation reports what is missing.
func (p Payload) Payment(movesMoney bool) *Payment {
	if !movesMoney && p.AmountMinor == 0 && p.Currency == "" && p.Destination == "" {
		return nil
	}
	return &Payment{AmountMinor: p.AmountMinor, Currency: p.Currency, Destination: p.Destination}
}
