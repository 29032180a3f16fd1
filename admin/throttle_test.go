package admin_test

import (
	"bytes"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/admin"
)

// throttleServer serves an admin address whose database is never reached
// (sign-ins and refusals need none), on a test clock, logging to logs.
func throttleServer(t *testing.T, cfg admin.Config) (base string, srv *admin.Server, clock *admin.Clock, logs func() string) {
	t.Helper()
	pool, err := pgxpool.New(t.Context(), "postgres://nobody@127.0.0.1:1/nowhere") // connects lazily: never here
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	toks, err := admin.ParseTokens(strings.NewReader("auditor audra " + auditorSecret + "\noperator oscar " + operatorSecret + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	var mu sync.Mutex
	cfg.Pool, cfg.Tokens, cfg.Logger = pool, toks, slog.New(slog.NewTextHandler(lockedWriter{&buf, &mu}, nil))
	srv, err = admin.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	clock = admin.UseClock(srv)
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	return hs.URL, srv, clock, func() string {
		mu.Lock()
		defer mu.Unlock()
		return buf.String()
	}
}

// bearer makes a request of path with the credential secret ("": none).
func bearer(t *testing.T, base, path, secret string) *http.Response {
	t.Helper()
	resp, _ := sendAPI(t, t.Context(), "GET", base+path, secret, nil)
	return resp
}

// TestGuessesAreThrottled: after AuthFailureLimit wrong secrets from one
// address within AuthFailureWindow (the console's sign-in, the API's
// bearer tokens and /readyz's count together), every request from it
// that carries a secret is answered 429 with a Retry-After, without the
// secret being checked (a right one too), and the throttle is logged
// once; successes count for nothing; the window over, a right secret
// signs in again. Without it, a guesser could try secrets as fast as the
// address answered, each only logged.
func TestGuessesAreThrottled(t *testing.T) {
	t.Parallel()
	base, _, clock, logs := throttleServer(t, admin.Config{})
	for range admin.AuthFailureLimit + 1 {
		if resp := signin(t, base, auditorSecret, nil); resp.StatusCode != http.StatusSeeOther {
			t.Fatalf("a right sign-in: %s", resp.Status)
		}
	}
	for i := range admin.AuthFailureLimit {
		var code int
		switch i % 3 {
		case 0:
			code = signin(t, base, "wrong-secret-0123456789", nil).StatusCode
		case 1:
			code = bearer(t, base, "/api/v1/overview", "wrong-secret-0123456789").StatusCode
		default:
			code = bearer(t, base, "/readyz", "wrong-secret-0123456789").StatusCode
		}
		if want := http.StatusUnauthorized; code != want && !(i%3 == 2 && code == http.StatusServiceUnavailable) {
			t.Fatalf("guess %d: %d, want it refused as a guess", i, code)
		}
	}
	for _, c := range []struct {
		what string
		resp *http.Response
	}{
		{"a wrong sign-in", signin(t, base, "wrong-secret-0123456789", nil)},
		{"a right sign-in", signin(t, base, operatorSecret, nil)},
		{"the API with a right secret", bearer(t, base, "/api/v1/overview", auditorSecret)},
		{"the API with a wrong secret", bearer(t, base, "/api/v1/overview", "wrong-secret-0123456789")},
		{"/readyz with a secret", bearer(t, base, "/readyz", auditorSecret)},
	} {
		if c.resp.StatusCode != http.StatusTooManyRequests {
			t.Errorf("%s after %d guesses: %s, want 429", c.what, admin.AuthFailureLimit, c.resp.Status)
			continue
		}
		if s, err := strconv.Atoi(c.resp.Header.Get("Retry-After")); err != nil || s < 1 || s > int(admin.AuthFailureWindow.Seconds()) {
			t.Errorf("%s: Retry-After %q", c.what, c.resp.Header.Get("Retry-After"))
		}
	}
	// A probe sends no secret: it is answered as ever.
	if resp := bearer(t, base, "/readyz", ""); resp.StatusCode == http.StatusTooManyRequests {
		t.Errorf("a probe without a secret: %s", resp.Status)
	}
	if n := strings.Count(logs(), "throttled"); n != 1 {
		t.Errorf("the throttle logged %d times, want once:\n%s", n, logs())
	}
	clock.Advance(admin.AuthFailureWindow)
	if resp := signin(t, base, operatorSecret, nil); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("a right sign-in once the window is over: %s", resp.Status)
	}
}

// TestForwardedForOnlyFromTrustedProxies: X-Forwarded-For names the
// client only when the request comes from an address of
// Config.TrustedProxies, and then the address the proxy appended (the
// rightmost not itself a trusted proxy), not one the client wrote: a
// guesser naming a new address per guess is throttled all the same, and
// behind a trusted proxy one client's guesses do not throttle the others.
func TestForwardedForOnlyFromTrustedProxies(t *testing.T) {
	t.Parallel()
	guess := func(base, xff string) int {
		return signin(t, base, "wrong-secret-0123456789", map[string]string{"X-Forwarded-For": xff}).StatusCode
	}
	direct, _, _, _ := throttleServer(t, admin.Config{})
	for i := range admin.AuthFailureLimit {
		guess(direct, "198.51.100."+strconv.Itoa(i))
	}
	if code := guess(direct, "198.51.100.200"); code != http.StatusTooManyRequests {
		t.Errorf("guesses naming a new X-Forwarded-For each, not from a trusted proxy: %d, want 429", code)
	}

	proxied, _, _, _ := throttleServer(t, admin.Config{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
	for i := range admin.AuthFailureLimit {
		// What the client wrote comes first; the proxy appends the
		// address it saw.
		guess(proxied, "198.51.100."+strconv.Itoa(i)+", 203.0.113.7")
	}
	if code := guess(proxied, "198.51.100.200, 203.0.113.7"); code != http.StatusTooManyRequests {
		t.Errorf("a client's guesses through a trusted proxy: %d, want 429", code)
	}
	if resp := signin(t, proxied, auditorSecret, map[string]string{"X-Forwarded-For": "203.0.113.8"}); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("another client of the same trusted proxy: %s, want a sign-in", resp.Status)
	}
}

// TestForwardedForWithPorts: a proxy that writes X-Forwarded-For entries
// with their port (ip:port, [v6]:port; Azure's gateways, some ingress
// controllers) or an IPv6 address in brackets names its client as well:
// the client's guesses throttle that client, not every client of the
// proxy. Such an entry ended the walk unread, so every guess counted
// against the proxy's own address, and one guesser throttled everyone
// behind it.
func TestForwardedForWithPorts(t *testing.T) {
	t.Parallel()
	guess := func(base, xff string) int {
		return signin(t, base, "wrong-secret-0123456789", map[string]string{"X-Forwarded-For": xff}).StatusCode
	}
	for _, c := range []struct{ guesser, other string }{
		{"203.0.113.7:%d", "203.0.113.8:443"},
		{"[2001:db8:1::7]:%d", "[2001:db8:2::8]:443"},
		{"[2001:db8:1::7]", "[2001:db8:2::8]"},
	} {
		proxied, _, _, _ := throttleServer(t, admin.Config{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
		hop := func(pattern string, i int) string {
			if strings.Contains(pattern, "%d") {
				return fmt.Sprintf(pattern, 40000+i)
			}
			return pattern
		}
		for i := range admin.AuthFailureLimit {
			guess(proxied, "198.51.100.1, "+hop(c.guesser, i))
		}
		if code := guess(proxied, hop(c.guesser, 99)); code != http.StatusTooManyRequests {
			t.Errorf("%s: the guesser behind a trusted proxy: %d, want 429", c.guesser, code)
		}
		if resp := signin(t, proxied, auditorSecret, map[string]string{"X-Forwarded-For": c.other}); resp.StatusCode != http.StatusSeeOther {
			t.Errorf("%s: another client of the same trusted proxy: %s, want a sign-in", c.other, resp.Status)
		}
	}
}
