package bench_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/ledgerline/outbox/internal/bench"
)

// TestDrainAsRoles: with Config.Roles a drain runs (as outbox_relayer,
// its grants and row-level security policies in force:
// TestConnectRolesLogsInAsTheRoles), keeps every invariant, and every line
// says so.
func TestDrainAsRoles(t *testing.T) {
	t.Parallel()
	pool := bench.SuperuserPool(t)
	var out bytes.Buffer
	results, err := bench.Run(t.Context(), bench.Config{
		Pool: pool, Out: &out, JSON: true, Roles: true, Ordered: []bool{true},
		Instructions: 300, Participants: 10, MaxConcurrency: 16, BatchSize: 20, FlushSize: 20,
	}, []string{"drain"})
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != 1 || !results[0].Roles || results[0].MsgsPerSec <= 0 {
		t.Fatalf("results %+v, want one drain as the roles", results)
	}
	var line map[string]any
	if err := json.Unmarshal(bytes.TrimSpace(out.Bytes()), &line); err != nil || line["roles"] != true {
		t.Fatalf("the line %q does not say roles (%v)", out.String(), err)
	}
	if strings.Contains(out.String(), `"roles":false`) {
		t.Fatalf("a line says it ran without the roles: %s", out.String())
	}
}
