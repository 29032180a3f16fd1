package store_test

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/internal/testdb"
)

// TestVerifyPlansIgnoreStaleStatistics: audit verify reads whole tables.
// With statistics taken while the tables were empty (as after a migration
// or a quiet night) the planner turned its checks into nested loops that
// compare every archive row with every other: 5 minutes for 100,000
// instructions instead of 3 seconds. No check may join by a nested loop
// whose inner side is anything but an index lookup.
func TestVerifyPlansIgnoreStaleStatistics(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	if _, err := b.pool.Exec(b.ctx, `ANALYZE outbox.attempts, outbox.pending, outbox.inflight, outbox.idempotency_keys, outbox.sequences, outbox.dead_letters`); err != nil {
		t.Fatal(err)
	}
	leases := map[string]time.Duration{"sandbox": longLease}
	for i := range 1000 {
		b.enqueue(t, "p-"+strconv.Itoa(i%50), "k-"+strconv.Itoa(i))
	}
	for {
		claimed, err := b.st.Claim(b.ctx, b.pool, store.ClaimParams{RelayerID: "r-0", Limit: 100, Leases: leases})
		if err != nil {
			t.Fatal(err)
		}
		if len(claimed) == 0 {
			break
		}
		outcomes := make([]store.Outcome, len(claimed))
		for i, c := range claimed {
			outcomes[i] = recordOutcome(t, c, "r-0", store.Dispatched)
		}
		if _, _, err := b.st.Record(b.ctx, b.pool, outcomes, store.HandoffParams{}); err != nil {
			t.Fatal(err)
		}
	}
	plans, err := b.st.VerifyPlans(b.ctx, b.pool)
	if err != nil {
		t.Fatal(err)
	}
	for i, plan := range plans {
		var root []struct{ Plan testdb.PlanNode }
		if err := json.Unmarshal(plan, &root); err != nil {
			t.Fatal(err)
		}
		if bad := badNestedLoop(root[0].Plan); bad != "" {
			t.Errorf("check %d: nested loop over %s:\n%s", i, bad, plan)
		}
		if bad := partialKeyJoin(root[0].Plan); bad != "" {
			t.Errorf("check %d: %s with a join filter (each group of its keys read again for every row of the other side):\n%s", i, bad, plan)
		}
	}
}

// partialKeyJoin returns the type of the first merge or hash join that
// matches on only some of its equality conditions and filters on the rest:
// "dispatch order" joined each sequence to its predecessor by participant
// alone, and with a few participants compared every sequence with every
// other (7.4 s after a drain of 50,000 instructions over 10 participants).
func partialKeyJoin(n testdb.PlanNode) string {
	return firstBad(n, func(n testdb.PlanNode) string {
		if (n.NodeType == "Merge Join" || n.NodeType == "Hash Join") && strings.Contains(n.JoinFilter, " = ") {
			return n.NodeType
		}
		return ""
	})
}

// badNestedLoop returns the inner node type of the first nested loop
// whose inner side is not an index lookup (or a one-row result).
func badNestedLoop(n testdb.PlanNode) string {
	return firstBad(n, func(n testdb.PlanNode) string {
		if n.NodeType == "Nested Loop" && len(n.Plans) == 2 {
			switch inner := n.Plans[1].NodeType; inner {
			case "Index Scan", "Index Only Scan", "Result":
			default:
				return inner
			}
		}
		return ""
	})
}

// firstBad returns what bad says of the first node of the plan, depth
// first, of which it says anything.
func firstBad(n testdb.PlanNode, bad func(testdb.PlanNode) string) string {
	if b := bad(n); b != "" {
		return b
	}
	for _, c := range n.Plans {
		if b := firstBad(c, bad); b != "" {
			return b
		}
	}
	return ""
}
