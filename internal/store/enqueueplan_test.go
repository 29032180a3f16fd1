package store_test

import (
	"strconv"
	"testing"

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
	conn, err := b.pool.Acquire(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	const calls = 20
	for i := range calls {
		if _, err := b.producer.Enqueue(b.ctx, conn, pending.Instruction{
			InstructionID: "ins-" + strconv.Itoa(i), ParticipantID: "p-" + strconv.Itoa(i%3), IdempotencyKey: "k-" + strconv.Itoa(i),
			RailType: "sandbox", AmountMinor: 100, Currency: "USD", Destination: "acct-1",
		}); err != nil {
			t.Fatal(err)
		}
	}
	rows, err := conn.Query(b.ctx, `SELECT left(regexp_replace(statement, '\s+', ' ', 'g'), 60), generic_plans, custom_plans
		FROM pg_prepared_statements WHERE statement LIKE '%outbox.idempotency_keys%' AND statement NOT LIKE '%pg_prepared_statements%'`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	seen := 0
	for rows.Next() {
		var (
			stmt            string
			generic, custom int64
		)
		if err := rows.Scan(&stmt, &generic, &custom); err != nil {
			t.Fatal(err)
		}
		seen++
		t.Logf("%s: %d generic, %d custom", stmt, generic, custom)
		if custom > 5 {
			t.Errorf("%q planned for %d of %d calls: want a cached generic plan after the first five", stmt, custom, calls)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if seen != 3 {
		t.Fatalf("%d enqueue statements prepared on the connection, want 3", seen)
	}
}
