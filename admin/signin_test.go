package admin_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/admin"
)

// signinServer serves a console whose database is never reached: the
// sign-in needs none.
func signinServer(t *testing.T, cfg admin.Config) string {
	t.Helper()
	pool, err := pgxpool.New(t.Context(), "postgres://nobody@127.0.0.1:1/nowhere") // connects lazily: never here
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if cfg.Tokens, err = admin.ParseTokens(strings.NewReader("auditor audra " + auditorSecret + "\n")); err != nil {
		t.Fatal(err)
	}
	cfg.Pool = pool
	srv, err := admin.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	return hs.URL
}

// noRedirect is a client that shows a redirect rather than following it.
var noRedirect = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// signin posts the token to base's sign-in with the headers given.
func signin(t *testing.T, base, token string, header map[string]string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), "POST", base+"/console/signin", strings.NewReader(url.Values{"token": {token}}.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := noRedirect.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

// framed reports whether resp lacks the headers that keep the console's
// pages out of other sites' frames (clickjacking).
func framed(resp *http.Response) bool {
	return resp.Header.Get("X-Frame-Options") != "DENY" ||
		!strings.Contains(resp.Header.Get("Content-Security-Policy"), "frame-ancestors 'none'")
}

// TestSignInPageIsNotFramed: the sign-in page, and its answer to a wrong
// token, carry the headers every other console page carries.
func TestSignInPageIsNotFramed(t *testing.T) {
	t.Parallel()
	base := signinServer(t, admin.Config{})
	resp, err := http.Get(base + "/console/signin")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || framed(resp) {
		t.Errorf("GET /console/signin: %s %v", resp.Status, resp.Header)
	}
	if resp := signin(t, base, "wrong-secret-0123456789", nil); resp.StatusCode != http.StatusUnauthorized || framed(resp) {
		t.Errorf("a wrong token: %s %v", resp.Status, resp.Header)
	}
}

// TestSignInRefusesCrossOriginPosts: another site's page must not sign a
// visitor's browser in with the other site's token (login CSRF: what the
// visitor then does is recorded under that token). A browser's
// cross-origin post is refused without a session; a same-origin one, and a
// client that sends neither Sec-Fetch-Site nor Origin (not a browser),
// signs in.
func TestSignInRefusesCrossOriginPosts(t *testing.T) {
	t.Parallel()
	base := signinServer(t, admin.Config{})
	for _, tt := range []struct {
		name   string
		header map[string]string
		want   int
	}{
		{"cross-site", map[string]string{"Sec-Fetch-Site": "cross-site"}, http.StatusForbidden},
		{"same-site, other origin", map[string]string{"Sec-Fetch-Site": "same-site"}, http.StatusForbidden},
		{"another origin, no Sec-Fetch-Site", map[string]string{"Origin": "http://evil.example"}, http.StatusForbidden},
		{"same-origin", map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": base}, http.StatusSeeOther},
		{"not a browser", nil, http.StatusSeeOther},
	} {
		resp := signin(t, base, auditorSecret, tt.header)
		signedIn := len(resp.Cookies()) > 0
		if resp.StatusCode != tt.want || signedIn != (tt.want == http.StatusSeeOther) || framed(resp) {
			t.Errorf("%s: %s, session cookie %v, %v", tt.name, resp.Status, signedIn, resp.Header)
		}
	}
}

// TestSessionCookieSecure: by default the session cookie is Secure only
// when this process terminates TLS; Config.SecureCookie makes it Secure
// over plain HTTP too, for a console behind a TLS-terminating proxy
// (otherwise the browser would send the session over plain HTTP to any
// http:// address of the host).
func TestSessionCookieSecure(t *testing.T) {
	t.Parallel()
	for _, secure := range []bool{false, true} {
		base := signinServer(t, admin.Config{SecureCookie: secure})
		resp := signin(t, base, auditorSecret, nil)
		if c := resp.Cookies(); resp.StatusCode != http.StatusSeeOther || len(c) != 1 || c[0].Secure != secure || !c[0].HttpOnly {
			t.Errorf("SecureCookie %v: %s %v", secure, resp.Status, resp.Header["Set-Cookie"])
		}
	}
}

// TestOversizedBodiesAreRefused: the sign-in form is open to anyone who
// reaches the address, so what it reads is bounded: a body said to be
// larger than admin.MaxRequestBody gets 413 unread, and one that sends more
// than that without saying so is cut off and read as no form at all, even
// with a valid token at its start.
func TestOversizedBodiesAreRefused(t *testing.T) {
	t.Parallel()
	base := signinServer(t, admin.Config{})
	form := url.Values{"token": {auditorSecret}, "pad": {strings.Repeat("x", admin.MaxRequestBody)}}.Encode()
	for _, chunked := range []bool{false, true} {
		var body io.Reader = strings.NewReader(form)
		if chunked {
			body = io.MultiReader(body) // no length known: sent chunked
		}
		req, err := http.NewRequestWithContext(t.Context(), "POST", base+"/console/signin", body)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		want := http.StatusRequestEntityTooLarge
		if chunked {
			want = http.StatusUnauthorized
		}
		if resp.StatusCode != want || resp.Header.Get("Set-Cookie") != "" {
			t.Errorf("chunked %v: %s, cookie %q; want %d and no session", chunked, resp.Status, resp.Header.Get("Set-Cookie"), want)
		}
	}
	if resp := signin(t, base, auditorSecret, nil); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("a sign-in of ordinary size: %s", resp.Status)
	}
}

// TestAnswersAreNotSniffed: every answer of the admin address says its
// type and forbids a browser to guess another (X-Content-Type-Options:
// nosniff): the API's JSON, which carries rail error messages, reasons
// and ids, and the console's pages, including the sign-in's answer to a
// wrong token, whose type was set after its status and so not sent.
func TestAnswersAreNotSniffed(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	get := func(path, secret string) *http.Response {
		req, err := http.NewRequestWithContext(t.Context(), "GET", b.url+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if secret != "" {
			req.Header.Set("Authorization", "Bearer "+secret)
		}
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	c := consoleAt(t, b.url)
	page, err := c.client.Get(b.url + "/console/dead-letters")
	if err != nil {
		t.Fatal(err)
	}
	page.Body.Close()
	for _, tt := range []struct {
		name, wantType string
		resp           *http.Response
	}{
		{"the API", "application/json", get("/api/v1/overview", auditorSecret)},
		{"the API refusing a request", "application/json", get("/api/v1/overview", "")},
		{"/healthz", "application/json", get("/healthz", "")},
		{"/readyz", "application/json", get("/readyz", "")},
		{"the sign-in page", "text/html; charset=utf-8", get("/console/signin", "")},
		{"a wrong token's sign-in", "text/html; charset=utf-8", signin(t, b.url, "wrong-secret-0123456789", nil)},
		{"a console page", "text/html; charset=utf-8", page},
	} {
		if tt.resp.Header.Get("X-Content-Type-Options") != "nosniff" || tt.resp.Header.Get("Content-Type") != tt.wantType {
			t.Errorf("%s: %s %v", tt.name, tt.resp.Status, tt.resp.Header)
		}
	}
}

// TestSignOutEndsTheSession: signing out ends the session in the process,
// not only in the browser: its cookie, replayed (a stolen copy), no
// longer opens a page nor carries a form; and a sign-out without the
// session's CSRF token (another site's form) ends nothing.
func TestSignOutEndsTheSession(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	c := consoleAs(t, b.url, operatorSecret)
	m := regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`).FindStringSubmatch(c.get(t, "/console/"))
	if m == nil {
		t.Fatal("no CSRF token on the overview")
	}
	base, err := url.Parse(b.url + "/console/")
	if err != nil {
		t.Fatal(err)
	}
	var stolen *http.Cookie
	for _, ck := range c.client.Jar.Cookies(base) {
		if ck.Name == "outbox_session" {
			stolen = ck
		}
	}
	if stolen == nil {
		t.Fatal("no session cookie")
	}
	post := func(path string, form url.Values) int {
		req, err := http.NewRequestWithContext(t.Context(), "POST", b.url+path, strings.NewReader(form.Encode()))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.AddCookie(stolen)
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post("/console/signout", url.Values{}); code != http.StatusForbidden {
		t.Errorf("a sign-out without the CSRF token: %d", code)
	}
	if page := c.get(t, "/console/"); !strings.Contains(page, "Sign out") {
		t.Fatalf("the session ended without its CSRF token:\n%s", page)
	}
	if code := post("/console/signout", url.Values{"csrf": {m[1]}}); code != http.StatusSeeOther {
		t.Fatalf("sign-out: %d", code)
	}
	req, err := http.NewRequestWithContext(t.Context(), "GET", b.url+"/console/", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.AddCookie(stolen)
	resp, err := noRedirect.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/console/signin" {
		t.Errorf("a page with the signed-out session's cookie: %s %v", resp.Status, resp.Header)
	}
	if code := post("/console/rails/pause", url.Values{"csrf": {m[1]}, "rail": {"*"}, "reason": {"x"}}); code != http.StatusUnauthorized {
		t.Errorf("a form with the signed-out session's cookie and CSRF token: %d", code)
	}
}

// TestSignInAgainEndsTheSessionItReplaces: a browser that signs in again
// (another token, or the same after a while) gets a new session cookie in
// place of its old one, and the old session ended with it: it stayed open
// in the process, unseen, until its 12 h were up, so that signing out of
// the new one left a copy of the old cookie (taken from the machine
// before) signed in.
func TestSignInAgainEndsTheSessionItReplaces(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	c := consoleAs(t, b.url, operatorSecret)
	base, err := url.Parse(b.url + "/console/")
	if err != nil {
		t.Fatal(err)
	}
	session := func() *http.Cookie {
		for _, ck := range c.client.Jar.Cookies(base) {
			if ck.Name == "outbox_session" {
				return ck
			}
		}
		t.Fatal("no session cookie")
		return nil
	}
	old := session()
	resp, err := c.client.PostForm(b.url+"/console/signin", url.Values{"token": {auditorSecret}})
	c.read(t, "sign in again", resp, err)
	if session().Value == old.Value {
		t.Fatal("signing in again kept the session cookie")
	}
	req, err := http.NewRequestWithContext(t.Context(), "GET", b.url+"/console/rails", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.AddCookie(old)
	resp, err = noRedirect.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/console/signin" {
		t.Errorf("the replaced operator's session still opens its pages: %s", resp.Status)
	}
}
