// Package payment is what a rail is sent: the [Instruction] and its
// [Payment] in integer minor units, the [Payload] the outbox stores for it,
// the validation [Profile] of each kind of rail (ACH, SEPA, wire, generic,
// event), money parsing, and the [ValidationError] that names the field at
// fault. Producers validate with it before anything is written; relayers
// validate again before a rail is called.
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

	// Payment is nil for an event (a rail whose profile moves no money).
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
