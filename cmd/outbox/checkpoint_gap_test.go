package main

import (
	"bufio"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/ledgerline/outbox/internal/store"
)

// A checkpoint digests a bounded number of rows (migration 043; two here,
// outbox.checkpoint_max_rows = 2), so after a long time without
// one, "take the next one now" takes every one up to now (what archive
// detach asks for before it detaches a month), one JSON line each.
func TestAuditCheckpointClosesABacklog(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	if _, err := b.pool.Exec(b.ctx, `UPDATE outbox.settings SET chained_since = clock_timestamp() - interval '1 hour'`); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"k1", "k2", "k3"} { // three claims
		b.settle(t, store.Dispatched, key)
		time.Sleep(5 * time.Millisecond)
	}
	b.url += "&options=-c%20outbox.checkpoint_max_rows%3D2"

	r := b.cli(t, "", "audit", "--settle", "1ms", "checkpoint")
	requireExit(t, r, 0)
	var cps []store.Checkpoint
	sc := bufio.NewScanner(strings.NewReader(r.stdout))
	for sc.Scan() {
		var cp store.Checkpoint
		if err := json.Unmarshal(sc.Bytes(), &cp); err != nil {
			t.Fatalf("line %q: %v\n%s", sc.Text(), err, r)
		}
		cps = append(cps, cp)
	}
	var rows int64
	for _, c := range cps {
		rows += c.Rows
	}
	var behind time.Duration
	if err := b.pool.QueryRow(b.ctx, `SELECT clock_timestamp() - max(period_end) FROM outbox.checkpoints`).Scan(&behind); err != nil {
		t.Fatal(err)
	}
	if len(cps) < 3 || rows != 6 || behind > 5*time.Second {
		t.Errorf("%d checkpoints digest %d rows and end %s ago, want one per claim and its outcome, the 6 rows, up to now\n%s", len(cps), rows, behind, r)
	}
}
