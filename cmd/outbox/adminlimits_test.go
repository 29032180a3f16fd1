package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestAdminServerDropsSlowAndIdleClients: a client that sends a request's
// headers and then trickles (or never sends) its body, and one that keeps
// a connection open without asking anything, lose their connections after
// the admin server's limits; the defaults set every limit.
func TestAdminServerDropsSlowAndIdleClients(t *testing.T) {
	t.Parallel()
	if l := defaultAdminLimits; l.header <= 0 || l.read <= 0 || l.idle <= 0 {
		t.Fatalf("defaultAdminLimits leave a limit unset: %+v", l)
	}
	lim := adminLimits{header: 300 * time.Millisecond, read: 300 * time.Millisecond, idle: 300 * time.Millisecond}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusNoContent)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := adminHTTPServer(handler, lim)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	// closedWithin reports whether the server closes c (after whatever it
	// answers) within d.
	closedWithin := func(c net.Conn, d time.Duration) bool {
		_ = c.SetReadDeadline(time.Now().Add(d))
		_, err := io.Copy(io.Discard, c)
		return !errors.Is(err, os.ErrDeadlineExceeded)
	}

	slow, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	if _, err := io.WriteString(slow, "POST /console/signin HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\ntoken="); err != nil {
		t.Fatal(err)
	}
	if !closedWithin(slow, 10*time.Second) {
		t.Error("a body never finished kept its connection")
	}

	idle, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	if _, err := io.WriteString(idle, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(idle), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("GET /: %s", resp.Status)
	}
	if !closedWithin(idle, 10*time.Second) {
		t.Error("a kept-alive connection with no request stayed open")
	}
}

// TestAdminMaxRequestsFlag: --admin-max-requests (or
// OUTBOX_ADMIN_MAX_REQUESTS) sets how many API and console requests the
// admin address serves at once, and the admin address's pool has a
// connection for each and one for the probes; a negative one is refused
// as a usage error naming the flag (exit 2), for relay and demo alike.
// Without the flag, admin.Config.MaxConcurrentRequests could be set only
// by a Go program.
func TestAdminMaxRequestsFlag(t *testing.T) {
	t.Parallel()
	rf, err := parseRelayFlags(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := rf.checkAdmin(); err != nil || rf.adminMaxRequests != 0 || rf.adminPoolConns() != adminConns {
		t.Fatalf("the default: %d requests, a pool of %d (%v); want 0 (admin's default) and %d", rf.adminMaxRequests, rf.adminPoolConns(), err, adminConns)
	}
	for _, c := range []struct {
		vars map[string]string
		args []string
	}{
		{nil, []string{"--admin-max-requests", "7"}},
		{map[string]string{"OUTBOX_ADMIN_MAX_REQUESTS": "7"}, nil},
	} {
		rf, err := parseRelayFlags(c.vars, c.args)
		if err != nil {
			t.Fatalf("%v %v: %v", c.vars, c.args, err)
		}
		if err := rf.checkAdmin(); err != nil || rf.adminMaxRequests != 7 || rf.adminPoolConns() != 8 {
			t.Errorf("%v %v: %d requests, a pool of %d (%v); want 7 and 8", c.vars, c.args, rf.adminMaxRequests, rf.adminPoolConns(), err)
		}
	}
	rf, err = parseRelayFlags(nil, []string{"--admin-max-requests", "-1"})
	if err != nil {
		t.Fatal(err)
	}
	if err := rf.checkAdmin(); !errors.Is(err, errUsage) || !errors.Is(err, errNegativeAdminRequests) {
		t.Errorf("checkAdmin of -1: %v, want errUsage and errNegativeAdminRequests", err)
	}
	for _, cmd := range []string{"relay", "demo"} {
		r := invokeCLI(t, nil, "", cmd, "--database-url", deadDatabaseURL, "--admin-max-requests", "-1")
		requireExit(t, r, 2)
		if !strings.Contains(r.stderr, "--admin-max-requests -1 must not be negative") {
			t.Errorf("%s: stderr does not name the flag: %s", cmd, r.stderr)
		}
	}
}

// TestAdminTrustedProxiesFlag: --admin-trusted-proxies (or
// OUTBOX_ADMIN_TRUSTED_PROXIES) names the proxies whose X-Forwarded-For
// the admin address believes, as prefixes or single addresses; one that
// is neither is refused as a usage error naming the flag (exit 2).
func TestAdminTrustedProxiesFlag(t *testing.T) {
	t.Parallel()
	rf, err := parseRelayFlags(nil, []string{"--admin-trusted-proxies", "10.0.0.0/8, 192.0.2.1,2001:db8::/32"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := rf.trustedProxies()
	want := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.0.2.1/32"), netip.MustParsePrefix("2001:db8::/32")}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("trusted proxies %v (%v), want %v", got, err, want)
	}
	if rf, err = parseRelayFlags(nil, nil); err != nil {
		t.Fatal(err)
	}
	if got, err := rf.trustedProxies(); err != nil || got != nil {
		t.Errorf("the default: %v %v, want none", got, err)
	}
	if rf, err = parseRelayFlags(nil, []string{"--admin-trusted-proxies", "10.0.0.0/8,proxy.internal"}); err != nil {
		t.Fatal(err)
	}
	if _, err := rf.trustedProxies(); !errors.Is(err, errUsage) || !errors.Is(err, errTrustedProxies) {
		t.Errorf("a host name: %v, want errUsage and errTrustedProxies", err)
	}
	for _, cmd := range []string{"relay", "demo"} {
		r := invokeCLI(t, nil, "", cmd, "--database-url", deadDatabaseURL, "--admin-trusted-proxies", "proxy.internal")
		requireExit(t, r, 2)
		if !strings.Contains(r.stderr, "--admin-trusted-proxies") || !strings.Contains(r.stderr, "proxy.internal") {
			t.Errorf("%s: stderr does not name the flag and the entry: %s", cmd, r.stderr)
		}
	}
}

// TestAdminMaxRequestsPastAPoolIsRefused: an --admin-max-requests whose
// pool (one connection more) does not fit a pool's int32 is refused as a
// usage error naming the flag (exit 2), as --max-conns past it is. It was
// taken: the pool's size wrapped (4294967299 requests at once, a pool of
// 4 connections; 2147483647, a negative size that pgxpool refused at
// connect, far from the flag).
func TestAdminMaxRequestsPastAPoolIsRefused(t *testing.T) {
	t.Parallel()
	for _, n := range []string{"2147483647", "4294967299"} {
		rf, err := parseRelayFlags(nil, []string{"--admin-max-requests", n})
		if err != nil {
			t.Fatal(err)
		}
		if err := rf.checkAdmin(); !errors.Is(err, errUsage) {
			t.Errorf("--admin-max-requests %s: checkAdmin %v (a pool of %d), want errUsage", n, err, rf.adminPoolConns())
		}
	}
	for _, cmd := range []string{"relay", "demo"} {
		// Taken, the command would run on, waiting for the database: the
		// deadline ends it, and the refusal it did not make fails the test.
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		var stderr bytes.Buffer
		env := &environment{stdin: strings.NewReader(""), stdout: io.Discard, stderr: &stderr, getenv: func(string) string { return "" }}
		err := run(ctx, env, []string{cmd, "--database-url", deadDatabaseURL, "--admin-max-requests", "4294967299"})
		cancel()
		if code := exitCode(env, err); code != 2 || !strings.Contains(stderr.String(), "--admin-max-requests 4294967299 is out of range") {
			t.Errorf("%s: exit %d, stderr %q; want 2, naming the flag", cmd, code, stderr.String())
		}
	}
	rf, err := parseRelayFlags(nil, []string{"--admin-max-requests", "2147483646"})
	if err != nil {
		t.Fatal(err)
	}
	if err := rf.checkAdmin(); err != nil || rf.adminPoolConns() != 2147483647 {
		t.Errorf("--admin-max-requests 2147483646: %v, a pool of %d, want accepted with 2147483647", err, rf.adminPoolConns())
	}
}
