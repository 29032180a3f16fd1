package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// PendingRow is a pending instruction as stored.
type PendingRow struct {
	Identity
	Payload      []byte
	AttemptCount int
	// NextAttemptAt is when it is due; zero while it Waits.
	NextAttemptAt time.Time
	// Waits is true while, with ordering on, it waits for an earlier
	// instruction of its participant to end (stored as next_attempt_at =
	// 'infinity').
	Waits     bool
	CreatedAt time.Time
}

// PendingFilter selects pending instructions; empty fields match all.
type PendingFilter struct {
	InstructionID string
	ParticipantID string
	RailType      string
	Limit         int // 0: 1000
}

// ListPending returns the pending instructions that match f, by
// participant and sequence.
func (s *Store) ListPending(ctx context.Context, db Querier, f PendingFilter) ([]PendingRow, error) {
	if f.Limit <= 0 {
		f.Limit = 1000
	}
	rows, err := db.Query(ctx, s.sql.listPending, f.InstructionID, f.ParticipantID, f.RailType, f.Limit)
	if err != nil {
		return nil, fmt.Errorf("list pending: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (PendingRow, error) {
		var p PendingRow
		var tenant, corr *string
		var due *time.Time
		err := row.Scan(scanUUID(&p.OutboxID), &p.InstructionID, &p.ParticipantID, &p.SequenceID, &p.IdempotencyKey, &p.RailType,
			&tenant, &corr, &p.Payload, &p.AttemptCount, &due, &p.CreatedAt)
		p.TenantID, p.CorrelationID = deref(tenant), deref(corr)
		if due != nil {
			p.NextAttemptAt = *due
		} else {
			p.Waits = true
		}
		return p, err
	})
}

const listPendingSQL = `
SELECT ` + identityColumns + `, payload, attempt_count, nullif(next_attempt_at, 'infinity'), created_at
FROM {schema}.pending
WHERE ($1 = '' OR instruction_id = $1) AND ($2 = '' OR participant_id = $2) AND ($3 = '' OR rail_type = $3)
ORDER BY participant_id, sequence_id
LIMIT $4`
