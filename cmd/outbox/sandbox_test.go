package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/rails"
)

// serveSandbox runs `outbox sandbox serve` in process with args and returns
// the address it listens on; the server stops when the test ends.
func serveSandbox(t *testing.T, args ...string) string {
	t.Helper()
	return serveSandboxWith(t, append([]string{"--secret-env", "SANDBOX_SECRET"}, args...)...)
}

// serveSandboxWith is serveSandbox with args alone (no --secret-env).
func serveSandboxWith(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out, w := io.Pipe()
	env := &environment{stdin: strings.NewReader(""), stdout: w, stderr: io.Discard,
		getenv: func(k string) string { return map[string]string{"SANDBOX_SECRET": "s3cret-s3cret"}[k] }}
	done := make(chan error, 1)
	go func() {
		err := run(ctx, env, append([]string{"sandbox", "serve"}, args...))
		w.CloseWithError(errors.New("server exited"))
		done <- err
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("sandbox serve: %v", err)
		}
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("reading the address: %v", err)
	}
	go io.Copy(io.Discard, out) // nothing more is printed, but never block the server
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "sandbox rail listening on http://")
	if !ok {
		t.Fatalf("unexpected first line %q", line)
	}
	return addr
}

// closedByServer reports whether the server closes conn (EOF or reset)
// before the generous deadline; it never asserts how fast.
func closedByServer(t *testing.T, conn net.Conn) bool {
	t.Helper()
	conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	_, err := io.Copy(io.Discard, conn)
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout())
}

// TestSandboxServerTimeouts: a client that starts a request and never
// finishes its body, or keeps an idle keep-alive connection, is
// disconnected.
func TestSandboxServerTimeouts(t *testing.T) {
	t.Parallel()
	addr := serveSandbox(t, "--read-timeout", "200ms", "--idle-timeout", "200ms")

	slow, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	// The body never arrives in full.
	if _, err := io.WriteString(slow, "POST / HTTP/1.1\r\nHost: sandbox\r\nContent-Length: 100\r\n\r\n{\"idem"); err != nil {
		t.Fatal(err)
	}
	if !closedByServer(t, slow) {
		t.Error("a request whose body never ends kept its connection")
	}

	idle, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	if _, err := io.WriteString(idle, "GET /healthz HTTP/1.1\r\nHost: sandbox\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	status, err := bufio.NewReader(idle).ReadString('\n')
	if err != nil || !strings.Contains(status, "200") {
		t.Fatalf("healthz: %q, %v", status, err)
	}
	if !closedByServer(t, idle) {
		t.Error("an idle keep-alive connection was kept")
	}
}

// TestSandboxServerRefusesExposedSecretFile: a secret file other users can
// read is a usage error unless --allow-world-readable-secret is given.
func TestSandboxServerRefusesExposedSecretFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(path, []byte("s3cret-s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	r := invokeCLI(t, nil, "", "sandbox", "serve", "--secret-file", path)
	requireExit(t, r, 2)
	if !strings.Contains(r.stderr, "exposed") || strings.Contains(r.stderr, "s3cret") {
		t.Fatalf("want an 'exposed' usage error without the secret, got %s", r)
	}
}

// TestSandboxServerRefusesWhatTheRailsFileRefuses guards `outbox sandbox
// serve` against values the same sandbox in a rails file is refused for
// (rates outside [0, 1], --slow-rate without --slow-latency, --latency-max
// below --latency-min, a negative latency) and against both secret
// sources at once, where the file silently won: each is a usage error
// naming the flags, before anything listens.
func TestSandboxServerRefusesWhatTheRailsFileRefuses(t *testing.T) {
	t.Parallel()
	secretFile := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secretFile, []byte("fedcba9876543210fedcba9876543210"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--retryable-rate", "1.5"}, "--retryable-rate 1.5: a rate must be between 0 and 1"},
		{[]string{"--terminal-rate", "-0.2"}, "--terminal-rate -0.2: a rate must be between 0 and 1"},
		{[]string{"--slow-rate", "0.5"}, "--slow-rate needs --slow-latency"},
		{[]string{"--latency-min", "50ms", "--latency-max", "10ms"}, "--latency-max 10ms is below --latency-min 50ms"},
		{[]string{"--latency-min", "-1ms"}, "--latency-min -1ms: must not be negative"},
		{[]string{"--secret-file", secretFile}, "takes --secret-file or --secret-env, not both"},
		{[]string{"--max-payload-bytes", "-1"}, "--max-payload-bytes must not be negative"},
		// Past any producer's limit (pending.MaxBatchPayloadBytes); far
		// past it the body cap, six times it, wrapped negative and every
		// request was answered 413.
		{[]string{"--max-payload-bytes", "67108865"}, "--max-payload-bytes 67108865 is past"},
		{[]string{"--max-payload-bytes", "9223372036854775807"}, "--max-payload-bytes 9223372036854775807 is past"},
		{[]string{"--previous-secret-for", "1m"}, "--previous-secret-for only apply to --secret-file"},
		{[]string{"--secret-check-interval", "0s"}, "--secret-check-interval must be positive"},
	} {
		// A regression would serve until the context ends, and exit 0.
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		var stdout, stderr strings.Builder
		vars := map[string]string{"SANDBOX_SECRET": "0123456789abcdef0123456789abcdef"}
		env := &environment{stdin: strings.NewReader(""), stdout: &stdout, stderr: &stderr, getenv: func(k string) string { return vars[k] }}
		err := run(ctx, env, append([]string{"sandbox", "serve", "--secret-env", "SANDBOX_SECRET"}, tt.args...))
		cancel()
		if code := exitCode(env, err); code != 2 || !strings.Contains(stderr.String(), tt.want) || stdout.Len() > 0 {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want a usage error saying %q", tt.args, code, stdout.String(), stderr.String(), tt.want)
		}
	}
}

// TestSandboxServerTakesConfiguredPayloads: `outbox sandbox serve` takes
// the payloads of producers whose --max-payload-bytes is raised, when
// given the same flag. It capped bodies at 80 KiB whatever the producers'
// limit, so an instruction the engine accepted was answered 413 (an
// unknown code, retried until dead-lettered). Without the flag the cap
// is that of the default limit.
func TestSandboxServerTakesConfiguredPayloads(t *testing.T) {
	t.Parallel()
	const limit = 1 << 20
	// A payload of about 900 KiB, within the raised limit.
	ins := payment.Instruction{InstructionID: "ins-1", ParticipantID: "p1", IdempotencyKey: "key-1", RailType: "sandbox",
		Payment:  &payment.Payment{AmountMinor: 100, Currency: "USD", Destination: "acct-1"},
		Metadata: json.RawMessage(`{"note": "` + strings.Repeat("a", 900<<10) + `"}`)}
	send := func(addr string) string {
		w, err := rails.NewWebhook(rails.WebhookOptions{URL: "http://" + addr, Secret: []byte("s3cret-s3cret")})
		if err != nil {
			t.Fatal(err)
		}
		res, err := w.Send(t.Context(), ins)
		return w.Codes().Decide(res, err).RailCode
	}
	if code := send(serveSandbox(t, "--max-payload-bytes", strconv.Itoa(limit))); code != "HTTP_200" {
		t.Errorf("with --max-payload-bytes %d: %s, want HTTP_200", limit, code)
	}
	if code := send(serveSandbox(t)); code != "HTTP_413" {
		t.Errorf("with the default limit: %s, want HTTP_413", code)
	}
}
