package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/ledgerline/outbox/internal/store"
)

// TestAuditTrailAcrossPages: audit trail reads a trail a page (trailPage
// rows) at a time; a trail longer than a page, whose rows share their
// created_at across the page boundary, prints every row once, oldest
// first, by outbox id and by instruction id.
func TestAuditTrailAcrossPages(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	claims := b.settle(t, store.Dispatched, "k1")
	id := claims[0].OutboxID
	// Copies of its DISPATCHED row, two at each instant: a page boundary
	// falls inside a tie of created_at.
	extra := trailPage + 10
	if _, err := b.pool.Exec(b.ctx, `
INSERT INTO outbox.attempts
SELECT (jsonb_populate_record(NULL::outbox.attempts, to_jsonb(a) || jsonb_build_object(
          'attempt_id', gen_random_uuid(), 'created_at', a.created_at + (g / 2) * interval '1 millisecond'))).*
FROM outbox.attempts a, generate_series(1, $2) g
WHERE a.outbox_id = $1 AND a.state = 'DISPATCHED'`, id, extra); err != nil {
		t.Fatal(err)
	}
	var want int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox.attempts WHERE outbox_id = $1`, id).Scan(&want); err != nil {
		t.Fatal(err)
	}
	if want <= trailPage {
		t.Fatalf("%d rows: not more than a page", want)
	}
	for _, args := range [][]string{{"audit", "trail", id.String()}, {"audit", "--instruction-id", "ins-k1", "trail"}} {
		r := b.cli(t, "", args[0], args[1:]...)
		requireExit(t, r, 0)
		seen := map[string]bool{}
		var last store.Attempt
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		for i, line := range lines {
			var a store.Attempt
			if err := json.Unmarshal([]byte(line), &a); err != nil {
				t.Fatalf("%v: line %d: %v", args, i+1, err)
			}
			if seen[a.AttemptID.String()] {
				t.Fatalf("%v: attempt %s printed twice", args, a.AttemptID)
			}
			if i > 0 && (a.CreatedAt.Before(last.CreatedAt) || a.CreatedAt.Equal(last.CreatedAt) && a.AttemptID.String() < last.AttemptID.String()) {
				t.Fatalf("%v: line %d out of order", args, i+1)
			}
			seen[a.AttemptID.String()], last = true, a
		}
		if len(seen) != want {
			t.Errorf("%v: %d rows printed, want %d", args, len(seen), want)
		}
	}
}
