package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestRelayAdminAddress: `outbox relay --admin-addr` serves /metrics, the
// probes (ready once the relayer listens) and the API with the credentials
// named by --admin-tokens-env; without a credential the API says 401. The
// API's verify runs on the connection --admin-audit-database-url names
// (here the same database, told apart by its application name).
func TestRelayAdminAddress(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	addr, _, stop := b.relayWithAdmin(t, "auditor audra audra-secret-0123456789;operator oscar oscar-secret-0123456789",
		"--admin-audit-database-url", b.url, "--relayer-id", "r-admin")
	call := func(method, path, secret string) (int, string) {
		req, _ := http.NewRequestWithContext(b.ctx, method, "http://"+addr+path, nil)
		if secret != "" {
			req.Header.Set("Authorization", "Bearer "+secret)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	get := func(path, secret string) (int, string) { return call("GET", path, secret) }
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		code, body := get("/readyz", "")
		if code == http.StatusOK {
			var rd map[string]any
			if err := json.Unmarshal([]byte(body), &rd); err != nil || rd["status"] != "ready" {
				t.Fatalf("readyz: %s", body)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("never ready: %d %s", code, body)
		}
	}
	if code, body := get("/metrics", ""); code != 200 || !strings.Contains(body, "outbox_pending_depth") {
		t.Fatalf("metrics: %d", code)
	}
	if code, _ := get("/api/v1/overview", ""); code != http.StatusUnauthorized {
		t.Fatalf("overview without a credential: %d", code)
	}
	if code, body := get("/api/v1/overview", "audra-secret-0123456789"); code != 200 || !strings.Contains(body, `"rail":"sandbox"`) {
		t.Fatalf("overview as auditor: %d %s", code, body)
	}
	if code, body := call("POST", "/api/v1/verify", "audra-secret-0123456789"); code != 200 || !strings.Contains(body, `"ok":true`) {
		t.Fatalf("verify as auditor: %d %s", code, body)
	}
	var audits int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = 'outbox-admin-audit r-admin'`).Scan(&audits); err != nil || audits == 0 {
		t.Fatalf("no connection of the audit pool after a verify (%v)", err)
	}
	if err := stop(); err != nil {
		t.Fatalf("relay: %v", err)
	}
}

// relayWithAdmin runs `outbox relay` on b's database in this process, with
// an admin address on a free port and tokens as its --admin-tokens-env,
// then args. It returns the address, the relay's context (ended by stop),
// and stop, which ends the relay and returns its error (nil for the end
// stop asked for).
func (b *cliBundle) relayWithAdmin(t *testing.T, tokens string, args ...string) (addr string, ctx context.Context, stop func() error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr = ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() {
		vars := map[string]string{"OPS_TOKENS": tokens}
		env := &environment{stdin: strings.NewReader(""), stdout: io.Discard, stderr: io.Discard, getenv: func(k string) string { return vars[k] }}
		done <- run(ctx, env, append([]string{"relay", "--database-url", b.url, "--admin-addr", addr, "--admin-tokens-env", "OPS_TOKENS"}, args...))
	}()
	var once sync.Once
	var result error
	stop = func() error {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
				result = err
			}
		})
		return result
	}
	t.Cleanup(func() { _ = stop() })
	return addr, ctx, stop
}
