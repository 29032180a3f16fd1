package admin_test

import (
	"fmt"
	"html"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"

	"github.com/ledgerline/outbox/admin"
	"github.com/ledgerline/outbox/internal/store"
)

// shownForm returns the fields of the form on page whose action is action,
// as the browser would submit them (hidden inputs), with reason added.
func shownForm(t *testing.T, page, action, reason string) url.Values {
	t.Helper()
	m := regexp.MustCompile(`(?s)<form[^>]*action="` + regexp.QuoteMeta(action) + `">(.*?)</form>`).FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no form for %s on the page:\n%s", action, page)
	}
	form := url.Values{"reason": {reason}}
	for _, in := range regexp.MustCompile(`<input type="hidden" name="([^"]+)" value="([^"]*)">`).FindAllStringSubmatch(m[1], -1) {
		form.Set(in[1], html.UnescapeString(in[2]))
	}
	return form
}

// postShown submits form to path as it stands (its own CSRF token).
func (c *consoleClient) postShown(t *testing.T, path string, form url.Values) string {
	t.Helper()
	resp, err := c.client.PostForm(c.base+path, form)
	return c.read(t, "POST "+path, resp, err)
}

// TestConsoleActsOnlyOnTheDeadLetterShown: a dead letter's replay and
// acknowledge forms act on the dead letter the operator was shown, not on
// whatever has the same outbox id when the form arrives. A replay from a
// page loaded before another operator acknowledged the dead letter
// ("refunded by hand") must not send the payment; a second submission of a
// replay (a double click, a reload) after the replayed instruction failed
// again must not replay it again; an acknowledgement from a page shown
// before a replay must not accept the new failure nobody has seen.
func TestConsoleActsOnlyOnTheDeadLetterShown(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	op := consoleAs(t, b.url, operatorSecret)
	deadLetter := func(participant, key string) uuid.UUID {
		t.Helper()
		id := b.enqueue(t, participant, key)
		b.record(t, b.claim(t, "r1", time.Hour), store.Failed, "RAIL_REJECTED", 0)
		return id
	}
	attempts := func(id uuid.UUID, state string) int {
		t.Helper()
		var n int
		if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox.attempts WHERE outbox_id = $1 AND state = $2`, id, state).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	// Acknowledged by someone else after the page was shown.
	acked := deadLetter("p1", "k1")
	page := op.get(t, "/console/dead-letters")
	replayForm := shownForm(t, page, "/console/dead-letters/"+acked.String()+"/replay", "customer asked again")
	var res admin.ActionResult
	if code := b.call(t, "POST", "/api/v1/dead-letters/"+acked.String()+"/acknowledge", operatorSecret,
		map[string]string{"reason": "refunded by hand"}, &res); code != 200 || !res.Done {
		t.Fatalf("acknowledge: %d %+v", code, res)
	}
	after := op.postShown(t, "/console/dead-letters/"+acked.String()+"/replay", replayForm)
	if n := attempts(acked, "REPLAYED"); n != 0 {
		t.Fatalf("a replay from a page shown before the dead letter was acknowledged replayed it (%d REPLAYED rows):\n%s", n, after)
	}
	if strings.Contains(after, `class="ok"`) {
		t.Fatalf("the page says it was done:\n%s", after)
	}

	// Replayed, failed again, and the same replay form submitted again.
	again := deadLetter("p2", "k2")
	page = op.get(t, "/console/dead-letters")
	replayForm = shownForm(t, page, "/console/dead-letters/"+again.String()+"/replay", "account fixed")
	ackForm := shownForm(t, page, "/console/dead-letters/"+again.String()+"/acknowledge", "refunded by hand")
	if after := op.postShown(t, "/console/dead-letters/"+again.String()+"/replay", replayForm); !strings.Contains(after, "Replayed "+again.String()) {
		t.Fatalf("the first replay:\n%s", after)
	}
	b.record(t, b.claim(t, "r1", time.Hour), store.Failed, "RAIL_REJECTED", 0) // failed again
	after = op.postShown(t, "/console/dead-letters/"+again.String()+"/replay", replayForm)
	if n := attempts(again, "REPLAYED"); n != 1 {
		t.Fatalf("the same replay form submitted twice replayed the new failure too (%d REPLAYED rows):\n%s", n, after)
	}
	after = op.postShown(t, "/console/dead-letters/"+again.String()+"/acknowledge", ackForm)
	if n := attempts(again, "ACKNOWLEDGED"); n != 0 {
		t.Fatalf("an acknowledgement from a page shown before the replay accepted the new failure:\n%s", after)
	}
	if !strings.Contains(after, "changed since") {
		t.Fatalf("the page does not say the dead letter changed:\n%s", after)
	}

	// The forms of a page shown now still act.
	page = op.get(t, "/console/dead-letters")
	ackForm = shownForm(t, page, "/console/dead-letters/"+again.String()+"/acknowledge", "refunded by hand")
	if after := op.postShown(t, "/console/dead-letters/"+again.String()+"/acknowledge", ackForm); !strings.Contains(after, "Acknowledged "+again.String()) ||
		attempts(again, "ACKNOWLEDGED") != 1 {
		t.Fatalf("an acknowledgement from a fresh page:\n%s", after)
	}
}

// TestDeadLettersPageAfterAnActionPages: the page that answers a replay or
// an acknowledgement lists the first page of open dead letters, and like
// the list itself links to the next page when there are more: without the
// link, an operator sees 50 rows and takes them for all there are.
func TestDeadLettersPageAfterAnActionPages(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	const n = 53 // more than a page (50) after one is acknowledged
	var first uuid.UUID
	for i := range n {
		id := b.enqueue(t, fmt.Sprintf("p%d", i), fmt.Sprintf("k%d", i))
		b.record(t, b.claim(t, "r1", time.Hour), store.Failed, "RAIL_REJECTED", 0)
		if i == 0 {
			first = id
		}
	}
	op := consoleAs(t, b.url, operatorSecret)
	page := op.get(t, "/console/dead-letters")
	if !strings.Contains(page, "Next page") {
		t.Fatalf("the list of %d dead letters has no next page:\n%s", n, page)
	}
	path := "/console/dead-letters/" + first.String() + "/acknowledge"
	after := op.postShown(t, path, shownForm(t, page, path, "refunded by hand"))
	if !strings.Contains(after, "Acknowledged "+first.String()) {
		t.Fatalf("the acknowledgement:\n%s", after)
	}
	if rows := strings.Count(after, `action="/console/dead-letters/`) / 2; rows != 50 || !strings.Contains(after, "Next page") {
		t.Fatalf("after the acknowledgement: %d rows and no link to the other %d open dead letters:\n%s", rows, n-1-rows, after)
	}
}
