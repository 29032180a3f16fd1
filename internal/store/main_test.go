package store_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ledgerline/outbox/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// execer is what runs a statement: a pool, a connection or a transaction.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// execAll runs each statement on db in turn and stops the test at the
// first that fails.
func execAll(t *testing.T, db execer, statements ...string) {
	t.Helper()
	for _, q := range statements {
		if _, err := db.Exec(t.Context(), q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}
