package store

import (
	"context"
	"fmt"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
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

// Trail returns every archive row of an outbox id, oldest first, all held
// at once: an instruction retried for days has thousands (see TrailAfter).
func (s *Store) Trail(ctx context.Context, db Querier, outboxID uuid.UUID) ([]Attempt, error) {
	return s.trail(ctx, db, s.sql.trailByOutbox, outboxID, Cursor{}, 0)
}

// TrailByInstruction returns every archive row of a producer's instruction
// id (all outbox ids it was enqueued under), oldest first, all held at
// once.
func (s *Store) TrailByInstruction(ctx context.Context, db Querier, instructionID string) ([]Attempt, error) {
	return s.trail(ctx, db, s.sql.trailByInstruction, instructionID, Cursor{}, 0)
}

// TrailAfter is one page of Trail: up to limit rows (0: every one) after
// the cursor (created_at, attempt_id) of the previous page's last row (the
// zero Cursor: from the first). CIRCUIT_OPEN, RELEASED and
// CUT_OFF_AT_STOP do not use up an instruction's retries and each replay
// gives it new ones, so its trail grows without bound through a long
// outage: the console and the API read it a page at a time.
func (s *Store) TrailAfter(ctx context.Context, db Querier, outboxID uuid.UUID, after Cursor, limit int) ([]Attempt, error) {
	return s.trail(ctx, db, s.sql.trailByOutbox, outboxID, after, limit)
}

// TrailByInstructionAfter is one page of TrailByInstruction, as TrailAfter.
func (s *Store) TrailByInstructionAfter(ctx context.Context, db Querier, instructionID string, after Cursor, limit int) ([]Attempt, error) {
	return s.trail(ctx, db, s.sql.trailByInstruction, instructionID, after, limit)
}

func (s *Store) trail(ctx context.Context, db Querier, query string, arg any, after Cursor, limit int) ([]Attempt, error) {
	at := pgtype.Timestamptz{Time: after.At, Valid: true}
	if after.At.IsZero() {
		at = pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
	}
	var lim *int // NULL: no limit
	if limit > 0 {
		lim = &limit
	}
	rows, err := db.Query(ctx, query, arg, at, after.ID, lim)
	if err != nil {
		return nil, fmt.Errorf("trail: %w", err)
	}
	attempts, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Attempt])
	if err != nil {
		return nil, fmt.Errorf("trail: %w", err)
	}
	return attempts, nil
}

// trailSQL selects an instruction's archive rows by the given condition
// ($1), after the keyset position ($2, $3), at most $4 (NULL: all).
func trailSQL(where string) string {
	return `SELECT ` + readArchiveColumns + ` FROM {schema}.archive WHERE ` + where +
		` AND (created_at, attempt_id) > ($2::timestamptz, $3::uuid) ORDER BY created_at, attempt_id LIMIT $4::int`
}
