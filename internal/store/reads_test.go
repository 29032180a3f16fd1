package store_test

import (
	"testing"

	"github.com/jackc/pgx/v5"
)

// tableReads are a table's reads counted so far in a transaction (only
// differences between two readings in one transaction mean something; see
// readsOfPending).
type tableReads struct {
	seqTuples    int64 // rows read by sequential scans
	indexEntries int64 // entries its indexes returned
}

// readsOf reads tx's counters of each table (schema-qualified).
func readsOf(t *testing.T, tx pgx.Tx, tables ...string) []tableReads {
	t.Helper()
	r := make([]tableReads, len(tables))
	for i, table := range tables {
		if err := tx.QueryRow(t.Context(), `
SELECT pg_stat_get_xact_tuples_returned($1::regclass),
       (SELECT coalesce(sum(pg_stat_get_xact_tuples_returned(indexrelid)), 0) FROM pg_index WHERE indrelid = $1::regclass)`,
			table).Scan(&r[i].seqTuples, &r[i].indexEntries); err != nil {
			t.Fatal(err)
		}
	}
	return r
}
