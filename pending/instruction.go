package pending

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/gofrs/uuid/v5"

	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/payment"
)

// Instruction is what a producer enqueues: who, what, where to, and the keys
// that make it safe to submit twice.
type Instruction struct {
	// InstructionID is the producer's id for the instruction (required).
	InstructionID string
	// ParticipantID is whose instructions are kept in order (required).
	ParticipantID string
	// IdempotencyKey identifies the instruction forever, per TenantID
	// (required), and is sent to the rail, which deduplicates by it. A key
	// belongs to one InstructionID: enqueued again under another, it is
	// refused with a [*MismatchError], since the rail would answer the
	// second instruction as a repeat of the first and it would be recorded
	// as dispatched unpaid. And an InstructionID has one key: enqueued
	// again under another, it is refused with an [*InstructionReusedError],
	// since the rail would pay it once per key. The same key and
	// instruction id again is a duplicate (the original receipt), with
	// another payload a mismatch. Derive the key from the instruction
	// ([DeterministicKey]); never make a new one for a retry.
	IdempotencyKey string
	// RailType names the rail, e.g. "sandbox", "ach", "event" (required).
	RailType string
	// TenantID scopes idempotency keys per tenant (optional).
	TenantID string
	// CorrelationID is carried into every attempt row and log line (optional).
	CorrelationID string

	// Payment, required for rails that move money and absent for event
	// rails: integer minor units (cents), an ISO 4217 code, a destination in
	// the rail's format.
	AmountMinor int64
	Currency    string
	Destination string

	// Metadata is free JSON (an object). For event rails it is the event.
	Metadata json.RawMessage
}

// Receipt is the result of an enqueue.
type Receipt struct {
	OutboxID   uuid.UUID `json:"outbox_id"`
	SequenceID int64     `json:"sequence_id"`
	// Duplicate is true when the instruction was already enqueued (same
	// key, same payload): this is the original receipt, nothing was written.
	Duplicate bool `json:"duplicate"`
}

// ErrIdempotencyMismatch is returned when an idempotency key is reused with
// a different payload, or by another instruction id (a [*MismatchError]),
// and when an instruction id is enqueued under a key other than its own
// (an [*InstructionReusedError], which is also [ErrInstructionIDReused]).
// Nothing is written. Its text names none of the cases; the detail errors
// say which.
var ErrIdempotencyMismatch = errors.New("idempotency key mismatch")

// ErrInstructionIDReused is returned when an instruction id is enqueued
// under an idempotency key other than the one it already has in its
// tenant (migration 030): the rails deduplicate by the key, so a second
// key would be a second payment of the instruction (a producer that makes
// a new key for each retry pays once per retry). Nothing is written. Its
// detail, [*InstructionReusedError], is also [ErrIdempotencyMismatch], so
// a caller that treats every mismatch as a refusal for good needs no
// change.
var ErrInstructionIDReused = errors.New("instruction id already enqueued under another idempotency key")

// InstructionReusedError details an [ErrInstructionIDReused]; errors.Is
// finds both ErrInstructionIDReused and [ErrIdempotencyMismatch] in it.
type InstructionReusedError struct {
	InstructionID  string
	IdempotencyKey string // the key this enqueue named
	TenantID       string
	// OwnerKey is the key the instruction id already has.
	OwnerKey string
	// OutboxID is the instruction enqueued under OwnerKey; uuid.Nil when
	// OwnerKey is an earlier line of the same batch (which, the batch
	// failing, is not enqueued either).
	OutboxID uuid.UUID
}

// Error names the instruction, both keys and, when it was enqueued, the
// outbox id of the key it has.
func (e *InstructionReusedError) Error() string {
	if e.OutboxID.IsNil() {
		return fmt.Sprintf("%v: instruction %q: key %q, but an earlier line of the batch gives it key %q; an instruction may have one key only",
			ErrInstructionIDReused, e.InstructionID, e.IdempotencyKey, e.OwnerKey)
	}
	return fmt.Sprintf("%v: instruction %q: key %q, but it was enqueued under key %q (outbox id %s); an instruction may have one key only",
		ErrInstructionIDReused, e.InstructionID, e.IdempotencyKey, e.OwnerKey, e.OutboxID)
}

// Unwrap makes errors.Is find ErrInstructionIDReused and
// ErrIdempotencyMismatch.
func (e *InstructionReusedError) Unwrap() []error {
	return []error{ErrInstructionIDReused, ErrIdempotencyMismatch}
}

// MismatchError details an [ErrIdempotencyMismatch].
type MismatchError struct {
	InstructionID  string
	IdempotencyKey string
	// OutboxID is the instruction the key already belongs to; uuid.Nil
	// when that is an earlier line of the same batch (which, the batch
	// failing, is not enqueued either).
	OutboxID uuid.UUID
	// Owner is the instruction id the key belongs to when it is not
	// InstructionID; "" when the key is this instruction's own, enqueued
	// with another payload.
	Owner string
}

// Error names the instruction, its key and what the key already belongs
// to: another instruction id, or this one with another payload.
func (e *MismatchError) Error() string {
	switch {
	case e.OutboxID.IsNil() && e.Owner != "":
		return fmt.Sprintf("%v: instruction %q: key %q, but an earlier line of the batch gives it to instruction %q; a key may name one instruction only",
			ErrIdempotencyMismatch, e.InstructionID, e.IdempotencyKey, e.Owner)
	case e.OutboxID.IsNil():
		return fmt.Sprintf("%v: instruction %q: key %q, but an earlier line of the batch enqueues it with a different payload; lines of one key must agree",
			ErrIdempotencyMismatch, e.InstructionID, e.IdempotencyKey)
	case e.Owner != "":
		return fmt.Sprintf("%v: instruction %q: key %q already belongs to instruction %q (outbox id %s); a key may name one instruction only",
			ErrIdempotencyMismatch, e.InstructionID, e.IdempotencyKey, e.Owner, e.OutboxID)
	default:
		return fmt.Sprintf("%v: instruction %q: key %q was enqueued with a different payload (outbox id %s); a retry must send the same one",
			ErrIdempotencyMismatch, e.InstructionID, e.IdempotencyKey, e.OutboxID)
	}
}

// Unwrap makes errors.Is(err, ErrIdempotencyMismatch) work.
func (e *MismatchError) Unwrap() error { return ErrIdempotencyMismatch }

// ErrReadOnly is returned when the database refuses an enqueue's write as
// read-only (SQLSTATE 25006, which the error also holds): the caller's
// transaction is READ ONLY, its session defaults to read-only
// (default_transaction_read_only), or the connection reached a standby
// (a pool that did not follow a failover: connect with
// target_session_attrs=read-write). Nothing is written. The same
// instruction enqueued again in a writable transaction goes through; on
// the same connection it fails alike. A batch's savepoint keeps the
// caller's transaction usable; after a single [Producer.Enqueue] it is
// aborted, as after any statement PostgreSQL refuses, and must be rolled
// back.
var ErrReadOnly = errors.New("the database refused the enqueue as read-only")

// ErrPermissionDenied is returned when the database refuses an enqueue
// for want of a privilege (SQLSTATE 42501, which the error also holds):
// the session's role may not enqueue for the instruction's tenant (a
// producer bound to other tenants, migrations 036 and 038, or whose
// outbox.tenant names another), or lacks the outbox's grants (not a
// member of outbox_producer). Nothing is written, and the same enqueue
// under the same role fails alike: a configuration to fix, not a retry.
// A batch's savepoint keeps the caller's transaction usable; after a
// single [Producer.Enqueue] it is aborted, as after any statement
// PostgreSQL refuses, and must be rolled back (the enqueue takes no
// savepoint of its own: that would be a round trip more on every
// enqueue).
var ErrPermissionDenied = errors.New("the database refused the enqueue for want of a privilege")

// ErrSchemaBehind is returned when the database's outbox schema is older
// than this producer's statements need: run `outbox migrate` (it is
// checked once per Producer, and nothing is written).
var ErrSchemaBehind = errors.New("outbox schema is older than this producer")

// SchemaError details an [ErrSchemaBehind].
type SchemaError struct {
	Schema  string
	Version int32 // the schema's migration version; 0: never migrated
	Needed  int32
}

// Error names the schema, its version and the version needed.
func (e *SchemaError) Error() string {
	return fmt.Sprintf("%v: schema %s is at version %d, this producer needs %d: run `outbox migrate`",
		ErrSchemaBehind, e.Schema, e.Version, e.Needed)
}

// Unwrap makes errors.Is(err, ErrSchemaBehind) work.
func (e *SchemaError) Unwrap() error { return ErrSchemaBehind }

// ErrKeyWithoutInstruction is returned when an idempotency key was
// inserted without its instruction: a key row with no sequence id, which
// only a hand-made insert leaves (an enqueue inserts the key and its
// instruction in one transaction, and producers may insert keys). No
// enqueue can use the key: it names an outbox id nothing was enqueued
// under, which must not become a payment. Nothing is written; ask the
// database's owner to look at the row (docs/audit.md).
var ErrKeyWithoutInstruction = errors.New("idempotency key was inserted without its instruction")

// KeyWithoutInstructionError details an [ErrKeyWithoutInstruction].
type KeyWithoutInstructionError struct {
	InstructionID  string
	IdempotencyKey string
	OutboxID       uuid.UUID // the outbox id the key row names
}

// Error names the instruction, its key and the outbox id of the key row.
func (e *KeyWithoutInstructionError) Error() string {
	return fmt.Sprintf("%v: instruction %q: key %q names outbox id %s, under which nothing was enqueued",
		ErrKeyWithoutInstruction, e.InstructionID, e.IdempotencyKey, e.OutboxID)
}

// Unwrap makes errors.Is(err, ErrKeyWithoutInstruction) work.
func (e *KeyWithoutInstructionError) Unwrap() error { return ErrKeyWithoutInstruction }

// ErrKeyRetired is returned when an idempotency key was retired: the
// instruction it names ended (dispatched, cancelled, or its dead letter
// acknowledged) in an archive month since detached (`outbox archive
// detach`), and the key is kept only in compact form, which refuses that
// instruction under it forever but no longer holds the original receipt
// (another instruction id may take the key). Nothing is written. The
// instruction's trail is in the detached archive, under the error's
// outbox id.
var ErrKeyRetired = store.ErrKeyRetired

// RetiredError details an [ErrKeyRetired].
type RetiredError struct {
	InstructionID  string
	IdempotencyKey string
	OutboxID       uuid.UUID // the instruction the key belonged to
}

// Error names the instruction, its key and the outbox id of the
// instruction the key named.
func (e *RetiredError) Error() string {
	return fmt.Sprintf("%v: instruction %q key %q was used by outbox id %s, enqueued before the retention horizon",
		ErrKeyRetired, e.InstructionID, e.IdempotencyKey, e.OutboxID)
}

// Unwrap makes errors.Is(err, ErrKeyRetired) work.
func (e *RetiredError) Unwrap() error { return ErrKeyRetired }

// ErrBatchTooLarge is returned by [Producer.EnqueueBatch] for a batch of
// more than [MaxBatchSize] instructions or more than
// [MaxBatchPayloadBytes] of payload (a [*BatchTooLargeError] says which),
// before anything is sent: nothing is written and the caller's
// transaction is untouched. Split the batch (each part in the same
// transaction, or each in its own) and enqueue the parts.
var ErrBatchTooLarge = errors.New("enqueue batch is too large")

// BatchTooLargeError details an [ErrBatchTooLarge].
type BatchTooLargeError struct {
	// Instructions is the batch's length.
	Instructions int
	// PayloadBytes is the size of the batch's payloads as stored (as
	// [Config].MaxPayloadBytes counts them), up to the line that went past
	// the limit; 0 when the batch was refused for its length alone.
	PayloadBytes int
	// MaxInstructions and MaxPayloadBytes are the limits it went past.
	MaxInstructions, MaxPayloadBytes int
}

// Error says which limit the batch went past.
func (e *BatchTooLargeError) Error() string {
	if e.PayloadBytes == 0 {
		return fmt.Sprintf("%v: %d instructions, at most %d go in one batch: split it", ErrBatchTooLarge, e.Instructions, e.MaxInstructions)
	}
	return fmt.Sprintf("%v: its payloads take more than %d bytes as stored (%d by the line that went past), at most %d go in one batch: split it",
		ErrBatchTooLarge, e.MaxPayloadBytes, e.PayloadBytes, e.MaxPayloadBytes)
}

// Unwrap makes errors.Is(err, ErrBatchTooLarge) work.
func (e *BatchTooLargeError) Unwrap() error { return ErrBatchTooLarge }

// BatchError says which instruction of a batch failed; nothing of the batch
// was written.
type BatchError struct {
	Index int
	Err   error
}

// Error names the instruction's index in the batch and its error.
func (e *BatchError) Error() string { return fmt.Sprintf("instruction %d: %v", e.Index, e.Err) }

// Unwrap returns the instruction's error.
func (e *BatchError) Unwrap() error { return e.Err }

// RailInstruction is the rail's view of an instruction (without the
// identity the relayer adds at dispatch).
func (in Instruction) RailInstruction(movesMoney bool) payment.Instruction {
	return payment.Instruction{
		InstructionID:  in.InstructionID,
		ParticipantID:  in.ParticipantID,
		IdempotencyKey: in.IdempotencyKey,
		RailType:       in.RailType,
		TenantID:       in.TenantID,
		CorrelationID:  in.CorrelationID,
		Metadata:       in.Metadata,
		Payment:        in.payload(in.Metadata).Payment(movesMoney),
	}
}

// payload is what is stored for the instruction, with meta as its metadata.
func (in Instruction) payload(meta json.RawMessage) payment.Payload {
	return payment.Payload{AmountMinor: in.AmountMinor, Currency: in.Currency, Destination: in.Destination, Metadata: meta}
}

// prepared is a validated instruction with its encoded payload and hash.
type prepared struct {
	in       Instruction
	outboxID uuid.UUID
	payload  []byte
	size     int // the payload's size as stored (see prepare)
	hash     []byte
	// asGivenHash is the hash over the payload with its numbers as given,
	// as builds before the numbers were hashed as stored computed it; nil
	// when no number is written otherwise when stored (the same hash).
	asGivenHash []byte
}

// canonicalJSON re-encodes a JSON object with sorted keys and no
// insignificant whitespace, so equal metadata hashes equally however the
// producer formatted it.
func canonicalJSON(raw json.RawMessage) (json.RawMessage, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	return json.Marshal(v)
}

// payloadHash identifies what an idempotency key promised: everything that
// changes what the rail would be asked to do. The correlation id is left out
// on purpose (a retried request may carry a new trace). The caller passes
// the payload with its numbers as stored ([strictjson.NumbersInFull]), so
// that two spellings of one number (1e2, 100) are one payload, as they
// are to the rail, which is sent what jsonb stored.
func payloadHash(in Instruction, payload []byte) []byte {
	h := sha256.New()
	for _, s := range []string{in.ParticipantID, in.RailType, in.TenantID} {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	h.Write(payload)
	return h.Sum(nil)
}
