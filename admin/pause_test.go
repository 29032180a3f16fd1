package admin_test

import (
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ledgerline/outbox/admin"
	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/rails"
)

// TestPauseRailThroughAPIAndConsole: operators pause and resume rails
// through the API and the console's forms, auditors may not; the overview
// (API and console) shows the pause at once, with who and why, on the
// rail it holds (every rail for "*").
func TestPauseRailThroughAPIAndConsole(t *testing.T) {
	t.Parallel()
	set, err := rails.NewSet(rails.Options{Type: "sandbox", Profile: payment.Generic{}, Transport: rails.NewSandbox(rails.SandboxOptions{})},
		rails.Options{Type: "event", Profile: payment.Event{}, Transport: rails.NewSandbox(rails.SandboxOptions{})})
	if err != nil {
		t.Fatal(err)
	}
	b := setup(t, admin.Config{Rails: set})
	b.enqueue(t, "acme", "k1")

	reason := map[string]string{"reason": "bank maintenance"}
	if code := b.call(t, "POST", "/api/v1/rails/sandbox/pause", operatorSecret, nil, nil); code != http.StatusBadRequest {
		t.Fatalf("pause without a reason: %d", code)
	}
	if code := b.call(t, "POST", "/api/v1/rails/sandbox/pause", auditorSecret, reason, nil); code != http.StatusForbidden {
		t.Fatalf("pause as auditor: %d", code)
	}
	if code := b.call(t, "POST", "/api/v1/rails/sandbox/halt", operatorSecret, reason, nil); code != http.StatusNotFound {
		t.Fatalf("an unknown action: %d", code)
	}
	var res admin.PauseResult
	if code := b.call(t, "POST", "/api/v1/rails/sandbox/pause", operatorSecret, reason, &res); code != 200 ||
		!res.Done || !res.Quiet || res.By != "oscar" || res.Held != 1 {
		t.Fatalf("pause as operator: %d %+v", code, res)
	}
	if code := b.call(t, "POST", "/api/v1/rails/sandbox/pause", operatorSecret, reason, &res); code != 200 || res.Done {
		t.Fatalf("a second pause: %d %+v (want done false)", code, res)
	}
	var ov admin.Overview
	if code := b.call(t, "GET", "/api/v1/overview", auditorSecret, nil, &ov); code != 200 || len(ov.Queue.PausedRails) != 1 {
		t.Fatalf("overview: %d %+v", code, ov.Queue)
	}
	var sandbox *admin.RailOverview
	for i := range ov.Rails {
		if ov.Rails[i].Rail == "sandbox" {
			sandbox = &ov.Rails[i]
		}
	}
	if sandbox == nil || sandbox.Paused == nil || sandbox.Paused.PausedBy != "oscar" || sandbox.Paused.Reason != "bank maintenance" {
		t.Fatalf("the overview's sandbox rail: %+v", sandbox)
	}

	banner := `is paused, for `
	auditor, operator := consoleAt(t, b.url), consoleAs(t, b.url, operatorSecret)
	if page := auditor.get(t, "/console/"); !strings.Contains(page, `rail <b>sandbox</b> `+banner) ||
		!strings.Contains(page, "by oscar: bank maintenance") || strings.Contains(page, "/console/rails/") {
		t.Fatalf("the auditor's overview: a banner, no forms:\n%s", page)
	}
	// The forms are on a page of their own that does not refresh itself
	// (the overview's refresh would wipe a reason being typed); the
	// overview links to it.
	page := operator.get(t, "/console/")
	if !strings.Contains(page, `href="/console/rails"`) || strings.Contains(page, `action="/console/rails/`) {
		t.Fatalf("the operator's overview: a link to the rails page, no forms:\n%s", page)
	}
	page = operator.get(t, "/console/rails")
	if !strings.Contains(page, `action="/console/rails/resume"`) || !strings.Contains(page, `action="/console/rails/pause"`) ||
		!strings.Contains(page, `rail <b>sandbox</b> `+banner) || strings.Contains(page, `http-equiv="refresh"`) {
		t.Fatalf("the operator's rails page: the pause in force with its resume form, the pause form, no refresh:\n%s", page)
	}
	if resp, err := auditor.client.Get(b.url + "/console/rails"); err != nil {
		t.Fatal(err)
	} else if resp.Body.Close(); resp.StatusCode != http.StatusForbidden {
		t.Errorf("an auditor's rails page: %s, want 403", resp.Status)
	}
	shown := regexp.MustCompile(`name="paused" value="([0-9]+)"`).FindStringSubmatch(page)
	if shown == nil {
		t.Fatalf("the resume form does not carry the pause it shows:\n%s", page)
	}
	page = operator.post(t, "/console/rails/resume", url.Values{"rail": {"sandbox"}, "reason": {"maintenance over"}, "paused": {shown[1]}})
	if !strings.Contains(page, "Resumed rail sandbox.") || strings.Contains(page, banner) {
		t.Fatalf("after the console's resume (the overview read again):\n%s", page)
	}
	if !strings.Contains(page, `content="5; url=/console/?auto=1"`) {
		t.Fatalf("the page that answers the form refreshes to itself:\n%s", page)
	}
	page = operator.post(t, "/console/rails/pause", url.Values{"rail": {"*"}, "reason": {""}})
	if !strings.Contains(page, "A reason is required") || strings.Contains(page, banner) || !strings.Contains(page, `action="/console/rails/pause"`) {
		t.Fatalf("a pause without a reason (the rails page again, its form):\n%s", page)
	}
	page = operator.post(t, "/console/rails/pause", url.Values{"rail": {"*"}, "reason": {"restore drill"}})
	if !strings.Contains(page, "Paused rail *: nothing of it is in flight.") || !strings.Contains(page, "<b>every rail</b> "+banner) {
		t.Fatalf("after the console's pause of every rail:\n%s", page)
	}
	if code := b.call(t, "GET", "/api/v1/overview", auditorSecret, nil, &ov); code != 200 || len(ov.Rails) != 2 {
		t.Fatalf("overview: %d, %d rails (want sandbox and event)", code, len(ov.Rails))
	}
	for _, r := range ov.Rails {
		if r.Paused == nil || r.Paused.RailType != "*" {
			t.Errorf("rail %s is not shown held by the pause of every rail: %+v", r.Rail, r.Paused)
		}
	}
	form := url.Values{"rail": {"*"}, "reason": {"x"}, "csrf": {"forged"}}
	resp, err := auditor.client.PostForm(b.url+"/console/rails/resume", form)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("an auditor's resume: %s", resp.Status)
	}
	if code := b.call(t, "POST", "/api/v1/rails/*/resume", operatorSecret, reason, &res); code != 200 || !res.Done {
		t.Fatalf("resume of every rail: %d %+v", code, res)
	}
	if code := b.call(t, "POST", "/api/v1/rails/*/resume", operatorSecret, reason, &res); code != http.StatusNotFound || res.Done {
		t.Fatalf("resume of a rail that is not paused: %d %+v", code, res)
	}
	b.logMu.Lock()
	logs := b.logs.String()
	b.logMu.Unlock()
	if !strings.Contains(logs, "admin: rail pause") || !strings.Contains(logs, "rail_type=*") {
		t.Errorf("the pauses are not logged:\n%s", logs)
	}
}

// TestConsolePauseOfANameNothingUsesWarns: a pause from the console of a
// rail type that nothing pending has and this process does not serve (a
// misspelling, another letter case) warns that the name may be wrong, as
// `outbox rails pause` does, instead of only "Paused rail Sandbox: nothing
// of it is in flight", while the real rail goes on sending.
func TestConsolePauseOfANameNothingUsesWarns(t *testing.T) {
	t.Parallel()
	set, err := rails.NewSet(rails.Options{Type: "sandbox", Profile: payment.Generic{}, Transport: rails.NewSandbox(rails.SandboxOptions{})})
	if err != nil {
		t.Fatal(err)
	}
	b := setup(t, admin.Config{Rails: set})
	b.enqueue(t, "acme", "k1")
	op := consoleAs(t, b.url, operatorSecret)
	page := op.post(t, "/console/rails/pause", url.Values{"rail": {"Sandbox"}, "reason": {"bank incident"}})
	if !strings.Contains(page, "Paused rail Sandbox") || !strings.Contains(page, "is the name right?") {
		t.Fatalf("a pause of a rail type nothing pending has, that no rail of this process is:\n%s", page)
	}
	page = op.post(t, "/console/rails/pause", url.Values{"rail": {"sandbox"}, "reason": {"bank incident"}})
	if !strings.Contains(page, "Paused rail sandbox") || strings.Contains(page, "is the name right?") {
		t.Fatalf("a pause of the rail with an instruction pending:\n%s", page)
	}
}

// TestConsolePauseOfARailInUseDoesNotWarn: the admin process need not
// serve any rail itself (it runs apart from the relayers); a pause of a
// rail that nothing pending has but that sent in the overview's window
// (the rails table lists it with its outcomes) is of a real rail, and the
// page does not ask whether its name is right, while a misspelling of it
// still warns.
func TestConsolePauseOfARailInUseDoesNotWarn(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	admin.SetOverviewMaxAge(b.srv, 0)
	b.enqueue(t, "acme", "k1")
	b.record(t, b.claim(t, "r1", time.Hour), store.Dispatched, "", 0)
	op := consoleAs(t, b.url, operatorSecret)
	page := op.post(t, "/console/rails/pause", url.Values{"rail": {"sandbox"}, "reason": {"bank incident"}})
	if !strings.Contains(page, "Paused rail sandbox") || strings.Contains(page, "is the name right?") {
		t.Fatalf("a pause of a rail that sent in the last minutes, from an admin process without rails:\n%s", page)
	}
	page = op.post(t, "/console/rails/pause", url.Values{"rail": {"Sandbox"}, "reason": {"bank incident"}})
	if !strings.Contains(page, "Paused rail Sandbox") || !strings.Contains(page, "is the name right?") {
		t.Fatalf("a pause of a rail type nothing pending has, that nothing sent on:\n%s", page)
	}
}
