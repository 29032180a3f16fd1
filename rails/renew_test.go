package rails

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestConnectionsRenewedAfterTheirAge: a rail endpoint moved by DNS (its
// host now resolving to another address) must be reached at the new
// address within the connections' age, also under a steady load that never
// leaves the HTTP/2 connection idle, and a request in flight over the old
// connection must finish. The test's dialer reads "the DNS" when a
// connection is opened, as the real resolver does; the clock is the
// test's.
func TestConnectionsRenewedAfterTheirAge(t *testing.T) {
	t.Parallel()
	type site struct {
		srv    *httptest.Server
		hits   atomic.Int64
		closed atomic.Int64 // connections closed
	}
	release := make(chan struct{})
	newSite := func() *site {
		s := &site{}
		s.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			s.hits.Add(1)
			if r.URL.Path == "/slow" {
				<-release
			}
			io.WriteString(w, r.Proto)
		}))
		s.srv.EnableHTTP2 = true
		s.srv.Config.ConnState = func(_ net.Conn, state http.ConnState) {
			if state == http.StateClosed {
				s.closed.Add(1)
			}
		}
		s.srv.StartTLS()
		t.Cleanup(s.srv.Close)
		return s
	}
	old, moved := newSite(), newSite()
	var releaseOnce sync.Once
	free := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(free) // before the servers' Close, which waits for their handlers
	roots := x509.NewCertPool()
	roots.AddCert(old.srv.Certificate()) // httptest's one certificate, for both

	var dns atomic.Value // the address the rail's host resolves to now
	dns.Store(old.srv.Listener.Addr().String())
	var clock atomic.Int64
	const age = time.Minute
	rt := newRenewingTransport(func() *http.Transport {
		return &http.Transport{
			DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, network, dns.Load().(string))
			},
			ForceAttemptHTTP2: true,
			TLSClientConfig:   &tls.Config{RootCAs: roots, ServerName: "example.com"},
		}
	}, age)
	rt.now = func() time.Time { return time.Unix(0, clock.Load()) }
	client := &http.Client{Transport: rt}
	t.Cleanup(client.CloseIdleConnections)

	get := func(path string) {
		t.Helper()
		resp, err := client.Get("https://rail.example" + path)
		if err != nil {
			t.Error(err)
			return
		}
		defer resp.Body.Close()
		if b, _ := io.ReadAll(resp.Body); string(b) != "HTTP/2.0" {
			t.Errorf("answered over %q, want HTTP/2.0", b)
		}
	}
	for range 5 {
		get("/")
	}
	// A request in flight over the old connection when the host moves and
	// the connection reaches its age.
	var slow sync.WaitGroup
	slow.Go(func() { get("/slow") })
	for old.hits.Load() < 6 {
		time.Sleep(time.Millisecond)
	}

	dns.Store(moved.srv.Listener.Addr().String())
	clock.Add(int64(age / 2))
	for range 5 {
		get("/") // still the old connection, as before
	}
	if n := moved.hits.Load(); n != 0 {
		t.Fatalf("%d requests reached the moved host before the connection's age", n)
	}
	clock.Add(int64(age / 2))
	for range 5 {
		get("/")
	}
	if n := moved.hits.Load(); n != 5 {
		t.Fatalf("%d of 5 requests after the connection's age reached the moved host (the old address got %d in all)", n, old.hits.Load())
	}
	if n := old.closed.Load(); n != 0 {
		t.Fatalf("the old connection closed with a request in flight (%d closed)", n)
	}
	free()
	slow.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for old.closed.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if old.closed.Load() == 0 {
		t.Fatal("the old connection is still open after its last answer was read")
	}
	rt.mu.Lock()
	retired := len(rt.retired)
	rt.mu.Unlock()
	if retired != 0 {
		t.Fatalf("%d transports past their age are still kept after their answers were read", retired)
	}
}

// TestWebhookConnectionsHaveAnAge: the built-in client opens new
// connections once its connections reach ConnectionMaxAge, and keeps one
// connection for every request within the default's.
func TestWebhookConnectionsHaveAnAge(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		age  time.Duration
		want int64 // connections opened for 3 sends
	}{{0, 1}, {time.Nanosecond, 3}} {
		var opened atomic.Int64
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
		}))
		srv.Config.ConnState = func(_ net.Conn, state http.ConnState) {
			if state == http.StateNew {
				opened.Add(1)
			}
		}
		srv.StartTLS()
		t.Cleanup(srv.Close)
		pool := x509.NewCertPool()
		pool.AddCert(srv.Certificate())
		w, err := NewWebhook(WebhookOptions{URL: srv.URL, Secret: testWebhookSecret, RootCAs: pool, ConnectionMaxAge: tt.age})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(w.client.CloseIdleConnections)
		for i := range 3 {
			if res, err := w.Send(t.Context(), testInstruction(t, "key-age-"+strconv.Itoa(i))); err != nil || res.Code != "HTTP_200" {
				t.Fatalf("send %d: %+v, %v", i, res, err)
			}
		}
		if n := opened.Load(); n != tt.want {
			t.Errorf("ConnectionMaxAge %s: %d connections opened for 3 sends, want %d", tt.age, n, tt.want)
		}
	}
}
