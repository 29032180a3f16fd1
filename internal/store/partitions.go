package store

import (
	"context"
	"fmt"
)

// EnsurePartitions creates the archive's monthly partitions for the current
// month and monthsAhead months after it. Idempotent.
func (s *Store) EnsurePartitions(ctx context.Context, db Querier, monthsAhead int) error {
	if _, err := db.Exec(ctx, s.sql.ensurePartitions, monthsAhead); err != nil {
		return fmt.Errorf("ensure partitions: %w", err)
	}
	return nil
}

const ensurePartitionsSQL = `SELECT {schema}.ensure_attempt_partitions($1)`
