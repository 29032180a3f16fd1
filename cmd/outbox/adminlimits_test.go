package main

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
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
