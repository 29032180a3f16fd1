package store_test

import (
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/pending"
)

// TestSingleEnqueueKeepsGenericPlans: one instruction per business
// transaction is the common case. Its statements must be planned once per
// connection, not on every call: with array parameters PostgreSQL cannot
// know a generic plan's row counts and replanned every enqueue (0.3 ms of
// its 0.5 ms of database time), so the one-instruction form uses scalar
// parameters (ARRAY[$n]).
func TestSingleEnqueueKeepsGenericPlans(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	conn := b.conn(t)
	const calls = 20
	for i := range calls {
		if _, err := b.producer.Enqueue(b.ctx, conn, pending.Instruction{
			InstructionID: "ins-" + strconv.Itoa(i), ParticipantID: "p-" + strconv.Itoa(i%3), IdempotencyKey: "k-" + strconv.Itoa(i),
			RailType: "sandbox", AmountMinor: 100, Currency: "USD", Destination: "acct-1",
		}); err != nil {
			t.Fatal(err)
		}
	}
	plans := preparedPlans(t, conn, "outbox.idempotency_keys")
	for _, p := range plans {
		if p.custom > 5 {
			t.Errorf("%q planned for %d of %d calls: want a cached generic plan after the first five", p.stmt, p.custom, calls)
		}
	}
	if len(plans) != 3 {
		t.Fatalf("%d enqueue statements prepared on the connection, want 3", len(plans))
	}
}

// preparedPlan is how often one statement prepared on a connection was
// planned generically and custom.
type preparedPlan struct {
	stmt            string
	generic, custom int64
}

// preparedPlans lists the statements prepared on conn that mention table
// (schema-qualified), with their plan counts, and logs them.
func preparedPlans(t *testing.T, conn *pgxpool.Conn, table string) []preparedPlan {
	t.Helper()
	rows, err := conn.Query(t.Context(), `SELECT left(regexp_replace(statement, '\s+', ' ', 'g'), 70), generic_plans, custom_plans
		FROM pg_prepared_statements
		WHERE strpos(statement, $1) > 0 AND statement NOT LIKE '%pg_prepared_statements%'`, table)
	if err != nil {
		t.Fatal(err)
	}
	plans, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (preparedPlan, error) {
		var p preparedPlan
		err := row.Scan(&p.stmt, &p.generic, &p.custom)
		return p, err
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range plans {
		t.Logf("%s: %d generic, %d custom", p.stmt, p.generic, p.custom)
	}
	return plans
}
