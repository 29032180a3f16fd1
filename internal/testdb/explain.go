package testdb

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/jackc/pgx/v5"
)

// PlanNode is the part of an EXPLAIN (FORMAT JSON) plan node that plan
// tests read.
type PlanNode struct {
	NodeType   string     `json:"Node Type"`
	Relation   string     `json:"Relation Name"`
	Operation  string     `json:"Operation"`
	JoinFilter string     `json:"Join Filter"`
	Plans      []PlanNode `json:"Plans"`
}

// Explain plans query with args on db and returns every node of the plan,
// depth first, and the plan's JSON for failure messages.
func Explain(t testing.TB, db interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, query string, args ...any) ([]PlanNode, string) {
	t.Helper()
	var plan []byte
	if err := db.QueryRow(t.Context(), "EXPLAIN (FORMAT JSON) "+query, args...).Scan(&plan); err != nil {
		t.Fatal(err)
	}
	var root []struct {
		Plan PlanNode `json:"Plan"`
	}
	if err := json.Unmarshal(plan, &root); err != nil || len(root) != 1 {
		t.Fatalf("decode plan (%v): %s", err, plan)
	}
	var nodes []PlanNode
	var walk func(PlanNode)
	walk = func(n PlanNode) {
		nodes = append(nodes, n)
		for _, c := range n.Plans {
			walk(c)
		}
	}
	walk(root[0].Plan)
	return nodes, string(plan)
}
