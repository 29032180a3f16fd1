package admin_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/gofrs/uuid/v5"

	"github.com/ledgerline/outbox/admin"
	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/rails"
)

// oldDeadLetters inserts n open dead letters of participant, failed
// before now (a day ago on), with UUID instruction ids: a list of more
// than one page.
func (b *bundle) oldDeadLetters(t *testing.T, participant string, n int) {
	t.Helper()
	if _, err := b.pool.Exec(b.ctx, `
INSERT INTO outbox.dead_letters (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
                                 payload, attempt_count, error_code, attempt_id, created_at, failed_at)
SELECT gen_random_uuid(), gen_random_uuid()::text, $1, 1000 + g, 'old-' || g, 'sandbox', '{}', 1, 'RAIL_REJECTED',
       gen_random_uuid(), now() - interval '1 day', now() - interval '1 day' + g * interval '1 second'
FROM generate_series(1, $2::int) AS g`, participant, n); err != nil {
		t.Fatal(err)
	}
}

// TestDeadLettersScrollSidewaysInView: at 800 px a page of dead letters
// with long ids is wider than the window, and its box scrolls sideways;
// that box is no taller than the window, so its sideways scrollbar is in
// view with the list's top, not under its last row a page scroll away.
func TestDeadLettersScrollSidewaysInView(t *testing.T) {
	t.Parallel()
	bin := chromium(t)
	b := setup(t, admin.Config{})
	b.longIDs(t)
	b.oldDeadLetters(t, "acme-payroll-eu-west-000017", 60)
	ctx := b.signedIn(t, bin, operatorSecret)
	for _, path := range []string{"/console/dead-letters", "/console/instructions?state=pending"} {
		if err := do(ctx, chromedp.EmulateViewport(800, 700), chromedp.Navigate(b.url+path), waitVisible(".table-scroll")); err != nil {
			t.Fatal(err)
		}
		got, err := run(ctx, chromedp.Evaluate[map[string]float64](`(() => {
		  const box = document.querySelector(".table-scroll");
		  window.scrollTo(0, box.getBoundingClientRect().top + window.scrollY);
		  const r = box.getBoundingClientRect();
		  return {wider: box.scrollWidth - box.clientWidth, top: r.top, bottom: r.bottom, window: window.innerHeight};
		})()`))
		if err != nil {
			t.Fatal(err)
		}
		if got["wider"] <= 0 {
			t.Fatalf("%s at 800 px: the table fits (%v): the test shows nothing", path, got)
		}
		if got["bottom"] > got["window"] {
			t.Errorf("%s at 800 px: with the list's top at the window's top (%.0f), its sideways scrollbar is at %.0f, below the window (%.0f)",
				path, got["top"], got["bottom"], got["window"])
		}
	}
}

// TestFilterBoxesHoldLongIDs: a filter box for an id (participant,
// instruction, outbox id) shows the whole of a long one, at 1280 and
// 800 px: an operator checks what was pasted before filtering.
func TestFilterBoxesHoldLongIDs(t *testing.T) {
	t.Parallel()
	bin := chromium(t)
	b := setup(t, admin.Config{})
	ctx := b.signedIn(t, bin, operatorSecret)
	long := "acme-payroll-eu-west-000017-" + uuid.Must(uuid.NewV4()).String()[:12] // 40 characters
	for _, width := range []int64{1280, 800} {
		for _, path := range []string{"/console/dead-letters", "/console/instructions", "/console/participant", "/console/trail"} {
			if err := do(ctx, chromedp.EmulateViewport(width, 900), chromedp.Navigate(b.url+path), waitVisible("form.filters")); err != nil {
				t.Fatal(err)
			}
			cut, err := run(ctx, chromedp.Evaluate[[]string](`(id => [...document.querySelectorAll("form.filters input:not([type=hidden]):not([name=rail])")].
			  filter(i => { i.value = id; return i.scrollWidth > i.clientWidth; }).map(i => i.name + " " + i.clientWidth + "px"))("`+long+`")`))
			if err != nil {
				t.Fatal(err)
			}
			if len(cut) > 0 {
				t.Errorf("%s at %d px: boxes that cut off a %d-character id: %v", path, width, len(long), cut)
			}
		}
	}
}

// TestTrailLinkLandsOnItsDeadLetter: the trail's link to its dead letter
// lands on the page of the list that holds it, that row marked, even when
// it is pages behind the first; that page leads back to the first.
func TestTrailLinkLandsOnItsDeadLetter(t *testing.T) {
	t.Parallel()
	bin := chromium(t)
	b := setup(t, admin.Config{})
	b.oldDeadLetters(t, "p1", 120) // two full pages before it
	dead := b.enqueue(t, "p1", "k1")
	b.record(t, b.claim(t, "r1", time.Hour), store.Failed, "RAIL_REJECTED", 0)
	ctx := b.signedIn(t, bin, auditorSecret)
	if err := do(ctx,
		chromedp.Navigate(b.url+"/console/trail?id="+dead.String()),
		waitVisible("a.dead-letter"),
		click("a.dead-letter"),
		waitVisible("table.dead"),
	); err != nil {
		t.Fatal(err)
	}
	got, err := run(ctx, chromedp.Evaluate[map[string]any](fmt.Sprintf(`(() => {
	  const row = document.getElementById("dl-%s");
	  const first = [...document.querySelectorAll("a")].find(a => /first page/i.test(a.innerText));
	  return {row: !!row, target: !!row && row.matches(":target"),
	    rows: document.querySelectorAll("table.dead tbody tr").length,
	    first: first ? first.getAttribute("href") : ""};
	})()`, dead)))
	if err != nil {
		t.Fatal(err)
	}
	if got["row"] != true || got["target"] != true {
		t.Fatalf("the trail's link lands on a page without its dead letter's row marked: %v", got)
	}
	first, _ := got["first"].(string)
	if !strings.HasPrefix(first, "/console/dead-letters?") || strings.Contains(first, "after=") || !strings.Contains(first, "participant=p1") {
		t.Errorf("the page the link lands on has no link to the first page of p1's list: %v", got)
	}
}

// TestPendingRowsAreShort: an operator's list of pending instructions
// keeps each row one or two lines tall at 1280 and 800 px: the cancel
// form is folded behind one "Cancel…" line, and, opened, its button says
// what cancelling does (the payment is not sent) rather than a bare
// "Cancel", which reads as dismissing the form.
func TestPendingRowsAreShort(t *testing.T) {
	t.Parallel()
	bin := chromium(t)
	b := setup(t, admin.Config{})
	b.longIDs(t)
	ctx := b.signedIn(t, bin, operatorSecret)
	for _, width := range []int64{1280, 800} {
		if err := do(ctx, chromedp.EmulateViewport(width, 900), chromedp.Navigate(b.url+"/console/instructions?state=pending"), waitVisible("table")); err != nil {
			t.Fatal(err)
		}
		got, err := run(ctx, chromedp.Evaluate[map[string]any](`(() => {
		  const row = document.querySelector("table tbody tr");
		  const shown = el => !!el && el.checkVisibility() && el.getBoundingClientRect().height > 0;
		  const reason = () => row.querySelector('form[action$="/cancel"] input[name="reason"]');
		  const toggle = row.querySelector("details > summary");
		  const out = {height: row.getBoundingClientRect().height, formShown: shown(reason()), toggle: toggle ? toggle.innerText : ""};
		  if (toggle) toggle.click();
		  out.opened = shown(reason());
		  const button = row.querySelector('form[action$="/cancel"] button');
		  out.button = button ? button.innerText : "";
		  return out;
		})()`))
		if err != nil {
			t.Fatal(err)
		}
		if h, _ := got["height"].(float64); h > 80 || got["formShown"] == true {
			t.Errorf("at %d px a pending instruction's row is %.0f px tall, its cancel form shown %v; want at most 80 px, folded", width, h, got["formShown"])
		}
		toggle, _ := got["toggle"].(string)
		button, _ := got["button"].(string)
		if !strings.HasPrefix(toggle, "Cancel") || got["opened"] != true || button == "Cancel" || !strings.Contains(strings.ToLower(button), "send") {
			t.Errorf("at %d px the folded cancel: %v", width, got)
		}
	}
}

// TestNumberHeadersAlignWithTheirNumbers: a column of numbers is right
// aligned, and so is its heading, which would otherwise stand a column's
// width from its figures (the overview's rails at 1280 px).
func TestNumberHeadersAlignWithTheirNumbers(t *testing.T) {
	t.Parallel()
	bin := chromium(t)
	b := setup(t, admin.Config{})
	b.longIDs(t)
	b.relayWith(t, rails.SandboxOptions{})() // a relayer seen: the overview lists it
	ctx := b.signedIn(t, bin, operatorSecret)
	for _, path := range []string{"/console/", "/console/instructions?state=pending", "/console/dead-letters"} {
		if err := do(ctx, chromedp.EmulateViewport(1280, 900), chromedp.Navigate(b.url+path), waitVisible("table")); err != nil {
			t.Fatal(err)
		}
		off, err := run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("table")].flatMap(table => {
		  const row = table.querySelector("tbody tr"), heads = table.querySelectorAll("thead th");
		  if (!row) return [];
		  return [...row.cells].flatMap((td, i) => td.classList.contains("num") && heads[i] &&
		    getComputedStyle(heads[i]).textAlign !== getComputedStyle(td).textAlign ? [heads[i].innerText] : []);
		})`))
		if err != nil {
			t.Fatal(err)
		}
		if len(off) > 0 {
			t.Errorf("%s: headings not aligned with their numbers: %q", path, off)
		}
	}
}

// TestActionsInViewWhenTheListScrolls: at 800 px, where a list with long
// ids is wider than the window, each row's actions (replay and
// acknowledge, cancel) are in view without scrolling sideways: their
// column stays at the box's right edge; and a dead letter's error, read
// before acting on it, is in view beside them.
func TestActionsInViewWhenTheListScrolls(t *testing.T) {
	t.Parallel()
	bin := chromium(t)
	b := setup(t, admin.Config{})
	b.longIDs(t)
	ctx := b.signedIn(t, bin, operatorSecret)
	for _, path := range []string{"/console/dead-letters", "/console/instructions?state=pending"} {
		if err := do(ctx, chromedp.EmulateViewport(800, 900), chromedp.Navigate(b.url+path), waitVisible(".table-scroll")); err != nil {
			t.Fatal(err)
		}
		got, err := run(ctx, chromedp.Evaluate[map[string]any](`(() => {
		  const box = document.querySelector(".table-scroll");
		  const out = {wider: box.scrollWidth - box.clientWidth, window: window.innerWidth, off: []};
		  for (const s of box.querySelectorAll("tbody details > summary")) {
		    const r = s.getBoundingClientRect();
		    if (r.right > window.innerWidth || r.left < 0) out.off.push(s.innerText + " at " + Math.round(r.left) + "-" + Math.round(r.right));
		  }
		  out.n = box.querySelectorAll("tbody details > summary").length;
		  // What a dead letter failed with is read before acting on it: in
		  // view, not under the actions' column.
		  for (const row of box.querySelectorAll("tbody tr")) {
		    const err = row.querySelector("td.failure"), acts = row.querySelector("td.acts");
		    if (err && acts && err.getBoundingClientRect().right > acts.getBoundingClientRect().left + 1) out.off.push("error " + err.innerText);
		  }
		  return out;
		})()`))
		if err != nil {
			t.Fatal(err)
		}
		if w, _ := got["wider"].(float64); w <= 0 || got["n"] == 0.0 {
			t.Fatalf("%s at 800 px: the list fits or has no actions (%v): the test shows nothing", path, got)
		}
		if off, _ := got["off"].([]any); len(off) > 0 {
			t.Errorf("%s at 800 px: actions out of view until the list is scrolled sideways: %v", path, off)
		}
		png, err := run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		name := strings.Trim(strings.NewReplacer("/", "-", "?", "-", "=", "-").Replace(path), "-")
		if err := os.WriteFile(filepath.Join(t.ArtifactDir(), name+"-long-ids-800.png"), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestPauseReasonSurvivesTheRefresh: the overview refreshes itself every
// 5 s, which would wipe a pause's reason half typed into a form on it (an
// operator in an incident types slowly); the way to pause from the
// overview leads to a page that does not refresh, where what is typed
// stays.
func TestPauseReasonSurvivesTheRefresh(t *testing.T) {
	t.Parallel()
	bin := chromium(t)
	b := setup(t, admin.Config{})
	ctx := b.signedIn(t, bin, operatorSecret)
	const typed = "beneficiary bank's maintenance"
	if err := do(ctx, chromedp.Navigate(b.url+"/console/"), waitVisible(".tiles")); err != nil {
		t.Fatal(err)
	}
	// A link to pause, if the overview has one, else its own form.
	if _, err := run(ctx, chromedp.Evaluate[bool](`(() => {
	  const a = [...document.querySelectorAll("main a")].find(a => /pause/i.test(a.innerText));
	  if (a) a.click();
	  return !!a;
	})()`)); err != nil {
		t.Fatal(err)
	}
	if err := do(ctx,
		waitVisible(`form[action="/console/rails/pause"] input[name="reason"]`),
		sendKeys(`form[action="/console/rails/pause"] input[name="reason"]`, typed),
		chromedp.Sleep(6*time.Second),
	); err != nil {
		t.Fatal(err)
	}
	got, err := run(ctx, chromedp.Evaluate[string](`(document.querySelector('form[action="/console/rails/pause"] input[name="reason"]') || {value: "(no form)"}).value`))
	if err != nil {
		t.Fatal(err)
	}
	if got != typed {
		t.Errorf("6 s after typing a pause's reason the box holds %q, want %q", got, typed)
	}
}

// TestParticipantIDSurvivesTheRefresh: on a participant's page an
// operator types another participant's id into its box; the page's
// refresh must not wipe it. The page refreshes itself only when asked to
// (watching a participant), and says how to stop.
func TestParticipantIDSurvivesTheRefresh(t *testing.T) {
	t.Parallel()
	bin := chromium(t)
	b := setup(t, admin.Config{})
	b.enqueue(t, "acme", "k1")
	ctx := b.signedIn(t, bin, operatorSecret)
	const typed = "globex-treasury-settlements"
	if err := do(ctx,
		chromedp.Navigate(b.url+"/console/participant?id=acme"),
		waitVisible("section.card"),
		chromedp.Clear(`form.filters input[name="id"]`, css(`form.filters input[name="id"]`)),
		sendKeys(`form.filters input[name="id"]`, typed),
		chromedp.Sleep(6*time.Second),
	); err != nil {
		t.Fatal(err)
	}
	got, err := run(ctx, chromedp.Evaluate[string](`document.querySelector('form.filters input[name="id"]').value`))
	if err != nil {
		t.Fatal(err)
	}
	if got != typed {
		t.Errorf("6 s after typing a participant id the box holds %q, want %q", got, typed)
	}
	watch, err := run(ctx, chromedp.Evaluate[string](`(() => { const a = [...document.querySelectorAll("main a")].find(a => /refresh/i.test(a.innerText)); return a ? a.getAttribute("href") : ""; })()`))
	if err != nil {
		t.Fatal(err)
	}
	if watch == "" {
		t.Fatal("the participant's page has no link to watch it (refresh itself)")
	}
	if err := do(ctx, chromedp.Navigate(b.url+watch), waitVisible("section.card")); err != nil {
		t.Fatal(err)
	}
	refresh, err := run(ctx, chromedp.Evaluate[string](`(document.querySelector('meta[http-equiv="refresh"]') || {content: ""}).content`))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(refresh, "5") {
		t.Errorf("no way to watch the participant (link %q, refresh %q)", watch, refresh)
	}
}
