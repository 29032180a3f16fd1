package store

import (
	"context"
	"fmt"

	"github.com/gofrs/uuid/v5"
)

// Acknowledge marks a dead letter as handled by an operator (it stays in
// the table as the instruction's final place). It reports whether an
// unacknowledged dead letter existed.
func (s *Store) Acknowledge(ctx context.Context, db Querier, outboxID uuid.UUID, operator string) (bool, error) {
	tag, err := db.Exec(ctx, s.sql.acknowledge, outboxID, operator)
	if err != nil {
		return false, fmt.Errorf("acknowledge %s: %w", outboxID, err)
	}
	return tag.RowsAffected() == 1, nil
}

const acknowledgeSQL = `
UPDATE {schema}.dead_letters SET acknowledged_at = now(), acknowledged_by = $2
WHERE outbox_id = $1 AND acknowledged_at IS NULL`
