package admin_test

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ledgerline/outbox/admin"
	"github.com/ledgerline/outbox/internal/store"
)

// TestOverviewSaysWhoseBreaker: a rail's breaker is the admin process's
// own (each relayer keeps its own); an admin process that sends on no rail
// has none, which the overview says in words, not as an "unknown" state
// that reads as a fault of the rail.
func TestOverviewSaysWhoseBreaker(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	b.enqueue(t, "acme", "k1")
	b.record(t, b.claim(t, "r1", time.Hour), store.Dispatched, "", 0)
	page := consoleAt(t, b.url).get(t, "/console/")
	if strings.Contains(page, ">unknown<") {
		t.Errorf("the overview shows a breaker as unknown:\n%s", page)
	}
	if !strings.Contains(page, "breaker (this process)") || !strings.Contains(page, "not sent from this process") {
		t.Errorf("the overview does not say whose breaker it shows:\n%s", page)
	}
}

// TestConsoleTimesSayUTC: the console's times are UTC, without a zone of
// their own in each cell: the columns of times say so in their heading.
func TestConsoleTimesSayUTC(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	b.enqueue(t, "acme", "k1")
	b.record(t, b.claim(t, "r1", time.Hour), store.Failed, "RAIL_REJECTED", 0)
	b.enqueue(t, "acme", "k2")
	c := consoleAt(t, b.url)
	for path, heads := range map[string][]string{
		"/console/dead-letters":               {"failed"},
		"/console/instructions?state=pending": {"enqueued", "next attempt"},
	} {
		page := c.get(t, path)
		for _, h := range heads {
			if !regexp.MustCompile(`<th[^>]*>` + h + `[^<]*\(UTC\)</th>`).MatchString(page) {
				t.Errorf("%s: the heading %q does not say UTC:\n%s", path, h, page)
			}
		}
	}
}
