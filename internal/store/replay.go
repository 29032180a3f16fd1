package store

import (
	"context"
	"fmt"

	"github.com/gofrs/uuid/v5"
)

// Replay sends a dead letter back to pending with the same outbox and
// sequence id and a fresh retry budget (see budget.go), and archives a
// REPLAYED row naming the operator, in one statement. With ordering on it
// becomes its participant's next instruction again. It reports whether the
// dead letter existed.
func (s *Store) Replay(ctx context.Context, db Querier, outboxID uuid.UUID, operator string) (bool, error) {
	var n int
	if err := db.QueryRow(ctx, s.sql.replay, outboxID, operator).Scan(&n); err != nil {
		return false, fmt.Errorf("replay %s: %w", outboxID, err)
	}
	return n == 1, nil
}

const replaySQL = `
WITH d AS (
  DELETE FROM {schema}.dead_letters WHERE outbox_id = $1 RETURNING *
), requeued AS (
  INSERT INTO {schema}.pending (` + pendingColumns + `)
  SELECT ` + identityColumns + `, payload, ` + replayedCount + `, now(), created_at, NULL FROM d
), archived AS (
  INSERT INTO {schema}.attempts (` + archiveColumns + `)
  SELECT {schema}.uuidv7(), ` + identityColumns + `,
         payload, ` + replayedCount + `, 'REPLAYED', $2, NULL,
         now(), now(), now(), NULL, NULL, NULL,
         format('replayed by %s after %s', $2::text, error_code), NULL, false
  FROM d
)
SELECT count(*) FROM d`
