package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/rails"
)

// replaceFile replaces path's content as a Kubernetes secret volume does:
// a new file renamed over the old one.
func replaceFile(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(tmp, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// eventually polls cond every 50 ms until it holds or a minute passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
	}
}

// TestSecretRotationWithoutRestart rotates a webhook rail's HMAC secret
// end to end, with `outbox sandbox serve` as the rail and `outbox relay`
// dispatching to it, neither restarted: the rail's secret file changes
// first (the rail accepts the previous secret for --previous-secret-for),
// then the relayer's; once the window has passed, only the new secret is
// accepted and instructions still go through, so the relayer signs with
// it. A relayer secret file then rotated into one the start would refuse
// (readable by others) is reported by /readyz and /metrics, and the
// relayer goes on signing with the secret in force. Before, the relayer
// read its secret once, at start, and the sandbox rail could accept one
// secret only.
func TestSecretRotationWithoutRestart(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	dir := t.TempDir()
	const (
		secretA = "secret-A-0123456789abcdef0123456789"
		secretB = "secret-B-0123456789abcdef0123456789"
		window  = 3 * time.Second
	)
	railSecret, relaySecret := filepath.Join(dir, "rail.key"), filepath.Join(dir, "relay.key")
	replaceFile(t, railSecret, secretA+"\n", 0o600)
	replaceFile(t, relaySecret, secretA+"\n", 0o600)
	railAddr := serveSandboxWith(t, "--secret-file", railSecret, "--secret-check-interval", "100ms",
		"--previous-secret-for", window.String())
	config := filepath.Join(dir, "rails.json")
	if err := os.WriteFile(config, fmt.Appendf(nil, `{"transports": {"psp": {"kind": "webhook", "webhook": {"url": "http://%s/", "secret_file": %q}}},
		"rails": [{"type": "sandbox", "profile": "generic", "transport": "psp", "breaker": {"disabled": true}}]}`, railAddr, relaySecret), 0o600); err != nil {
		t.Fatal(err)
	}

	adminAddr, _, stop := b.relayWithAdmin(t, "auditor audra audra-secret-0123456789",
		"--relayer-id", "r-rotate", "--rails-config", config, "--secret-check-interval", "100ms",
		"--backoff-base", "50ms", "--backoff-cap", "200ms")
	defer func() {
		if err := stop(); err != nil {
			t.Errorf("relay: %v", err)
		}
	}()
	get := func(path string) string {
		req, _ := http.NewRequestWithContext(b.ctx, "GET", "http://"+adminAddr+path, nil)
		req.Header.Set("Authorization", "Bearer audra-secret-0123456789")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return ""
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return string(body)
	}

	n := 0
	// dispatchAll enqueues three instructions and waits until every
	// instruction enqueued so far was dispatched on its first attempt
	// (a refused signature is an answer 401, a retry).
	dispatchAll := func(when string) {
		t.Helper()
		var lines []string
		for range 3 {
			n++
			lines = append(lines, inputJSON(fmt.Sprint("p", n), fmt.Sprint("key-", n), "100"))
		}
		requireExit(t, b.cli(t, strings.Join(lines, "\n"), "enqueue"), 0)
		eventually(t, when+": every instruction dispatched", func() bool {
			var dispatched int
			if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox.attempts WHERE state = 'DISPATCHED'`).Scan(&dispatched); err != nil {
				t.Fatal(err)
			}
			return dispatched == n
		})
		var refused int
		if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox.attempts WHERE state = 'RETRYABLE'`).Scan(&refused); err != nil {
			t.Fatal(err)
		}
		if refused != 0 {
			t.Fatalf("%s: %d attempts were refused", when, refused)
		}
	}
	dispatchAll("before the rotation")

	// The rail first: it takes B from now on, and A for the window.
	replaceFile(t, railSecret, secretB+"\n", 0o600)
	signedB, err := rails.NewWebhook(rails.WebhookOptions{URL: "http://" + railAddr, Secret: []byte(secretB)})
	if err != nil {
		t.Fatal(err)
	}
	probe := 0
	eventually(t, "the rail takes the new secret", func() bool {
		probe++
		res, err := signedB.Send(b.ctx, payment.Instruction{InstructionID: "probe", ParticipantID: "probe", IdempotencyKey: fmt.Sprint("probe-", probe),
			RailType: "sandbox", Payment: &payment.Payment{AmountMinor: 1, Currency: "USD", Destination: "acct-1"}})
		return err == nil && res.Code == "HTTP_200"
	})
	rotated := time.Now()
	dispatchAll("the relayer on the previous secret within the rail's window")

	// Then the relayer.
	replaceFile(t, relaySecret, secretB+"\n", 0o600)
	eventually(t, "the relayer reports the rotation", func() bool {
		return strings.Contains(get("/metrics"), `outbox_rail_secret_rotations_total{rail="sandbox"} 1`)
	})
	time.Sleep(time.Until(rotated.Add(window + 200*time.Millisecond)))
	dispatchAll("the rail's window over: only the new secret")

	// A rotation into a file others can read is refused and reported; the
	// relayer signs on with B.
	replaceFile(t, relaySecret, "secret-C-0123456789abcdef0123456789\n", 0o644)
	eventually(t, "the refused secret file reported by /metrics and /readyz", func() bool {
		m, rd := get("/metrics"), get("/readyz")
		return strings.Contains(m, `outbox_rail_secret_refused{rail="sandbox"} 1`) &&
			strings.Contains(rd, `"degraded"`) && strings.Contains(rd, relaySecret) && strings.Contains(rd, "exposed")
	})
	if rd := get("/readyz"); strings.Contains(rd, "secret-C") || strings.Contains(rd, "secret-B") {
		t.Fatalf("readyz shows a secret: %s", rd)
	}
	dispatchAll("a refused rotation: the secret in force signs on")
	replaceFile(t, relaySecret, secretB+"\n", 0o600)
	eventually(t, "the fixed file clears the report", func() bool {
		return strings.Contains(get("/metrics"), `outbox_rail_secret_refused{rail="sandbox"} 0`) && !strings.Contains(get("/readyz"), relaySecret)
	})
}

// TestSandboxSecretReloadsOnSIGHUP: SIGHUP reads a secret file again at
// once, whatever the check interval (here an hour), and does not end the
// process (its default action would).
func TestSandboxSecretReloadsOnSIGHUP(t *testing.T) {
	t.Parallel()
	// The test binary's own handler too: the signal must never take the
	// binary down, whichever in-process servers are running.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	file := filepath.Join(t.TempDir(), "rail.key")
	replaceFile(t, file, "secret-A-0123456789abcdef0123456789", 0o600)
	addr := serveSandboxWith(t, "--secret-file", file, "--secret-check-interval", "1h", "--previous-secret-for", "0s")
	signedBy := func(secret string, key string) string {
		w, err := rails.NewWebhook(rails.WebhookOptions{URL: "http://" + addr, Secret: []byte(secret)})
		if err != nil {
			t.Fatal(err)
		}
		res, err := w.Send(t.Context(), payment.Instruction{InstructionID: key, ParticipantID: "p", IdempotencyKey: key,
			RailType: "sandbox", Payment: &payment.Payment{AmountMinor: 1, Currency: "USD", Destination: "acct-1"}})
		if err != nil {
			t.Fatal(err)
		}
		return res.Code
	}
	if got := signedBy("secret-A-0123456789abcdef0123456789", "k-1"); got != "HTTP_200" {
		t.Fatalf("before: %s", got)
	}
	replaceFile(t, file, "secret-B-0123456789abcdef0123456789", 0o600)
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	n := 0
	eventually(t, "the new secret taken after SIGHUP", func() bool {
		n++
		return signedBy("secret-B-0123456789abcdef0123456789", fmt.Sprint("k-b-", n)) == "HTTP_200"
	})
	if got := signedBy("secret-A-0123456789abcdef0123456789", "k-2"); got != "HTTP_401" {
		t.Fatalf("the previous secret with --previous-secret-for 0s: %s", got)
	}
}
