package admin_test

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ledgerline/outbox/admin"
	"github.com/ledgerline/outbox/internal/store"
)

// TestDeadLettersPageSaysHowMany: the dead letters page says how many
// dead letters its filter matches, not only the 50 of its first page: the
// open ones, one participant's, or all with the acknowledged ones; the page
// that answers an action says it of the list it shows; and past the
// count's bound it says "more than" rather than a wrong figure.
func TestDeadLettersPageSaysHowMany(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	for i, p := range []string{"p1", "p1", "p1", "p2"} {
		b.enqueue(t, p, fmt.Sprintf("k%d", i))
		b.record(t, b.claim(t, "r1", time.Hour), store.Failed, "RAIL_REJECTED", 0)
	}
	op := consoleAs(t, b.url, operatorSecret)
	total := func(page string) string {
		t.Helper()
		m := regexp.MustCompile(`<p class="total"[^>]*>([^<]*)</p>`).FindStringSubmatch(page)
		if m == nil {
			t.Fatalf("the dead letters page says no total:\n%s", page)
		}
		return strings.Join(strings.Fields(m[1]), " ")
	}
	if got, want := total(op.get(t, "/console/dead-letters")), "4 open dead letters"; got != want {
		t.Errorf("everyone's: %q, want %q", got, want)
	}
	page := op.get(t, "/console/dead-letters?participant=p1")
	if got, want := total(page), "3 open dead letters of participant p1"; got != want {
		t.Errorf("p1's: %q, want %q", got, want)
	}
	var first string
	if m := regexp.MustCompile(`action="(/console/dead-letters/[0-9a-f-]+/acknowledge)"`).FindStringSubmatch(page); m != nil {
		first = m[1]
	} else {
		t.Fatalf("no acknowledge form:\n%s", page)
	}
	after := op.postShown(t, first, shownForm(t, page, first, "refunded by hand"))
	if got, want := total(after), "2 open dead letters of participant p1"; got != want {
		t.Errorf("after an acknowledgement from p1's list: %q, want %q", got, want)
	}
	if got, want := total(op.get(t, "/console/dead-letters?participant=p1&all=true")), "3 dead letters of participant p1, open and acknowledged"; got != want {
		t.Errorf("p1's with the acknowledged: %q, want %q", got, want)
	}
	if got, want := total(op.get(t, "/console/dead-letters?participant=p2")), "1 open dead letter of participant p2"; got != want {
		t.Errorf("p2's: %q, want %q", got, want)
	}
	if got, want := total(op.get(t, "/console/dead-letters?participant=nobody")), "0 open dead letters of participant nobody"; got != want {
		t.Errorf("nobody's: %q, want %q", got, want)
	}

	// Years of acknowledged ones: the count stops at its bound.
	if _, err := b.pool.Exec(b.ctx, `
INSERT INTO outbox.dead_letters (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
                                 payload, attempt_count, error_code, attempt_id, created_at, failed_at, acknowledged_at)
SELECT gen_random_uuid(), 'old-' || g, 'p-old', g, 'old-' || g, 'sandbox', '{}', 1, 'RAIL_REJECTED',
       gen_random_uuid(), now() - interval '2 years', now() - interval '2 years', now() - interval '1 year'
FROM generate_series(1, 10000) AS g`); err != nil {
		t.Fatal(err)
	}
	if got, want := total(op.get(t, "/console/dead-letters?all=true")), "more than 10000 dead letters, open and acknowledged"; got != want {
		t.Errorf("everyone's with the acknowledged: %q, want %q", got, want)
	}
	if got, want := total(op.get(t, "/console/dead-letters")), "3 open dead letters"; got != want {
		t.Errorf("everyone's open, after: %q, want %q", got, want)
	}
}

// TestDeadLettersAPISaysHowMany: GET /api/v1/dead-letters says how many
// dead letters its filter matches, all pages together (the same count as
// the console's list), and past the count's bound says that its figure
// is a lower bound rather than giving a wrong one as exact.
func TestDeadLettersAPISaysHowMany(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	for i, p := range []string{"p1", "p1", "p1", "p2"} {
		b.enqueue(t, p, fmt.Sprintf("k%d", i))
		b.record(t, b.claim(t, "r1", time.Hour), store.Failed, "RAIL_REJECTED", 0)
	}
	type page struct {
		Items      []store.DeadLetter `json:"items"`
		Next       string             `json:"next"`
		Total      *int64             `json:"total"`
		LowerBound *bool              `json:"total_is_lower_bound"`
	}
	check := func(path string, items int, total int64, lower bool) page {
		t.Helper()
		var p page
		if code := b.call(t, "GET", path, auditorSecret, nil, &p); code != 200 {
			t.Fatalf("GET %s: %d", path, code)
		}
		if p.Total == nil || p.LowerBound == nil {
			t.Fatalf("GET %s: no total or total_is_lower_bound: %+v", path, p)
		}
		if len(p.Items) != items || *p.Total != total || *p.LowerBound != lower {
			t.Errorf("GET %s: %d items, total %d (lower bound %v); want %d, %d (%v)", path, len(p.Items), *p.Total, *p.LowerBound, items, total, lower)
		}
		return p
	}
	check("/api/v1/dead-letters", 4, 4, false)
	first := check("/api/v1/dead-letters?participant=p1&limit=2", 2, 3, false)
	check("/api/v1/dead-letters?participant=p1&limit=2&after="+first.Next, 1, 3, false) // every page says the filter's total
	check("/api/v1/dead-letters?participant=nobody", 0, 0, false)

	if _, err := b.pool.Exec(b.ctx, `
INSERT INTO outbox.dead_letters (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
                                 payload, attempt_count, error_code, attempt_id, created_at, failed_at, acknowledged_at)
SELECT gen_random_uuid(), 'old-' || g, 'p-old', g, 'old-' || g, 'sandbox', '{}', 1, 'RAIL_REJECTED',
       gen_random_uuid(), now() - interval '2 years', now() - interval '2 years', now() - interval '1 year'
FROM generate_series(1, 10000) AS g`); err != nil {
		t.Fatal(err)
	}
	check("/api/v1/dead-letters?all=true&limit=5", 5, 10000, true)
	check("/api/v1/dead-letters?all=true&participant=p-old&limit=5", 5, 10000, false) // exactly the bound: exact
	check("/api/v1/dead-letters", 4, 4, false)
}
