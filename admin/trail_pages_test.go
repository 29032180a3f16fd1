package admin_test

import (
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

// trailAnswer is GET /api/v1/trail's answer.
type trailAnswer struct {
	Attempts []store.Attempt `json:"attempts"`
	Next     string          `json:"next"`
}

// TestTrailIsPaged: an instruction retried for days (CIRCUIT_OPEN,
// RELEASED and CUT_OFF_AT_STOP do not use up its retry budget, and each
// replay gives it a new one) has thousands of archive rows, which the API
// and the console read and sent whole. A trail is now a page of archive
// rows (500; here 2), oldest first, with the cursor of the next: the API's
// "next" (and ?after=, ?limit= of at most 500), the console's link to the
// later attempts. Followed to the end, the pages are the whole trail.
func TestTrailIsPaged(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	id := b.enqueue(t, "p1", "k1")
	for range 3 {
		b.record(t, b.claim(t, "r1", time.Hour), store.Retryable, "RAIL_TIMEOUT", 0)
	}
	b.record(t, b.claim(t, "r1", time.Hour), store.Dispatched, "", 0)

	var whole trailAnswer
	if code := b.call(t, "GET", "/api/v1/trail/"+id.String(), auditorSecret, nil, &whole); code != 200 {
		t.Fatalf("trail: %d", code)
	}
	if len(whole.Attempts) < 5 || whole.Next != "" {
		t.Fatalf("the whole trail: %d rows, next %q; want 5 or more and no next page", len(whole.Attempts), whole.Next)
	}
	var tooMany trailAnswer
	if code := b.call(t, "GET", "/api/v1/trail/"+id.String()+"?limit=501", auditorSecret, nil, &tooMany); code != 400 {
		t.Errorf("?limit=501: %d, want 400 (at most 500 rows a page)", code)
	}

	const page = 2
	admin.SetTrailPageSize(b.srv, page)
	for _, path := range []string{"/api/v1/trail/" + id.String() + "?", "/api/v1/trail?instruction_id=ins-k1&"} {
		var got []store.Attempt
		next, pages := "", 0
		for {
			var a trailAnswer
			if code := b.call(t, "GET", path+url.Values{"after": {next}}.Encode(), auditorSecret, nil, &a); code != 200 {
				t.Fatalf("%s after %q: %d", path, next, code)
			}
			if len(a.Attempts) > page {
				t.Fatalf("%s: a page of %d rows, want at most %d", path, len(a.Attempts), page)
			}
			got, next, pages = append(got, a.Attempts...), a.Next, pages+1
			if next == "" || pages > len(whole.Attempts) {
				break
			}
		}
		if !sameAttempts(got, whole.Attempts) {
			t.Errorf("%s: the pages followed to the end (%d rows) are not the whole trail (%d rows)", path, len(got), len(whole.Attempts))
		}
	}
	var limited trailAnswer
	if code := b.call(t, "GET", "/api/v1/trail/"+id.String()+"?limit=3", auditorSecret, nil, &limited); code != 200 || len(limited.Attempts) != 3 || limited.Next == "" {
		t.Errorf("?limit=3: %d, %d rows, next %q; want 3 rows and a next page", code, len(limited.Attempts), limited.Next)
	}

	// The console: a page of rows, and a link to the later ones.
	c := consoleAt(t, b.url)
	events := regexp.MustCompile(`<li class="ev `)
	link := regexp.MustCompile(`<a class="next" href="([^"]+)"`)
	shown, at := 0, "/console/trail?id="+id.String()
	for range len(whole.Attempts) {
		body := c.get(t, at)
		n := len(events.FindAllString(body, -1))
		if n > page || n == 0 {
			t.Fatalf("%s shows %d events, want 1 to %d", at, n, page)
		}
		shown += n
		m := link.FindStringSubmatch(body)
		if m == nil {
			break
		}
		at = html.UnescapeString(m[1])
		if !strings.HasPrefix(at, "/console/trail?") {
			t.Fatalf("the later attempts' link is %q", at)
		}
	}
	if shown != len(whole.Attempts) {
		t.Errorf("the console's pages show %d events, want the trail's %d", shown, len(whole.Attempts))
	}
}

// sameAttempts reports whether a and b are the same archive rows in the
// same order.
func sameAttempts(a, b []store.Attempt) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].AttemptID != b[i].AttemptID || a[i].AttemptID == uuid.Nil {
			return false
		}
	}
	return true
}
