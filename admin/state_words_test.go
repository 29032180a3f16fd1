package admin_test

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ledgerline/outbox/admin"
	"github.com/ledgerline/outbox/internal/store"
)

// stateBadge finds the state badges of a console page: class, title and
// words.
var stateBadge = regexp.MustCompile(`<span class="badge st-(\w+)" title="([^"]*)">([^<]*)</span>`)

// TestStateBadgesSayWhatTheStateMeans: the instructions list and a
// participant's page showed each state as its raw name (retry_wait,
// queued, in_flight), which an operator has to translate. The badge now
// says it in words, and the row's next-attempt cell completes them
// ("waiting to retry" … "until" a time, "queued" … "behind sequence N");
// the raw name stays in the badge's title (and class), and the API's
// state values are unchanged.
func TestStateBadgesSayWhatTheStateMeans(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	b.enqueue(t, "retrying", "k1")
	b.record(t, b.claim(t, "r1", time.Hour), store.Retryable, "RAIL_TIMEOUT", time.Hour)
	b.enqueue(t, "acme", "k2")
	b.enqueue(t, "acme", "k3") // queued behind k2, which is due
	c := consoleAt(t, b.url)

	page := c.get(t, "/console/instructions?state=pending")
	got := map[string]string{}
	for _, m := range stateBadge.FindAllStringSubmatch(page, -1) {
		got[m[1]] = m[2] + " | " + m[3]
	}
	want := map[string]string{
		"retry_wait": "state retry_wait | waiting to retry",
		"due":        "state due | due",
		"queued":     "state queued | queued",
	}
	for state, w := range want {
		if got[state] != w {
			t.Errorf("the %s badge: %q, want %q", state, got[state], w)
		}
	}
	for _, row := range regexp.MustCompile(`(?s)<tr>\s*<td><span class="badge st-.*?</tr>`).FindAllString(page, -1) {
		switch {
		case strings.Contains(row, "st-retry_wait") && !regexp.MustCompile(`until \d{4}-\d\d-\d\d `).MatchString(row):
			t.Errorf("the retry_wait row does not say until when:\n%s", row)
		case strings.Contains(row, "st-due") && !regexp.MustCompile(`since \d{4}-\d\d-\d\d `).MatchString(row):
			t.Errorf("the due row does not say since when:\n%s", row)
		}
	}

	b.claim(t, "r2", time.Hour) // acme's k2
	page = c.get(t, "/console/instructions?state=in_flight")
	if m := stateBadge.FindStringSubmatch(page); m == nil || m[1] != "in_flight" || m[2] != "state in_flight" || m[3] != "in flight" {
		t.Errorf("the in-flight badge: %q", m)
	}
	page = c.get(t, "/console/participant?id=retrying")
	if m := stateBadge.FindStringSubmatch(page); m == nil || m[1] != "retry_wait" || m[3] != "waiting to retry" {
		t.Errorf("the participant page's badge: %q", m)
	}

	// The API's values are the raw states.
	var pg admin.Page[store.Queued]
	b.call(t, "GET", "/api/v1/instructions?state=pending", auditorSecret, nil, &pg)
	var states []string
	for _, q := range pg.Items {
		states = append(states, q.State)
	}
	if strings.Join(states, ",") != "retry_wait,queued" {
		t.Errorf("the API's pending states: %v", states)
	}
}

// TestDeadLettersSayTheirOrder: the dead letters list is in failure order,
// oldest first (the API's too), and did not say so: an operator reading
// its first rows as the latest failures replays the wrong ones first. Its
// failure column's heading says it (and marks the column sorted).
func TestDeadLettersSayTheirOrder(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	b.enqueue(t, "p1", "k1")
	b.record(t, b.claim(t, "r1", time.Hour), store.Failed, "RAIL_REJECTED", 0)
	page := consoleAt(t, b.url).get(t, "/console/dead-letters")
	if !regexp.MustCompile(`<th aria-sort="ascending"[^>]*>failed, oldest first \(UTC\)</th>`).MatchString(page) {
		t.Errorf("the failure column's heading does not say the order:\n%s", page)
	}
}
