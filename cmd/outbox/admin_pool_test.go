package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ledgerline/outbox/pending"
)

// TestAdminRequestsLeaveTheRelayerItsConnections: requests to the admin
// address that wait (here an audit verify behind a lock on the
// checkpoints table, as a long one would read a large archive; one runs
// at a time) must not take the connections the relayer claims and
// records with. Before the fix, without --admin-database-url, the admin
// address shared the relayer's pool: with --max-conns 1 the verify held
// its connection and an instruction enqueued meanwhile was not
// dispatched until it ended; now the admin address has a pool of its own
// on the same database, and the instruction is dispatched while it
// waits.
func TestAdminRequestsLeaveTheRelayerItsConnections(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	addr, ctx, stop := b.relayWithAdmin(t, "auditor audra audra-secret-0123456789",
		"--relayer-id", "r-pools", "--max-conns", "1", "--reaper=false", "--lock-timeout", "2m", "--poll-interval", "50ms")
	call := func(ctx context.Context, method, path, secret string) (int, string) {
		req, _ := http.NewRequestWithContext(ctx, method, "http://"+addr+path, nil)
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
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		code, body := call(b.ctx, "GET", "/readyz", "")
		if code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("never ready: %d %s", code, body)
		}
	}

	lock, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback(context.Background())
	if _, err := lock.Exec(b.ctx, "LOCK TABLE outbox.checkpoints IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	verifies := make(chan string, 1)
	go func() {
		code, body := call(ctx, "POST", "/api/v1/verify", "audra-secret-0123456789")
		verifies <- http.StatusText(code) + " " + body
	}()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var waiting int
		if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND application_name LIKE '%r-pools'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d verifies wait for the lock, want 1", waiting)
		}
	}

	if _, err := pending.Enqueue(b.ctx, b.pool, pending.Instruction{InstructionID: "i-1", ParticipantID: "p-1",
		IdempotencyKey: "k-1", RailType: "sandbox", AmountMinor: 100, Currency: "USD", Destination: "acct-1"}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var n int
		if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox.attempts WHERE idempotency_key = 'k-1' AND state = 'DISPATCHED'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		select {
		case v := <-verifies:
			t.Fatalf("the verify ended while the lock was held: %s", v)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the instruction was not dispatched while the admin address's requests waited: it holds the relayer's connection")
		}
	}
	if err := lock.Rollback(b.ctx); err != nil {
		t.Fatal(err)
	}
	if v := <-verifies; !strings.Contains(v, `"ok":true`) {
		t.Errorf("verify: %s", v)
	}
	if err := stop(); err != nil {
		t.Fatalf("relay: %v", err)
	}
}
