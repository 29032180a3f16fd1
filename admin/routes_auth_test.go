package admin_test

import (
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ledgerline/outbox/admin"
	"github.com/ledgerline/outbox/internal/store"
)

// TestEveryActionRefusesTheWrongCaller: each route that acts (replay,
// acknowledge, cancel, pause, resume) refuses a request without a
// credential (401) and an auditor's (403), in the API and on the console,
// where it also refuses an operator's form without the session's CSRF
// token (403) and a cookie-less post carrying a valid CSRF token (401);
// the API takes no session cookie for a credential. Nothing is written:
// the dead letter stays open, the instruction pending, no rail paused.
func TestEveryActionRefusesTheWrongCaller(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	dead := b.enqueue(t, "p-dead", "k1")
	b.record(t, b.claim(t, "r1", time.Hour), store.Failed, "RAIL_REJECTED", 0)
	pending := b.enqueue(t, "p-pending", "k2")
	dl, err := b.st.DeadLetter(b.ctx, b.pool, dead)
	if err != nil || dl == nil {
		t.Fatalf("dead letter: %v %v", dl, err)
	}
	operator, auditor := consoleAs(t, b.url, operatorSecret), consoleAt(t, b.url)
	csrfOf := func(c *consoleClient) string {
		m := regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`).FindStringSubmatch(c.get(t, "/console/"))
		if m == nil {
			t.Fatal("no CSRF token on the overview")
		}
		return m[1]
	}
	opCSRF, audCSRF := csrfOf(operator), csrfOf(auditor)
	base, err := url.Parse(b.url + "/console/")
	if err != nil {
		t.Fatal(err)
	}
	opCookies := operator.client.Jar.Cookies(base)

	api := []string{
		"/api/v1/dead-letters/" + dead.String() + "/replay",
		"/api/v1/dead-letters/" + dead.String() + "/acknowledge",
		"/api/v1/instructions/" + pending.String() + "/cancel",
		"/api/v1/rails/*/pause",
		"/api/v1/rails/sandbox/resume",
	}
	for _, path := range api {
		for _, tt := range []struct {
			who, secret string
			cookie      bool
			want        int
		}{
			{"no credential", "", false, http.StatusUnauthorized},
			{"an operator's session cookie", "", true, http.StatusUnauthorized},
			{"an auditor", auditorSecret, false, http.StatusForbidden},
		} {
			req, err := http.NewRequestWithContext(b.ctx, "POST", b.url+path, strings.NewReader(`{"reason": "x"}`))
			if err != nil {
				t.Fatal(err)
			}
			if tt.secret != "" {
				req.Header.Set("Authorization", "Bearer "+tt.secret)
			}
			if tt.cookie {
				for _, c := range opCookies {
					req.AddCookie(c)
				}
			}
			resp, err := noRedirect.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tt.want {
				t.Errorf("POST %s with %s: %s, want %d", path, tt.who, resp.Status, tt.want)
			}
		}
	}

	failed := strconv.FormatInt(dl.FailedAt.UnixMicro(), 10)
	forms := []struct {
		path string
		form url.Values
	}{
		{"/console/dead-letters/" + dead.String() + "/replay", url.Values{"reason": {"x"}, "failed": {failed}}},
		{"/console/dead-letters/" + dead.String() + "/acknowledge", url.Values{"reason": {"x"}, "failed": {failed}}},
		{"/console/instructions/" + pending.String() + "/cancel", url.Values{"reason": {"x"}}},
		{"/console/rails/pause", url.Values{"rail": {"*"}, "reason": {"x"}}},
		{"/console/rails/resume", url.Values{"rail": {"sandbox"}, "reason": {"x"}}},
	}
	for _, f := range forms {
		for _, tt := range []struct {
			who    string
			client *http.Client
			csrf   string
			want   int
		}{
			{"no session", noRedirect, opCSRF, http.StatusUnauthorized},
			{"an auditor's session", auditor.client, audCSRF, http.StatusForbidden},
			{"an operator's session without its CSRF token", operator.client, "", http.StatusForbidden},
			{"an operator's session with another session's CSRF token", operator.client, audCSRF, http.StatusForbidden},
		} {
			form := url.Values{}
			for k, v := range f.form {
				form[k] = v
			}
			if tt.csrf != "" {
				form.Set("csrf", tt.csrf)
			}
			resp, err := tt.client.PostForm(b.url+f.path, form)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tt.want {
				t.Errorf("POST %s with %s: %s, want %d", f.path, tt.who, resp.Status, tt.want)
			}
		}
	}

	if dl, err := b.st.DeadLetter(b.ctx, b.pool, dead); err != nil || dl == nil || dl.AcknowledgedAt != nil {
		t.Errorf("the dead letter after the refusals: %+v %v", dl, err)
	}
	var ov admin.Overview
	if code := b.call(t, "GET", "/api/v1/overview", auditorSecret, nil, &ov); code != http.StatusOK || ov.Queue.Pending != 1 ||
		ov.Queue.DeadLetters != 1 || len(ov.Queue.PausedRails) != 0 {
		t.Errorf("the queue after the refusals: %d %+v", code, ov.Queue)
	}
}
