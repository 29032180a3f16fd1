package attempts

import (
	"context"
	"fmt"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"

	"github.com/ledgerline/outbox/migrations"
)

// DeadLetter is an instruction that failed terminally.
type DeadLetter struct {
	OutboxID       uuid.UUID  `json:"outbox_id"`
	InstructionID  string     `json:"instruction_id"`
	ParticipantID  string     `json:"participant_id"`
	SequenceID     int64      `json:"sequence_id"`
	RailType       string     `json:"rail"`
	TenantID       *string    `json:"tenant_id,omitempty"`
	CorrelationID  *string    `json:"correlation_id,omitempty"`
	AttemptCount   int        `json:"attempt_count"`
	ErrorCode      string     `json:"error_code"`
	ErrorMessage   *string    `json:"error_message,omitempty"`
	EnqueuedAt     time.Time  `json:"enqueued_at"`
	FailedAt       time.Time  `json:"failed_at"`
	AcknowledgedAt *time.Time `json:"acknowledged_at,omitempty"`
	AcknowledgedBy *string    `json:"acknowledged_by,omitempty"`
}

// DeadLetters lists dead letters, oldest failure first; acknowledged ones
// only when all is true.
func (a *Archive) DeadLetters(ctx context.Context, db DB, all bool, limit int) ([]DeadLetter, error) {
	rows, err := db.Query(ctx, migrations.Qualify(a.schema, `
		SELECT outbox_id, instruction_id, participant_id, sequence_id, rail_type, tenant_id, correlation_id,
		       attempt_count, error_code, error_message, created_at, failed_at, acknowledged_at, acknowledged_by
		FROM {schema}.dead_letters WHERE $1 OR acknowledged_at IS NULL
		ORDER BY failed_at, outbox_id LIMIT $2`), all, limit)
	if err != nil {
		return nil, fmt.Errorf("attempts: dead letters: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[DeadLetter])
}

// Replay sends a dead letter back to pending with the same outbox and
// sequence id and a fresh retry budget, and archives a REPLAYED row naming
// the operator. With ordering on it becomes its participant's next
// instruction again. It reports whether the dead letter existed.
func (a *Archive) Replay(ctx context.Context, db DB, outboxID uuid.UUID, operator string) (bool, error) {
	var n int
	err := db.QueryRow(ctx, migrations.Qualify(a.schema, `
		WITH d AS (
		  DELETE FROM {schema}.dead_letters WHERE outbox_id = $1 RETURNING *
		), requeued AS (
		  INSERT INTO {schema}.pending (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
		                                tenant_id, correlation_id, payload, attempt_count, next_attempt_at, created_at)
		  SELECT outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
		         tenant_id, correlation_id, payload, 0, now(), created_at FROM d
		), archived AS (
		  INSERT INTO {schema}.attempts (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
		                                 tenant_id, correlation_id, payload, attempt_no, state, relayer_id, claimed_at,
		                                 completed_at, next_attempt_at, error_message)
		  SELECT outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
		         tenant_id, correlation_id, payload, 0, 'REPLAYED', $2, now(), now(), now(),
		         format('replayed by %s after %s', $2::text, error_code)
		  FROM d
		)
		SELECT count(*) FROM d`), outboxID, operator).Scan(&n)
	if err != nil {
		return false, fmt.Errorf("attempts: replay %s: %w", outboxID, err)
	}
	return n == 1, nil
}

// Acknowledge marks a dead letter as handled by an operator (it stays in
// the table as the instruction's final place). It reports whether an
// unacknowledged dead letter existed.
func (a *Archive) Acknowledge(ctx context.Context, db DB, outboxID uuid.UUID, operator string) (bool, error) {
	tag, err := db.Exec(ctx, migrations.Qualify(a.schema, `
		UPDATE {schema}.dead_letters SET acknowledged_at = now(), acknowledged_by = $2
		WHERE outbox_id = $1 AND acknowledged_at IS NULL`), outboxID, operator)
	if err != nil {
		return false, fmt.Errorf("attempts: acknowledge %s: %w", outboxID, err)
	}
	return tag.RowsAffected() == 1, nil
}
