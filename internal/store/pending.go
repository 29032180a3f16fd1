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
	q, args := s.sql.listPending, []any{f.Limit}
	switch {
	case f.InstructionID != "":
		q, args = s.sql.listPendingByInstruction, []any{f.InstructionID, f.ParticipantID, f.RailType, f.Limit}
	case f.ParticipantID != "":
		q, args = s.sql.listPendingByParticipant, []any{f.ParticipantID, f.RailType, f.Limit}
	case f.RailType != "":
		q, args = s.sql.listPendingByRail, []any{f.RailType, f.Limit}
	}
	rows, err := db.Query(ctx, q, args...)
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

// The listings of ListPending, one statement per filter that leads, Go
// choosing. With every filter optional in one statement (an empty
// parameter matching every row), its generic plan (a pool's connection
// may switch to it after five executions) used no index for any of them
// and read pending whole: 1,000,000 rows for one instruction
// (TestListPendingReadsItsRows). Each reads its rows through an index;
// the filters after the leading one only sift those rows.
const (
	listPendingSelect = `
SELECT ` + identityColumns + `, payload, attempt_count, nullif(next_attempt_at, 'infinity'), created_at`
	// No filter: the first $1 of the (participant, sequence) index.
	listPendingSQL = listPendingSelect + `
FROM {schema}.pending
ORDER BY participant_id, sequence_id
LIMIT $1`
	// An instruction id ($1): its outbox ids through the keys' index by
	// instruction id (one per tenant that used it), as its trail finds
	// them. Pending has no index by instruction id, and a pending
	// instruction's key is never retired.
	listPendingByInstructionSQL = listPendingSelect + `
FROM {schema}.pending
WHERE outbox_id IN (SELECT outbox_id FROM {schema}.idempotency_keys WHERE instruction_id = $1)
  AND instruction_id = $1 AND ($2 = '' OR participant_id = $2) AND ($3 = '' OR rail_type = $3)
ORDER BY participant_id, sequence_id
LIMIT $4`
	// A participant ($1): its range of the (participant, sequence) index.
	listPendingByParticipantSQL = listPendingSelect + `
FROM {schema}.pending
WHERE participant_id = $1 AND ($2 = '' OR rail_type = $2)
ORDER BY participant_id, sequence_id
LIMIT $3`
	// A rail alone ($1): its range of the due index, sorted (a subquery
	// the ORDER BY cannot reach into, OFFSET 0: or else the (participant,
	// sequence) index walked, every row of the other rails sifted out). It
	// reads every pending instruction of the rail: the answer, as
	// outboxtest asks it (no limit). The rail is a range of one value: for
	// an equality a generic plan estimates an average rail's share of
	// pending and read pending whole instead; a range of one value it
	// estimates as a sliver.
	listPendingByRailSQL = listPendingSelect + `
FROM (SELECT * FROM {schema}.pending WHERE rail_type >= $1 AND rail_type <= $1 OFFSET 0) p
ORDER BY participant_id, sequence_id
LIMIT $2`
)
