package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// ErrPartitionMissing is returned by partition upkeep when a month it
// keeps could not be created (its rows are in the default partition).
var ErrPartitionMissing = errors.New("archive partition missing")

// EnsurePartitions creates the archive's monthly partitions for the current
// month and monthsAhead months after it. Idempotent. A month whose rows
// are already in the default partition cannot be created (the function
// only warns, so that the other months still are, and a warning reaches
// no log): it then returns ErrPartitionMissing naming the months missing,
// so that upkeep's failure is seen while that month's rows go on into the
// default partition.
func (s *Store) EnsurePartitions(ctx context.Context, db Querier, monthsAhead int) error {
	if _, err := db.Exec(ctx, s.sql.ensurePartitions, monthsAhead); err != nil {
		return fmt.Errorf("ensure partitions: %w", err)
	}
	var missing []string
	if err := db.QueryRow(ctx, missingPartitionsSQL, s.schema, monthsAhead).Scan(&missing); err != nil {
		return fmt.Errorf("ensure partitions: %w", err)
	}
	if len(missing) > 0 {
		return fmt.Errorf("ensure partitions: %w: %s (the default partition holds rows of those months; docs/operations.md, \"The archive's lifecycle\")",
			ErrPartitionMissing, strings.Join(missing, ", "))
	}
	return nil
}

const ensurePartitionsSQL = `SELECT {schema}.ensure_attempt_partitions($1)`

// missingPartitionsSQL names the months ensure_attempt_partitions keeps
// ($2 ahead, in UTC) that are not partitions of the schema $1's archive.
const missingPartitionsSQL = `
SELECT coalesce(array_agg(n.name ORDER BY i), '{}')
FROM generate_series(0, $2::int) i
CROSS JOIN LATERAL (SELECT 'attempts_' || to_char(date_trunc('month', now() AT TIME ZONE 'UTC') + make_interval(months => i), 'YYYY_MM') AS name) n
WHERE NOT EXISTS (SELECT 1 FROM pg_inherits h JOIN pg_class c ON c.oid = h.inhrelid JOIN pg_class p ON p.oid = h.inhparent
                  JOIN pg_namespace ns ON ns.oid = p.relnamespace
                  WHERE ns.nspname = $1 AND p.relname = 'attempts' AND c.relname = n.name)`
