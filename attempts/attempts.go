// Package attempts owns the append-only archive: one row per state change of
// an instruction. It records outcomes, answers auditors' questions (the trail
// of an instruction) and verifies the system's invariants by query.
//
// The database rejects UPDATE, DELETE and TRUNCATE on the archive; retention
// drops whole monthly partitions.
package attempts

import (
	"context"
	"fmt"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ledgerline/outbox/migrations"
)

// State is the state an attempt row records.
type State string

// Attempt states.
const (
	// Dispatching: claimed by a relayer, about to be sent.
	Dispatching State = "DISPATCHING"
	// Dispatched: the rail accepted it (terminal).
	Dispatched State = "DISPATCHED"
	// Retryable: this attempt failed; the instruction is pending again.
	Retryable State = "RETRYABLE"
	// Failed: terminal failure; the instruction is a dead letter.
	Failed State = "FAILED"
	// ZombieRequeue: the relayer's lease expired; the reaper requeued it.
	ZombieRequeue State = "ZOMBIE_REQUEUE"
	// Replayed: an operator sent a dead letter back to pending.
	Replayed State = "REPLAYED"
)

// DB is the part of a connection this package uses; *pgxpool.Pool,
// *pgx.Conn and pgx.Tx satisfy it.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Attempt is one archive row.
type Attempt struct {
	AttemptID      uuid.UUID  `json:"attempt_id"`
	OutboxID       uuid.UUID  `json:"outbox_id"`
	InstructionID  string     `json:"instruction_id"`
	ParticipantID  string     `json:"participant_id"`
	SequenceID     int64      `json:"sequence_id"`
	IdempotencyKey string     `json:"idempotency_key"`
	RailType       string     `json:"rail"`
	TenantID       *string    `json:"tenant_id,omitempty"`
	CorrelationID  *string    `json:"correlation_id,omitempty"`
	AttemptNo      int        `json:"attempt_no"`
	State          State      `json:"state"`
	RelayerID      *string    `json:"relayer_id,omitempty"`
	ClaimAttemptID *uuid.UUID `json:"claim_attempt_id,omitempty"`
	ClaimedAt      time.Time  `json:"claimed_at"`
	CompletedAt    *time.Time `json:"completed_at,omitempty"`
	NextAttemptAt  *time.Time `json:"next_attempt_at,omitempty"`
	RailReference  *string    `json:"rail_reference,omitempty"`
	RailCode       *string    `json:"rail_code,omitempty"`
	ErrorCode      *string    `json:"error_code,omitempty"`
	ErrorMessage   *string    `json:"error_message,omitempty"`
	LatencyMS      *int       `json:"latency_ms,omitempty"`
	Late           bool       `json:"late"`
	CreatedAt      time.Time  `json:"created_at"`
}

// Archive reads the archive of one schema.
type Archive struct {
	schema string
}

// New returns an Archive for schema ("" means the default).
func New(schema string) (*Archive, error) {
	if err := migrations.ValidateSchema(schema); err != nil {
		return nil, err
	}
	return &Archive{schema: schema}, nil
}

const attemptColumns = `attempt_id, outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
	tenant_id, correlation_id, attempt_no, state, relayer_id, claim_attempt_id, claimed_at, completed_at,
	next_attempt_at, rail_reference, rail_code, error_code, error_message, latency_ms, late, created_at`

func scanAttempt(row pgx.CollectableRow) (Attempt, error) {
	var a Attempt
	err := row.Scan(&a.AttemptID, &a.OutboxID, &a.InstructionID, &a.ParticipantID, &a.SequenceID, &a.IdempotencyKey,
		&a.RailType, &a.TenantID, &a.CorrelationID, &a.AttemptNo, &a.State, &a.RelayerID, &a.ClaimAttemptID,
		&a.ClaimedAt, &a.CompletedAt, &a.NextAttemptAt, &a.RailReference, &a.RailCode, &a.ErrorCode,
		&a.ErrorMessage, &a.LatencyMS, &a.Late, &a.CreatedAt)
	return a, err
}

// Trail returns every attempt row of an instruction, oldest first.
func (a *Archive) Trail(ctx context.Context, db DB, outboxID uuid.UUID) ([]Attempt, error) {
	return a.query(ctx, db, "outbox_id = $1", outboxID)
}

// TrailByInstruction returns every attempt row of a producer's instruction
// id (all outbox ids it was enqueued under), oldest first.
func (a *Archive) TrailByInstruction(ctx context.Context, db DB, instructionID string) ([]Attempt, error) {
	return a.query(ctx, db, "instruction_id = $1", instructionID)
}

func (a *Archive) query(ctx context.Context, db DB, where string, arg any) ([]Attempt, error) {
	rows, err := db.Query(ctx, migrations.Qualify(a.schema,
		"SELECT "+attemptColumns+" FROM {schema}.attempts WHERE "+where+" ORDER BY created_at, attempt_id"), arg)
	if err != nil {
		return nil, fmt.Errorf("attempts: query trail: %w", err)
	}
	return pgx.CollectRows(rows, scanAttempt)
}

// EnsurePartitions creates the archive's monthly partitions for the current
// month and monthsAhead months after it. Idempotent.
func (a *Archive) EnsurePartitions(ctx context.Context, db DB, monthsAhead int) error {
	_, err := db.Exec(ctx, migrations.Qualify(a.schema, "SELECT {schema}.ensure_attempt_partitions($1)"), monthsAhead)
	if err != nil {
		return fmt.Errorf("attempts: ensure partitions: %w", err)
	}
	return nil
}
