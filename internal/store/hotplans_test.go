package store_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/ledgerline/outbox/internal/store"
)

// TestHotStatementsKeepGenericPlans: the claim, outcome and hand-off (with
// and without refill) statements run on the relayer's connections
// hundreds of times a second with arrays whose lengths change every call. Left to choose, PostgreSQL
// planned most calls afresh (1 to 1.5 ms each, more than running them);
// Claim and Record ask for the generic plan, so no call is planned after
// the statement is prepared. The batch sizes vary as a relayer's do.
func TestHotStatementsKeepGenericPlans(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	conn := b.conn(t)
	const participants = 12
	for i := range 4 * participants {
		b.enqueue(t, fmt.Sprintf("p-%d", i%participants), fmt.Sprintf("k-%d", i))
	}
	leases := map[string]time.Duration{"sandbox": time.Hour}
	var dispatched int
	for round, limit := range []int{1, 5, 2, 7, 3, 9, 4, 11} {
		claimed, err := b.st.Claim(b.ctx, conn, store.ClaimParams{RelayerID: "r1", Limit: limit, Leases: leases})
		if err != nil {
			t.Fatal(err)
		}
		// Each round also hands off, so the hand-off runs with varying
		// numbers of freed participants too.
		for len(claimed) > 0 {
			outcomes := make([]store.Outcome, len(claimed))
			for i, c := range claimed {
				outcomes[i] = recordOutcome(t, c, "r1", store.Dispatched)
			}
			_, handed, err := b.st.Record(b.ctx, conn, outcomes, store.HandoffParams{RelayerID: "r1", Limit: round % 3, Leases: leases,
				Refill: round%2 == 1})
			if err != nil {
				t.Fatal(err)
			}
			dispatched += len(outcomes)
			claimed = handed
		}
	}
	if dispatched < 20 {
		t.Fatalf("only %d outcomes recorded: the statements ran too few times to tell", dispatched)
	}
	plans := preparedPlans(t, conn, "outbox.inflight")
	for _, p := range plans {
		if p.custom > 0 || p.generic == 0 {
			t.Errorf("%q: %d generic and %d custom plans: want every call on the generic plan", p.stmt, p.generic, p.custom)
		}
	}
	if len(plans) != 4 {
		t.Fatalf("%d hot statements prepared on the connection, want 4 (claim, outcome, hand-off with and without refill)", len(plans))
	}
}
