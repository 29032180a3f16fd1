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

// TestConsoleNoticesSayWhatWasDone: the page that answers a replay, an
// acknowledgement or a cancel names the instruction and participant acted
// on (an operator knows a payment by those, not by its outbox id) and what
// follows for the payment: replayed, it is sent again; acknowledged or
// cancelled, nothing is sent.
func TestConsoleNoticesSayWhatWasDone(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	replayed := b.enqueue(t, "acme", "k1")
	b.record(t, b.claim(t, "r1", time.Hour), store.Failed, "RAIL_REJECTED", 0)
	acked := b.enqueue(t, "globex", "k2")
	b.record(t, b.claim(t, "r1", time.Hour), store.Failed, "RAIL_REJECTED", 0)
	cancelled := b.enqueue(t, "initech", "k3")
	op := consoleAs(t, b.url, operatorSecret)
	notice := func(page string) string {
		t.Helper()
		m := regexp.MustCompile(`(?s)<p class="(?:ok|notice)" role="status">(.*?)</p>`).FindStringSubmatch(page)
		if m == nil {
			t.Fatalf("no notice:\n%s", page)
		}
		return strings.Join(strings.Fields(m[1]), " ")
	}
	page := op.get(t, "/console/dead-letters")
	path := "/console/dead-letters/" + replayed.String() + "/replay"
	got := notice(op.postShown(t, path, shownForm(t, page, path, "account fixed")))
	for _, want := range []string{"instruction ins-k1", "participant acme", replayed.String(), "sent again"} {
		if !strings.Contains(got, want) {
			t.Errorf("the replay's notice %q lacks %q", got, want)
		}
	}
	page = op.get(t, "/console/dead-letters")
	path = "/console/dead-letters/" + acked.String() + "/acknowledge"
	got = notice(op.postShown(t, path, shownForm(t, page, path, "refunded by hand")))
	for _, want := range []string{"instruction ins-k2", "participant globex", acked.String(), "nothing is sent"} {
		if !strings.Contains(got, want) {
			t.Errorf("the acknowledgement's notice %q lacks %q", got, want)
		}
	}
	page = op.get(t, "/console/instructions")
	path = "/console/instructions/" + cancelled.String() + "/cancel"
	got = notice(op.postShown(t, path, shownForm(t, page, path, "duplicate")))
	for _, want := range []string{"instruction ins-k3", "participant initech", cancelled.String(), "not be sent"} {
		if !strings.Contains(got, want) {
			t.Errorf("the cancel's notice %q lacks %q", got, want)
		}
	}
}

// TestVerifyButtonSaysWhatItCosts: the overview's "Run audit verify" says,
// before it is pressed, that it reads the whole archive and, run on the
// primary (no audit pool), holds back vacuum while it runs: the page it
// leads to says so only afterwards.
func TestVerifyButtonSaysWhatItCosts(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	page := consoleAt(t, b.url).get(t, "/console/")
	m := regexp.MustCompile(`(?s)<form class="inline" method="post" action="/console/verify">(.*?)</form>`).FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no verify form:\n%s", page)
	}
	if !strings.Contains(m[1], "whole archive") || !strings.Contains(m[1], "holds back vacuum") {
		t.Errorf("the verify form does not say what it costs:\n%s", m[1])
	}
}

// TestOverviewTiles: with nothing due the oldest-due tile says so rather
// than "0.0 s" (which reads as something due this instant); and every count
// of instructions leads to its list, as the stuck and dead letters ones do.
func TestOverviewTiles(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	admin.SetOverviewMaxAge(b.srv, 0)
	c := consoleAt(t, b.url)
	page := c.get(t, "/console/")
	tile := regexp.MustCompile(`(?s)<div class="tile[^"]*">(.*?)</div>`)
	var oldest string
	links := map[string]string{}
	for _, m := range tile.FindAllStringSubmatch(page, -1) {
		label := regexp.MustCompile(`<span class="l">([^<]*)</span>`).FindStringSubmatch(m[1])
		if label == nil {
			continue
		}
		if label[1] == "oldest due" {
			oldest = m[1]
		}
		if a := regexp.MustCompile(`<a href="([^"]*)"`).FindStringSubmatch(m[1]); a != nil {
			links[label[1]] = a[1]
		}
	}
	if strings.Contains(oldest, "0.0 s") || !strings.Contains(oldest, "none") {
		t.Errorf("the oldest-due tile with nothing due: %q", oldest)
	}
	for label, want := range map[string]string{"due": "/console/instructions?state=pending", "pending": "/console/instructions?state=pending",
		"in flight": "/console/instructions?state=in_flight", "dead letters": "/console/dead-letters"} {
		if links[label] != want {
			t.Errorf("the %q tile links to %q, want %q", label, links[label], want)
		}
	}
	b.enqueue(t, "acme", "k1")
	if page := c.get(t, "/console/"); !regexp.MustCompile(`<span class="n">[0-9.]+ s</span><span class="l">oldest due`).MatchString(page) {
		t.Errorf("the oldest-due tile with one due has no age:\n%s", page)
	}
}

// TestParticipantPageIsNotClearWhenItIsNot: the participant page's green
// "clear" means nothing waits; a participant with nothing queued but an
// open dead letter (a payment that failed and waits for a decision) is not
// shown as plainly clear, and an id nothing was ever enqueued for (a typo,
// another letter case) says so rather than looking healthy.
func TestParticipantPageIsNotClearWhenItIsNot(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	b.enqueue(t, "acme", "k1")
	b.record(t, b.claim(t, "r1", time.Hour), store.Failed, "RAIL_REJECTED", 0)
	b.enqueue(t, "globex", "k2")
	b.record(t, b.claim(t, "r1", time.Hour), store.Dispatched, "", 0)
	c := consoleAt(t, b.url)
	card := func(id string) string {
		t.Helper()
		page := c.get(t, "/console/participant?id="+id)
		m := regexp.MustCompile(`(?s)<section class="card([^"]*)">(.*?)</section>`).FindStringSubmatch(page)
		if m == nil {
			t.Fatalf("no card for %s:\n%s", id, page)
		}
		return m[1] + " " + strings.Join(strings.Fields(m[2]), " ")
	}
	if got := card("acme"); strings.Contains(got, "state-clear ") || !strings.Contains(got, "1 open dead letter") {
		t.Errorf("a participant with an open dead letter: %s", got)
	}
	if got := card("globex"); !strings.Contains(got, "state-clear") || strings.Contains(got, "open dead letter of") {
		t.Errorf("a clear participant: %s", got)
	}
	if got := card("Acme"); strings.Contains(got, "state-clear") || !strings.Contains(got, "No instruction was ever enqueued") {
		t.Errorf("a participant id nothing was enqueued for: %s", got)
	}
}

// TestInFlightRowsSayWhyNoCancel: an operator's list of instructions in
// flight has no cancel form (the rail call may be under way), and its
// action cell says so instead of standing empty under "action".
func TestInFlightRowsSayWhyNoCancel(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	b.enqueue(t, "acme", "k1")
	b.claim(t, "r1", time.Hour)
	page := consoleAs(t, b.url, operatorSecret).get(t, "/console/instructions?state=in_flight")
	m := regexp.MustCompile(`(?s)<td class="acts">(.*?)</td>`).FindStringSubmatch(page)
	if m == nil || strings.Contains(m[1], "/cancel") || !strings.Contains(m[1], "cannot be cancelled") {
		t.Errorf("the action cell of an instruction in flight: %q", m)
	}
}

// TestQueuedRowsSayWhatTheyWaitFor: a pending instruction queued behind
// its participant's head has no next attempt time; its cell says what it
// waits for instead of standing empty (which reads as "never").
func TestQueuedRowsSayWhatTheyWaitFor(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	b.enqueue(t, "acme", "k1")
	queued := b.enqueue(t, "acme", "k2")
	page := consoleAt(t, b.url).get(t, "/console/instructions?state=pending")
	m := regexp.MustCompile(`(?s)<tr>\s*<td><span class="badge st-queued".*?</tr>`).FindString(page)
	if m == "" || !strings.Contains(m, queued.String()) {
		t.Fatalf("no queued row for %s:\n%s", queued, page)
	}
	if !strings.Contains(m, "behind sequence 1") {
		t.Errorf("the queued row does not say what it waits for:\n%s", m)
	}
}
