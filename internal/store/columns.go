package store

import (
	"strings"

	"github.com/gofrs/uuid/v5"
)

// Identity is what identityColumns hold: who an instruction is and what it
// asks of its rail. Claims, outcomes and pending rows carry it.
type Identity struct {
	OutboxID       uuid.UUID
	InstructionID  string
	ParticipantID  string
	SequenceID     int64
	IdempotencyKey string
	RailType       string
	TenantID       string // "" for none
	CorrelationID  string // "" for none
}

// The column lists of the tables, written once. Every INSERT names its
// target columns with one of these lists and supplies its values in the
// same order.

// identityColumns identify an instruction and say what it asks of its
// rail. Every table that holds an instruction carries them: pending,
// inflight, dead_letters, and every archive row.
const identityColumns = `outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type, tenant_id, correlation_id`

// pendingColumns are the pending table's: the identity, the payload, the
// retry budget used so far (see budget.go), when the instruction is due,
// its first enqueue (kept across retries), and, on a copy the reaper
// requeued, the abandoned claim (the only claim whose late outcome may
// withdraw it).
const pendingColumns = identityColumns + `, payload, attempt_count, next_attempt_at, created_at, zombie_attempt_id`

// inflightColumns are the inflight table's: the identity, payload and first
// enqueue (everything needed to requeue it without reading the archive),
// and the claim: its DISPATCHING attempt, number, relayer, whether it counts
// for per-participant ordering, and the lease.
const inflightColumns = identityColumns + `, payload, created_at, attempt_id, attempt_no, relayer_id, ordered, claimed_at, lease_until`

// deadLetterColumns are the dead_letters table's (acknowledged_at and
// acknowledged_by are set later, by an operator; failed_at defaults to
// now()).
const deadLetterColumns = identityColumns + `, payload, attempt_count, error_code, error_message, attempt_id, created_at`

// archiveColumns are the attempts table's (created_at, the partition key,
// defaults to clock_timestamp()). Every archive row states every column,
// NULL where it does not apply: payload is on DISPATCHING and REPLAYED rows
// only; claim_attempt_id, completed_at and the rail's answer on the rows
// that close a claim.
const archiveColumns = `attempt_id, ` + identityColumns + `, payload, attempt_no, state, relayer_id, claim_attempt_id,
  claimed_at, completed_at, next_attempt_at, rail_reference, rail_code, error_code, error_message, latency_ms, late`

// chainedArchiveColumns are what every archive insert writes: the
// archiveColumns, the row's time (created_at, stated rather than defaulted
// because the row's hash covers it) and its link in the instruction's hash
// chain (see attemptHash).
const chainedArchiveColumns = archiveColumns + `, created_at, prev_hash, hash`

// attemptHash renders the hash of one archive row: prev is the hash of the
// row it follows (a hot row's chain_head; NULL for an instruction's first
// row), values are its archiveColumns values, in that order, and createdAt
// its time. Writers compute it once per row in a CTE, insert it with the
// row, and carry it forward as the hot row's chain_head, so recording never
// reads the archive. The encoding is the migration's attempt_hash (007).
func attemptHash(prev, values, createdAt string) string {
	return `{schema}.attempt_hash(` + prev + `, ` + values + `, ` + createdAt + `)`
}

// readArchiveColumns is what reads of the archive return (see scanAttempt).
const readArchiveColumns = `attempt_id, ` + identityColumns + `, attempt_no, state, relayer_id, claim_attempt_id,
  claimed_at, completed_at, next_attempt_at, rail_reference, rail_code, error_code, error_message, latency_ms, late, created_at`

// from renders a column list as values taken from the relation alias:
// from("f", "a, b") is "f.a, f.b".
func from(alias, columns string) string {
	parts := strings.Split(columns, ",")
	for i, p := range parts {
		parts[i] = alias + "." + strings.TrimSpace(p)
	}
	return strings.Join(parts, ", ")
}
