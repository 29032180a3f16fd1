package admin_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/dom"
	"github.com/chromedp/chromedp"

	"github.com/ledgerline/outbox/admin"
	"github.com/ledgerline/outbox/engine"
	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/rails"
	"github.com/ledgerline/outbox/relay"
)

// chromium returns the headless browser to drive, or skips the test when
// there is none, unless OUTBOX_REQUIRE_CHROMIUM is set (make test sets it
// and installs the chromium package).
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("OUTBOX_REQUIRE_CHROMIUM") != "" {
		t.Fatal("no chromium (apt-get install chromium, or make test)")
	}
	t.Skip("no chromium; make test installs it")
	return ""
}

// browser starts a headless Chromium of its own (its own cookies) and
// returns a context that drives it, through do and run. On a busy
// machine, with other tests' browsers starting beside it, Chromium now and
// then exits before it listens ("chrome failed to start", with nothing but
// its usual warnings printed): that start is tried again, twice at most,
// so the tests fail for what the console does, not for a browser that
// never came up.
func browser(t *testing.T, bin string) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(bin), chromedp.NoSandbox,
		chromedp.DisableGPU, chromedp.WindowSize(1400, 1000))
	for attempt := 1; ; attempt++ {
		alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
		ctx, cancel := chromedp.NewContext(alloc)
		err := chromedp.Do(ctx) // starts the browser
		if err == nil {
			t.Cleanup(func() { cancel(); cancelAlloc() })
			return ctx
		}
		cancel()
		cancelAlloc()
		if attempt == 3 || !strings.Contains(err.Error(), "chrome failed to start") {
			t.Fatalf("start %s: %v", bin, err)
		}
		t.Logf("%s exited before it listened (attempt %d of 3): %v", bin, attempt, err)
	}
}

// stepTimeout bounds each call to the browser (do, run), so that a browser
// that stops answering fails its test. It bounds a call, not the session:
// a session of many pages takes longer the busier the machine, and the
// one deadline over TestConsoleInBrowser's whole session (90 s from the
// browser's start) ran out on a loaded 2-core machine between two calls
// that each answered in time.
const stepTimeout = 90 * time.Second

// do runs steps in the browser of ctx within stepTimeout.
func do(ctx context.Context, steps ...chromedp.Action[chromedp.Void]) error {
	ctx, cancel := context.WithTimeout(ctx, stepTimeout)
	defer cancel()
	return chromedp.Do(ctx, steps...)
}

// run runs a in the browser of ctx within stepTimeout and returns its
// value.
func run[T any](ctx context.Context, a chromedp.Action[T]) (T, error) {
	ctx, cancel := context.WithTimeout(ctx, stepTimeout)
	defer cancel()
	return chromedp.Run(ctx, a)
}

// css makes an element query use a CSS selector (querySelectorAll)
// rather than the DevTools search, which also matches text.
func css(sel string) chromedp.QueryOption {
	return chromedp.ByFunc(func(ctx context.Context, t *chromedp.Target, n *chromedp.Node) ([]cdp.NodeID, error) {
		res, err := cdp.Call(ctx, t, dom.QuerySelectorAll, dom.QuerySelectorAllParams{NodeID: n.NodeID, Selector: sel})
		return res.NodeIDs, err
	})
}

// Element actions by CSS selector.
func waitVisible(sel string) chromedp.Action[chromedp.Void] {
	return chromedp.WaitVisible(sel, css(sel))
}
func click(sel string) chromedp.Action[chromedp.Void]  { return chromedp.Click(sel, css(sel)) }
func submit(sel string) chromedp.Action[chromedp.Void] { return chromedp.Submit(sel, css(sel)) }
func sendKeys(sel, keys string) chromedp.Action[chromedp.Void] {
	return chromedp.SendKeys(sel, keys, css(sel))
}

// relayWith runs a relay service on b's database with a sandbox rail of
// opts until stop is called.
func (b *bundle) relayWith(t *testing.T, opts rails.SandboxOptions) (stop func()) {
	t.Helper()
	set, err := rails.NewSet(rails.Options{Type: "sandbox", Profile: payment.Generic{}, Transport: rails.NewSandbox(opts)})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := relay.New(b.pool, relay.Config{Relayer: engine.Config{Rails: set, PollInterval: 50 * time.Millisecond}, NoReaper: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	return func() { _ = svc.Stop(context.Background()) }
}

// waitFor polls cond (bounded).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestConsoleInBrowser drives the console in a real headless Chromium: an
// operator signs in, sees the dead letters the sandbox rail produced,
// replays one with a reason, sees it dispatched and its trail show the
// replay with who and why; from a participant's page it follows the link
// to that participant's dead letters and sees only those; an auditor sees
// no replay button and gets 403 when posting a replay anyway. Screenshots
// of the main pages, 1280 and 800 px wide, go to the test's artifact directory (go test
// -artifacts keeps them).
func TestConsoleInBrowser(t *testing.T) {
	t.Parallel()
	bin := chromium(t)
	b := setup(t, admin.Config{})
	shots := t.ArtifactDir()

	// The sandbox rejects every first payment: two dead letters.
	stop := b.relayWith(t, rails.SandboxOptions{TerminalRate: 1})
	first, second := b.enqueue(t, "acme-payroll", "k1"), b.enqueue(t, "globex", "k2")
	waitFor(t, "two dead letters", func() bool {
		var n int
		_ = b.pool.QueryRow(b.ctx, "SELECT count(*) FROM outbox.dead_letters").Scan(&n)
		return n == 2
	})
	stop()
	for _, k := range []string{"k3", "k4", "k5"} { // something pending and queued
		b.enqueue(t, "initech", k)
	}

	// shot takes the page at 1280 and 800 px wide (a laptop, a half
	// screen), and leaves it at 1280.
	shot := func(ctx context.Context, name string) {
		t.Helper()
		for _, width := range []int64{800, 1280} {
			if err := do(ctx, chromedp.EmulateViewport(width, 900)); err != nil {
				t.Fatal(err)
			}
			png, err := run(ctx, chromedp.FullScreenshot(100))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(shots, fmt.Sprintf("%s-%d.png", name, width)), png, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	text := func(ctx context.Context) string {
		t.Helper()
		s, err := run(ctx, chromedp.Text("body", css("body")))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	signIn := func(ctx context.Context, secret string) {
		t.Helper()
		if err := do(ctx,
			chromedp.Navigate(b.url+"/console/"),
			waitVisible("#token"), // not signed in: the sign-in page
			sendKeys("#token", secret),
			submit("#token"),
			waitVisible(".tiles"),
		); err != nil {
			t.Fatal(err)
		}
	}

	op := browser(t, bin)
	if err := do(op, chromedp.Navigate(b.url+"/console/signin"), waitVisible("#token")); err != nil {
		t.Fatal(err)
	}
	shot(op, "signin")
	signIn(op, operatorSecret)
	if s := text(op); !strings.Contains(s, "dead letters") || !strings.Contains(s, "oscar") {
		t.Fatalf("overview:\n%s", s)
	}
	shot(op, "overview")
	if err := do(op, chromedp.Navigate(b.url+"/console/dead-letters"), waitVisible("table.dead")); err != nil {
		t.Fatal(err)
	}
	if s := text(op); !strings.Contains(s, "RAIL_REJECTED") || !strings.Contains(s, "acme-payroll") {
		t.Fatalf("dead letters page:\n%s", s)
	}
	shot(op, "dead-letters")
	if _, err := run(op, chromedp.Evaluate[bool](`(() => { document.querySelectorAll("table.dead tbody tr:first-child details").forEach(d => d.open = true); return true; })()`)); err != nil {
		t.Fatal(err)
	}
	shot(op, "dead-letters-forms-opened")

	// From a participant's page, its count of open dead letters leads to
	// its own dead letters only: globex's one, not acme-payroll's.
	if err := do(op,
		chromedp.Navigate(b.url+"/console/participant?id=globex"),
		waitVisible("section.card"),
		click(`section.card a[href^="/console/dead-letters"]`),
		waitVisible("table.dead"),
	); err != nil {
		t.Fatal(err)
	}
	landed, err := run(op, chromedp.Evaluate[[]string](
		`[...document.querySelectorAll("table.dead tbody tr")].map(r => r.id + " " + (r.cells[2] ? r.cells[2].innerText : r.innerText))`))
	if err != nil {
		t.Fatal(err)
	}
	if want := "dl-" + second.String() + " globex"; len(landed) != 1 || landed[0] != want {
		t.Fatalf("the participant page's dead letters link of globex lands on rows %q, want only %q", landed, want)
	}
	if s := text(op); !strings.Contains(s, "1 open dead letter of participant globex") || strings.Contains(s, "acme-payroll") {
		t.Fatalf("globex's dead letters:\n%s", s)
	}
	shot(op, "dead-letters-of-globex")

	if err := do(op, chromedp.Navigate(b.url+"/console/dead-letters"), waitVisible("table.dead")); err != nil {
		t.Fatal(err)
	}
	form := `form[action="/console/dead-letters/` + first.String() + `/replay"]`
	if err := do(op,
		click(`tr[id="dl-`+first.String()+`"] details.act-replay > summary`), // the forms are folded
		sendKeys(form+` input[name="reason"]`, "beneficiary bank fixed the account"),
		click(form+` button`),
		waitVisible("p.ok"),
	); err != nil {
		t.Fatal(err)
	}
	if s := text(op); !strings.Contains(s, "Replayed "+first.String()+" (instruction ins-k1 of participant acme-payroll) as oscar") {
		t.Fatalf("after the replay:\n%s", s)
	}
	shot(op, "dead-letters-after-replay")

	// Before any relayer runs again: initech's head is due, the rest of
	// its instructions queued behind it.
	if err := do(op, chromedp.Navigate(b.url+"/console/participant?id=initech"), waitVisible("section.card")); err != nil {
		t.Fatal(err)
	}
	if s := text(op); !strings.Contains(s, "waiting for a relayer") {
		t.Fatalf("participant view:\n%s", s)
	}
	shot(op, "participant")
	if err := do(op, chromedp.Navigate(b.url+"/console/instructions?state=pending"), waitVisible("table")); err != nil {
		t.Fatal(err)
	}
	if s := text(op); !strings.Contains(s, "queued") || !strings.Contains(s, "due") {
		t.Fatalf("instructions page:\n%s", s)
	}
	shot(op, "instructions")

	stop = b.relayWith(t, rails.SandboxOptions{})
	defer stop()
	waitFor(t, "the replayed instruction dispatched", func() bool {
		var n int
		_ = b.pool.QueryRow(b.ctx, "SELECT count(*) FROM outbox.attempts WHERE outbox_id = $1 AND state = 'DISPATCHED'", first).Scan(&n)
		return n == 1
	})
	if err := do(op, chromedp.Navigate(b.url+"/console/trail?id="+first.String()), waitVisible("ol.timeline")); err != nil {
		t.Fatal(err)
	}
	s := text(op)
	for _, want := range []string{"FAILED", "REPLAYED", "by oscar", "beneficiary bank fixed the account", "DISPATCHED"} {
		if !strings.Contains(s, want) {
			t.Fatalf("trail lacks %q:\n%s", want, s)
		}
	}
	if strings.Index(s, "REPLAYED") > strings.LastIndex(s, "DISPATCHED") {
		t.Fatalf("trail out of order:\n%s", s)
	}
	shot(op, "trail")
	if err := do(op, chromedp.Navigate(b.url+"/console/"), waitVisible("form.inline"), click("form.inline button"), waitVisible("section.card")); err != nil {
		t.Fatal(err)
	}
	shot(op, "verify")

	// Pause the sandbox rail from the overview's link to the rails page,
	// see the banner (and the rail held), resume it from the banner's
	// link.
	pause := `form.pause`
	if err := do(op,
		chromedp.Navigate(b.url+"/console/"),
		click(`a.pause`), // the forms' page, which does not refresh itself
		waitVisible(pause),
		sendKeys(pause+` input[name="rail"]`, "sandbox"),
		sendKeys(pause+` input[name="reason"]`, "beneficiary bank's maintenance window"),
		click(pause+` button`),
		waitVisible("div.paused"),
	); err != nil {
		t.Fatal(err)
	}
	if s := text(op); !strings.Contains(s, "Paused rail sandbox") || !strings.Contains(s, "rail sandbox is paused") ||
		!strings.Contains(s, "by oscar: beneficiary bank's maintenance window") {
		t.Fatalf("after the pause:\n%s", s)
	}
	shot(op, "overview-paused")
	held := b.enqueue(t, "initech", "k6")
	if err := do(op,
		click(`div.paused a.resume`),
		waitVisible(`div.paused input[name="reason"]`),
		sendKeys(`div.paused input[name="reason"]`, "maintenance over"),
		click(`div.paused button`),
		chromedp.WaitNotPresent("div.paused", css("div.paused")),
		waitVisible("p.notice"),
	); err != nil {
		t.Fatal(err)
	}
	if s := text(op); !strings.Contains(s, "Resumed rail sandbox.") || strings.Contains(s, "is paused") {
		t.Fatalf("after the resume:\n%s", s)
	}
	waitFor(t, "the instruction held by the pause dispatched", func() bool {
		var n int
		_ = b.pool.QueryRow(b.ctx, "SELECT count(*) FROM outbox.attempts WHERE outbox_id = $1 AND state = 'DISPATCHED'", held).Scan(&n)
		return n == 1
	})

	au := browser(t, bin)
	signIn(au, auditorSecret)
	if err := do(au, chromedp.Navigate(b.url+"/console/dead-letters"), waitVisible("table.dead")); err != nil {
		t.Fatal(err)
	}
	buttons, err := run(au, chromedp.Evaluate[int](`document.querySelectorAll("button.replay, button.ack").length`))
	if err != nil {
		t.Fatal(err)
	}
	if s := text(au); buttons != 0 || !strings.Contains(s, "globex") {
		t.Fatalf("the auditor's dead letters page: %d action buttons\n%s", buttons, s)
	}
	shot(au, "dead-letters-auditor")
	status, err := run(au, chromedp.Evaluate[int](`fetch("/console/dead-letters/`+second.String()+`/replay",
		{method: "POST", headers: {"Content-Type": "application/x-www-form-urlencoded"}, body: "reason=because&csrf=guess"}).then(r => r.status)`,
		chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatal(err)
	}
	if status != 403 {
		t.Fatalf("an auditor's replay: %d, want 403", status)
	}
	var stillDead int
	if err := b.pool.QueryRow(b.ctx, "SELECT count(*) FROM outbox.dead_letters WHERE outbox_id = $1", second).Scan(&stillDead); err != nil || stillDead != 1 {
		t.Fatalf("the auditor's replay changed something: %d %v", stillDead, err)
	}
	t.Logf("screenshots in %s", shots)
}
