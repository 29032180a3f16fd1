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
	"github.com/ledgerline/outbox/pending"
)

// TestTrailByInstructionIDSaysWhichInstruction: a producer's instruction
// id is its tenant's: the same instruction id in two tenants is two
// instructions (two outbox ids, two payments). (Before migration 030 one
// tenant could also enqueue an instruction id under two keys; it is now
// refused.) The console's trail by instruction id lists both trails in one
// timeline, so each event must say which outbox id, and whose, it is of:
// otherwise one's DISPATCHED reads as the other's outcome, and two
// payments as one.
func TestTrailByInstructionIDSaysWhichInstruction(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	enqueue := func(tenant string) string {
		t.Helper()
		r, err := b.producer.Enqueue(b.ctx, b.pool, pending.Instruction{
			InstructionID: "payout-7", ParticipantID: "acme-" + tenant, IdempotencyKey: "payout-7", TenantID: tenant,
			RailType: "sandbox", AmountMinor: 100, Currency: "USD", Destination: "acct-1",
		})
		if err != nil {
			t.Fatal(err)
		}
		return r.OutboxID.String()
	}
	failed := enqueue("tenant-a")
	b.record(t, b.claim(t, "r1", time.Hour), store.Failed, "RAIL_REJECTED", 0)
	sent := enqueue("tenant-b")
	b.record(t, b.claim(t, "r1", time.Hour), store.Dispatched, "", 0)
	page := consoleAt(t, b.url).get(t, "/console/trail?instruction_id=payout-7")
	timeline := page[strings.Index(page, `<ol class="timeline">`):]
	if !strings.Contains(timeline, failed) || !strings.Contains(timeline, sent) ||
		!strings.Contains(timeline, "tenant tenant-a") || !strings.Contains(timeline, "tenant tenant-b") {
		t.Fatalf("the trail of an instruction id enqueued as %s (tenant-a) and %s (tenant-b) does not say which event is whose:\n%s", failed, sent, timeline)
	}
	if !strings.Contains(page, "2 instructions (outbox ids), of different tenants") {
		t.Fatalf("the trail does not warn that payout-7 is two instructions:\n%s", page)
	}
}

// TestTrailLinksToItsDeadLetter: the trail of an instruction that is a
// dead letter now links to it in the dead letters list (its participant's,
// with the acknowledged ones when it is acknowledged), where it can be
// replayed or acknowledged; the trail of one that is not (dispatched, or
// replayed since it failed) has no such link.
func TestTrailLinksToItsDeadLetter(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	dead := b.enqueue(t, "p 1&x", "k1") // a participant id a query string must escape
	b.record(t, b.claim(t, "r1", time.Hour), store.Failed, "RAIL_REJECTED", 0)
	sent := b.enqueue(t, "p2", "k2")
	b.record(t, b.claim(t, "r1", time.Hour), store.Dispatched, "", 0)
	replayed := b.enqueue(t, "p3", "k3")
	b.record(t, b.claim(t, "r1", time.Hour), store.Failed, "RAIL_REJECTED", 0)
	acked := b.enqueue(t, "p4", "k4")
	b.record(t, b.claim(t, "r1", time.Hour), store.Failed, "RAIL_REJECTED", 0)
	for id, action := range map[string]string{replayed.String(): "replay", acked.String(): "acknowledge"} {
		var res admin.ActionResult
		if code := b.call(t, "POST", "/api/v1/dead-letters/"+id+"/"+action, operatorSecret,
			map[string]string{"reason": "by hand"}, &res); code != 200 || !res.Done {
			t.Fatalf("%s: %d %+v", action, code, res)
		}
	}

	c := consoleAt(t, b.url)
	const deadLink = `class="dead-letter"`
	// link is the trail's link to its dead letter: the list it names (its
	// participant's, with the acknowledged ones or not), and that the page
	// it leads to has the dead letter's row.
	link := func(trail string, id uuid.UUID, list string) {
		t.Helper()
		page := c.get(t, trail)
		m := regexp.MustCompile(`<a class="dead-letter" href="([^"]*)"`).FindStringSubmatch(page)
		if m == nil {
			t.Fatalf("%s: no link to dead letter %s:\n%s", trail, id, page)
		}
		href := html.UnescapeString(m[1])
		u, err := url.Parse(href)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := url.ParseQuery(list)
		q := u.Query()
		if u.Path != "/console/dead-letters" || q.Get("participant") != want.Get("participant") || q.Get("all") != want.Get("all") ||
			q.Get("after") == "" || u.Fragment != "dl-"+id.String() {
			t.Fatalf("%s: the link to dead letter %s is %s, want the list ?%s from it, its row marked", trail, id, href, list)
		}
		u.Fragment = ""
		if landed := c.get(t, u.String()); !strings.Contains(landed, `id="dl-`+id.String()+`"`) {
			t.Fatalf("%s: the link's list has no row %s to land on:\n%s", trail, id, landed)
		}
	}
	link("/console/trail?id="+dead.String(), dead, "participant=p+1%26x")
	link("/console/trail?instruction_id=ins-k1", dead, "participant=p+1%26x")
	link("/console/trail?id="+acked.String(), acked, "all=true&participant=p4")
	for what, id := range map[string]string{"dispatched": sent.String(), "replayed": replayed.String()} {
		if page := c.get(t, "/console/trail?id="+id); strings.Contains(page, deadLink) {
			t.Errorf("the trail of a %s instruction links to a dead letter:\n%s", what, page)
		}
	}
}

// TestTrailSaysWhatItIsOf: the trail of an outbox id names, above its
// timeline, the instruction it is of (instruction id, participant and its
// sequence, rail, idempotency key), as a person checking a payment knows
// it by those and not by its outbox id; an operator's replay is not "attempt
// 0" (it is no attempt: the row's attempt number is 0 as a placeholder);
// and the page says its times are UTC.
func TestTrailSaysWhatItIsOf(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	id := b.enqueue(t, "acme-payroll", "key-9")
	b.record(t, b.claim(t, "r1", time.Hour), store.Failed, "RAIL_REJECTED", 0)
	var res admin.ActionResult
	if code := b.call(t, "POST", "/api/v1/dead-letters/"+id.String()+"/replay", operatorSecret,
		map[string]string{"reason": "account fixed"}, &res); code != 200 || !res.Done {
		t.Fatalf("replay: %d %+v", code, res)
	}
	page := consoleAt(t, b.url).get(t, "/console/trail?id="+id.String())
	i := strings.Index(page, `<ol class="timeline">`)
	if i < 0 {
		t.Fatalf("no timeline:\n%s", page)
	}
	head, timeline := page[strings.Index(page, "</form>"):i], page[i:]
	for _, want := range []string{"ins-key-9", "acme-payroll", "sequence 1", "sandbox", "key-9", "UTC"} {
		if !strings.Contains(head, want) {
			t.Errorf("above the timeline no %q:\n%s", want, head)
		}
	}
	if strings.Contains(timeline, "attempt 0") || !strings.Contains(timeline, "REPLAYED") {
		t.Errorf("the replay reads as an attempt 0:\n%s", timeline)
	}
}

// TestTrailSaysItsDeadLetterIsOutcomeUnknown: the trail of a dead letter
// marked outcome unknown (an attempt may have reached the rail) says so
// where it links to the dead letter, as the list does: an operator reading
// the trail before a replay or a refund must not miss it.
func TestTrailSaysItsDeadLetterIsOutcomeUnknown(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	unknown := b.enqueue(t, "p1", "k1")
	b.record(t, b.claim(t, "r1", time.Hour), store.Failed, "RAIL_TIMEOUT", 0)
	if _, err := b.pool.Exec(b.ctx, `UPDATE outbox.dead_letters SET outcome_unknown = true WHERE outbox_id = $1`, unknown); err != nil {
		t.Fatal(err)
	}
	known := b.enqueue(t, "p2", "k2")
	b.record(t, b.claim(t, "r1", time.Hour), store.Failed, "RAIL_REJECTED", 0)
	c := consoleAt(t, b.url)
	banner := regexp.MustCompile(`(?s)<p class="dead-letter-now"[^>]*>(.*?)</p>`)
	if m := banner.FindStringSubmatch(c.get(t, "/console/trail?id="+unknown.String())); m == nil || !strings.Contains(m[1], "outcome unknown") {
		t.Errorf("the trail of an outcome-unknown dead letter does not say so: %q", m)
	}
	if m := banner.FindStringSubmatch(c.get(t, "/console/trail?id="+known.String())); m == nil || strings.Contains(m[1], "outcome unknown") {
		t.Errorf("the trail of a rejected dead letter: %q", m)
	}
}

// TestTrailOperatorActionsAreNotAttempts: an acknowledgement's archive
// row carries the attempt number of the failure it closes, but it is no
// attempt: the trail shows it, as a replay, as an operator's action.
func TestTrailOperatorActionsAreNotAttempts(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	id := b.enqueue(t, "p1", "k1")
	b.record(t, b.claim(t, "r1", time.Hour), store.Failed, "RAIL_REJECTED", 0)
	var res admin.ActionResult
	if code := b.call(t, "POST", "/api/v1/dead-letters/"+id.String()+"/acknowledge", operatorSecret,
		map[string]string{"reason": "refunded by hand"}, &res); code != 200 || !res.Done {
		t.Fatalf("acknowledge: %d %+v", code, res)
	}
	page := consoleAt(t, b.url).get(t, "/console/trail?id="+id.String())
	m := regexp.MustCompile(`(?s)<li class="ev st-acknowledged">(.*?)</li>`).FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no acknowledgement in the trail:\n%s", page)
	}
	if strings.Contains(m[1], "attempt") || !strings.Contains(m[1], "operator action") {
		t.Errorf("the acknowledgement reads as an attempt:\n%s", m[1])
	}
}
