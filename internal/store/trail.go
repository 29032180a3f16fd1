package store

import (
	"context"
	"fmt"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"
)

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

// Trail returns every archive row of an outbox id, oldest first.
func (s *Store) Trail(ctx context.Context, db Querier, outboxID uuid.UUID) ([]Attempt, error) {
	return s.trail(ctx, db, s.sql.trailByOutbox, outboxID)
}

// TrailByInstruction returns every archive row of a producer's instruction
// id (all outbox ids it was enqueued under), oldest first.
func (s *Store) TrailByInstruction(ctx context.Context, db Querier, instructionID string) ([]Attempt, error) {
	return s.trail(ctx, db, s.sql.trailByInstruction, instructionID)
}

func (s *Store) trail(ctx context.Context, db Querier, query string, arg any) ([]Attempt, error) {
	rows, err := db.Query(ctx, query, arg)
	if err != nil {
		return nil, fmt.Errorf("trail: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[Attempt])
}

// trailSQL selects an instruction's archive rows by the given condition.
func trailSQL(where string) string {
	return `SELECT ` + readArchiveColumns + ` FROM {schema}.archive WHERE ` + where + ` ORDER BY created_at, attempt_id`
}
