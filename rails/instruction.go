// Package rails is the edge where money leaves the system: the [Rail] contract,
// payment validation per rail profile, the error taxonomy that turns a rail's
// explicit answer into an outcome, circuit breakers, and the built-in rails.
//
// Nothing in this package decides anything by matching error text: a rail
// answers with an explicit code, and a per-rail [CodeTable] maps that code to
// an [Outcome] and an [ErrorCode].
package rails

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
// identity and payment fields; the relayer adds OutboxID, SequenceID and
// AttemptNo when it dispatches.
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

	// Payment is nil for event rails.
	Payment *Payment
	// Metadata is free JSON (an object, or empty). For event rails it is the
	// event body itself.
	Metadata json.RawMessage
}
