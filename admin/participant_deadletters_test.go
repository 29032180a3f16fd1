package admin_test

import (
	"strings"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"

	"github.com/ledgerline/outbox/admin"
	"github.com/ledgerline/outbox/internal/store"
)

// TestDeadLettersOfAParticipant: the participant page's count of open
// dead letters links to that participant's dead letters, not to everyone's
// (where its own may be pages away); the list and the API filter by
// ?participant=, with or without the acknowledged ones, and an action
// taken from the filtered list shows the filtered list again.
func TestDeadLettersOfAParticipant(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	deadLetter := func(participant, key string) uuid.UUID {
		t.Helper()
		id := b.enqueue(t, participant, key)
		b.record(t, b.claim(t, "r1", time.Hour), store.Failed, "RAIL_REJECTED", 0)
		return id
	}
	acked := deadLetter("p 1&x", "k1") // a participant id a query string must escape
	open := deadLetter("p 1&x", "k2")
	other := deadLetter("p2", "k3")
	var res admin.ActionResult
	if code := b.call(t, "POST", "/api/v1/dead-letters/"+acked.String()+"/acknowledge", operatorSecret,
		map[string]string{"reason": "refunded by hand"}, &res); code != 200 || !res.Done {
		t.Fatalf("acknowledge: %d %+v", code, res)
	}

	list := func(query string) []uuid.UUID {
		t.Helper()
		var page admin.Page[store.DeadLetter]
		if code := b.call(t, "GET", "/api/v1/dead-letters?"+query, auditorSecret, nil, &page); code != 200 {
			t.Fatalf("dead letters ?%s: %d", query, code)
		}
		var ids []uuid.UUID
		for _, d := range page.Items {
			ids = append(ids, d.OutboxID)
		}
		return ids
	}
	if got := list("participant=p+1%26x"); len(got) != 1 || got[0] != open {
		t.Errorf("the API's open dead letters of p 1&x: %v, want only %s", got, open)
	}
	if got := list("participant=p+1%26x&all=true"); len(got) != 2 || got[0] != acked || got[1] != open {
		t.Errorf("the API's dead letters of p 1&x: %v, want %s and %s", got, acked, open)
	}
	if got := list("participant=p+1%26x&all=true&limit=1"); len(got) != 1 || got[0] != acked {
		t.Errorf("the API's first page of one: %v, want %s", got, acked)
	}
	if got := list(""); len(got) != 2 || got[0] != open || got[1] != other {
		t.Errorf("the API's open dead letters: %v, want %s and %s", got, open, other)
	}

	op := consoleAs(t, b.url, operatorSecret)
	view := op.get(t, "/console/participant?id=p+1%26x")
	const link = `href="/console/dead-letters?participant=p&#43;1%26x"`
	if !strings.Contains(view, link) {
		t.Fatalf("the participant page does not link to its own dead letters (%s):\n%s", link, view)
	}
	page := op.get(t, "/console/dead-letters?participant=p+1%26x")
	if !strings.Contains(page, open.String()) || strings.Contains(page, other.String()) || strings.Contains(page, acked.String()) {
		t.Fatalf("the console's open dead letters of p 1&x list others' or acknowledged ones, or miss %s:\n%s", open, page)
	}
	if !strings.Contains(page, `value="p 1&amp;x"`) {
		t.Errorf("the filtered list does not show its filter:\n%s", page)
	}
	if all := op.get(t, "/console/dead-letters?participant=p+1%26x&all=true"); !strings.Contains(all, acked.String()) || strings.Contains(all, other.String()) {
		t.Errorf("the console's dead letters of p 1&x with the acknowledged ones:\n%s", all)
	}
	if !strings.Contains(page, `href="/console/dead-letters?all=true&amp;participant=p&#43;1%26x"`) {
		t.Errorf("the filtered list's link to the acknowledged ones drops the filter:\n%s", page)
	}

	path := "/console/dead-letters/" + open.String() + "/acknowledge"
	after := op.postShown(t, path, shownForm(t, page, path, "refunded by hand"))
	if !strings.Contains(after, "Acknowledged "+open.String()) {
		t.Fatalf("the acknowledgement:\n%s", after)
	}
	if strings.Contains(after, other.String()) || !strings.Contains(after, "No dead letters") {
		t.Errorf("after an action from the list of p 1&x, the page lists other participants' dead letters:\n%s", after)
	}
}
