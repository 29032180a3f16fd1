package store_test

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// tableReads are a table's reads counted so far in a transaction (only
// differences between two readings in one transaction mean something; see
// readsOfPending).
type tableReads struct {
	seqScans     int64 // sequential scans of the table
	seqTuples    int64 // rows read by sequential scans
	indexEntries int64 // entries its indexes returned
}

// readsOf reads tx's counters of each table (schema-qualified).
func readsOf(t *testing.T, tx pgx.Tx, tables ...string) []tableReads {
	t.Helper()
	r := make([]tableReads, len(tables))
	for i, table := range tables {
		if err := tx.QueryRow(t.Context(), `
SELECT pg_stat_get_xact_numscans($1::regclass), pg_stat_get_xact_tuples_returned($1::regclass),
       (SELECT coalesce(sum(pg_stat_get_xact_tuples_returned(indexrelid)), 0) FROM pg_index WHERE indrelid = $1::regclass)`,
			table).Scan(&r[i].seqScans, &r[i].seqTuples, &r[i].indexEntries); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

// statisticsOfEmpty gives each table (unqualified, in outbox) the
// statistics of a vacuumed empty table and keeps them: autovacuum off,
// then a vacuum while it is empty. The pre-sized tables keep their pages,
// so PostgreSQL records 0 rows on them and estimates one row whatever the
// table holds later, as after a drained queue was vacuumed before a
// backlog arrived. Call it before filling the tables, then
// wantStatisticsOfEmpty before measuring.
func statisticsOfEmpty(t *testing.T, db *pgxpool.Pool, tables ...string) {
	t.Helper()
	for _, table := range tables {
		if _, err := db.Exec(t.Context(), `ALTER TABLE outbox.`+table+` SET (autovacuum_enabled = false)`); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec(t.Context(), `VACUUM outbox.`+table); err != nil {
			t.Fatal(err)
		}
	}
}

// wantStatisticsOfEmpty fails the test unless each table's statistics
// still say 0 rows: a test of plans on those statistics would otherwise
// prove nothing.
func wantStatisticsOfEmpty(t *testing.T, db *pgxpool.Pool, tables ...string) {
	t.Helper()
	for _, table := range tables {
		var tuples float64
		if err := db.QueryRow(t.Context(), `SELECT reltuples FROM pg_class WHERE oid = $1::regclass`, "outbox."+table).Scan(&tuples); err != nil {
			t.Fatal(err)
		}
		if tuples != 0 {
			t.Fatalf("%s's statistics say %v rows, want the vacuumed empty table's 0", table, tuples)
		}
	}
}

// otherBacklogSQL fills pending with the backlog of participants a test
// does not look at: 20,000 instructions over 500 participants
// ("other-N"), the first 500 due and the rest waiting, enqueue-ordered
// outbox ids. A statement that reaches its own rows by key reads none of
// them.
const otherBacklogSQL = `
INSERT INTO outbox.pending (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
                            payload, attempt_count, next_attempt_at, created_at)
SELECT outbox.uuidv7(), 'w-' || g, 'other-' || (g % 500), g, 'w-' || g, 'sandbox', '{}', 0,
       CASE WHEN g <= 500 THEN now() ELSE 'infinity' END, now()
FROM generate_series(1, 20000) AS g`
