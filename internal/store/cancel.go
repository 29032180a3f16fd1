package store

import (
	"context"
	"fmt"

	"github.com/gofrs/uuid/v5"
)

// Cancel removes a pending instruction so that it is never sent, and
// archives a CANCELLED row saying who and why, through the schema's
// cancel_pending function (migration 020). An instruction in flight is not
// pending (its rail call may be under way): Cancel reports false for it,
// as for one already settled. With ordering on, cancelling a participant's
// head makes its next instruction due. The key stays: enqueueing the
// instruction again answers with its receipt.
func (s *Store) Cancel(ctx context.Context, db Querier, outboxID uuid.UUID, operator, reason string) (bool, error) {
	if err := checkOperator(operator, reason); err != nil {
		return false, err
	}
	var n int64
	if err := db.QueryRow(ctx, s.sql.cancel, outboxID, operator, reason).Scan(&n); err != nil {
		return false, fmt.Errorf("cancel %s: %w", outboxID, err)
	}
	return n == 1, nil
}

const cancelSQL = `SELECT {schema}.cancel_pending($1, $2, $3)`
