package rails

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"

	"github.com/ledgerline/outbox/payment"
)

// testWebhookSecret is distinctive so a leak is easy to spot in any output.
var testWebhookSecret = []byte("whsec-TOP-SECRET-9f8e7d6c5b4a39281706")

func testInstruction(t *testing.T, key string) payment.Instruction {
	t.Helper()
	return payment.Instruction{
		OutboxID:       uuid.Must(uuid.NewV4()),
		InstructionID:  "ins-" + key,
		ParticipantID:  "acct-42",
		SequenceID:     7,
		IdempotencyKey: key,
		RailType:       "sandbox",
		TenantID:       "tenant-a",
		CorrelationID:  "corr-1",
		AttemptNo:      1,
		Payment:        &payment.Payment{AmountMinor: 1250, Currency: "USD", Destination: "acct-99"},
		Metadata:       json.RawMessage(`{"note":"rent"}`),
	}
}

// tlsWebhook starts a TLS server and a webhook that trusts its certificate
// (and only it: RootCAs replaces the system roots).
func tlsWebhook(t *testing.T, h http.Handler) (*Webhook, *httptest.Server) {
	t.Helper()
	srv := httptest.NewTLSServer(h)
	t.Cleanup(srv.Close)
	pool := x509.NewCertPool()
	pool.AddCert(srv.Certificate())
	w, err := NewWebhook(WebhookOptions{URL: srv.URL, Secret: testWebhookSecret, RootCAs: pool})
	if err != nil {
		t.Fatalf("NewWebhook: %v", err)
	}
	return w, srv
}

func TestWebhookSendsSignedRequest(t *testing.T) {
	t.Parallel()
	ins := testInstruction(t, "key-signed")
	got := make(chan payment.Instruction, 1)
	w, _ := tlsWebhook(t, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if err := VerifySignature(testWebhookSecret, r.Header, body, time.Now(), 0); err != nil {
			t.Errorf("server: %v", err)
			rw.WriteHeader(http.StatusUnauthorized)
			return
		}
		if r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/json" {
			t.Errorf("server: got %s with Content-Type %q", r.Method, r.Header.Get("Content-Type"))
		}
		var req WebhookRequest
		if err := json.Unmarshal(body, &req); err != nil {
			t.Errorf("server: body: %v", err)
		}
		if k := r.Header.Get(HeaderIdempotencyKey); k != req.IdempotencyKey || k != ins.IdempotencyKey {
			t.Errorf("server: Idempotency-Key header %q, body %q", k, req.IdempotencyKey)
		}
		decoded, err := req.Instruction()
		if err != nil {
			t.Errorf("server: decode: %v", err)
		}
		// The attempt number is a header, not part of the body.
		if decoded.AttemptNo, err = parseAttemptHeader(r.Header); err != nil {
			t.Errorf("server: %v", err)
		}
		got <- decoded
		rw.WriteHeader(http.StatusCreated)
		io.WriteString(rw, `{"reference":"pay_123","message":"accepted"}`)
	}))

	res, err := w.Send(t.Context(), ins)
	d := w.Codes().Decide(res, err)
	if d.Outcome != Dispatched || d.RailCode != "HTTP_201" || d.Reference != "pay_123" || d.Message != "accepted" {
		t.Fatalf("decision = %+v (err %v), want dispatched HTTP_201 pay_123", d, err)
	}
	if decoded := <-got; !reflect.DeepEqual(decoded, ins) {
		t.Fatalf("server decoded\n%+v\nwant\n%+v", decoded, ins)
	}
}

func TestWebhookStatusCodes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		status  int
		outcome Outcome
		code    ErrorCode
	}{
		{200, Dispatched, ""},
		{201, Dispatched, ""},
		{202, Dispatched, ""},
		{204, Dispatched, ""},
		{409, Dispatched, ""}, // the receiver already has this key
		{400, Failed, CodeRailRejected},
		{422, Failed, CodeRailRejected},
		{408, Retryable, CodeRailTimeout},
		{429, Retryable, CodeRateLimited},
		// 500/502/504 may come after the receiver acted; 503 is a refusal.
		{500, Retryable, CodeRailUpstreamError},
		{502, Retryable, CodeRailUpstreamError},
		{503, Retryable, CodeRailUnavailable},
		{504, Retryable, CodeRailUpstreamError},
		{401, Retryable, CodeRailUnavailable},
		{403, Retryable, CodeRailUnavailable},
		// Not in the table: the safe default, never a guess.
		{418, Retryable, CodeUnknownRailCode},
		{404, Retryable, CodeUnknownRailCode},
		// A redirect is not followed (its target answers 200).
		{307, Retryable, CodeUnknownRailCode},
	}
	tested := map[string]bool{}
	for _, tt := range tests {
		tested[webhookCode(tt.status)] = true
	}
	for code := range WebhookCodes {
		if !tested[code] {
			t.Errorf("WebhookCodes has %s but the test does not cover it", code)
		}
	}

	var reached200 atomic.Int64
	_, srv := tlsWebhook(t, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		status, _ := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/"))
		switch status {
		case http.StatusOK:
			reached200.Add(1)
		case http.StatusTemporaryRedirect:
			rw.Header().Set("Location", "/200")
		}
		rw.WriteHeader(status)
		if status != http.StatusNoContent {
			fmt.Fprintf(rw, `{"reference":"ref-%d","message":"status %d"}`, status, status)
		}
	}))
	pool := x509.NewCertPool()
	pool.AddCert(srv.Certificate())

	for _, tt := range tests {
		t.Run(strconv.Itoa(tt.status), func(t *testing.T) {
			t.Parallel()
			w, err := NewWebhook(WebhookOptions{URL: srv.URL + "/" + strconv.Itoa(tt.status), Secret: testWebhookSecret, RootCAs: pool})
			if err != nil {
				t.Fatal(err)
			}
			res, err := w.Send(t.Context(), testInstruction(t, "key-status-"+strconv.Itoa(tt.status)))
			if err != nil {
				t.Fatalf("Send: %v", err)
			}
			d := w.Codes().Decide(res, err)
			if d.Outcome != tt.outcome || d.ErrorCode != tt.code || d.RailCode != webhookCode(tt.status) {
				t.Fatalf("decision = %+v, want %s %s %s", d, webhookCode(tt.status), tt.outcome, tt.code)
			}
			// The reference only counts on an acceptance; the message is
			// kept for every answer that has one.
			wantRef := ""
			if (tt.status/100 == 2 || tt.status == 409) && tt.status != 204 {
				wantRef = fmt.Sprintf("ref-%d", tt.status)
			}
			if res.Reference != wantRef {
				t.Errorf("Reference = %q, want %q", res.Reference, wantRef)
			}
			if tt.status != 204 && res.Message != fmt.Sprintf("status %d", tt.status) {
				t.Errorf("Message = %q", res.Message)
			}
		})
	}
	t.Cleanup(func() {
		// Only the direct /200 request may reach it, not the redirect.
		if n := reached200.Load(); n != 1 {
			t.Errorf("/200 was requested %d times, want 1 (redirects must not be followed)", n)
		}
	})
}

func TestWebhookRetryAfter(t *testing.T) {
	t.Parallel()
	// The webhook's clock is pinned so the HTTP-date form is exact; the
	// server uses the same instant, so the signature is within tolerance.
	now := time.Now().Truncate(time.Second)
	w, _ := tlsWebhook(t, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/delta":
			rw.Header().Set("Retry-After", "7")
		case "/date":
			rw.Header().Set("Retry-After", now.Add(10*time.Minute).UTC().Format(http.TimeFormat))
		case "/far":
			rw.Header().Set("Retry-After", now.Add(48*time.Hour).UTC().Format(http.TimeFormat))
		case "/garbage":
			rw.Header().Set("Retry-After", "soon")
		case "/negative":
			rw.Header().Set("Retry-After", "-3")
		}
		rw.WriteHeader(http.StatusTooManyRequests)
	}))
	base := w.url
	for path, want := range map[string]time.Duration{
		"/delta":    7 * time.Second,
		"/date":     10 * time.Minute,
		"/far":      time.Hour,
		"/garbage":  0,
		"/negative": 0,
		"/none":     0,
	} {
		wp := *w
		wp.url = base + path
		wp.now = func() time.Time { return now }
		res, err := wp.Send(t.Context(), testInstruction(t, "key-ra"+path))
		d := wp.Codes().Decide(res, err)
		if err != nil || d.ErrorCode != CodeRateLimited || d.RetryAfter != want {
			t.Errorf("%s: decision %+v (err %v), want RAIL_RATE_LIMITED after %s", path, d, err, want)
		}
	}
}

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	for v, want := range map[string]time.Duration{
		"":                        0,
		"0":                       0,
		"7":                       7 * time.Second,
		" 12 ":                    12 * time.Second,
		"3600":                    time.Hour,
		"3601":                    time.Hour,
		"99999999999999999999999": time.Hour,
		"-5":                      0,
		"1.5":                     0,
		"later":                   0,
		now.Add(90 * time.Second).Format(http.TimeFormat): 90 * time.Second,
		now.Add(-time.Minute).Format(http.TimeFormat):     0,
		now.Add(3 * time.Hour).Format(http.TimeFormat):    time.Hour,
	} {
		if got := parseRetryAfter(v, now); got != want {
			t.Errorf("parseRetryAfter(%q) = %s, want %s", v, got, want)
		}
	}
}

func TestWebhookTimeout(t *testing.T) {
	t.Parallel()
	signatures := make(chan string, 2)
	w, _ := tlsWebhook(t, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		select {
		case signatures <- r.Header.Get(HeaderSignature):
		default: // never block the handler on the test
		}
		// Answer far later than the client waits; end early once the
		// client has gone so the server closes promptly. net/http only
		// notices a client going away once the body has been read.
		io.Copy(io.Discard, r.Body)
		select {
		case <-r.Context().Done():
			// Abort without an answer: returning would send a 200, which
			// a client whose deadline fired a moment later than the
			// server noticed (both subtests end at 200 ms, on a shared
			// connection) could read as DISPATCHED.
			panic(http.ErrAbortHandler)
		case <-time.After(30 * time.Second):
		}
		rw.WriteHeader(http.StatusOK)
	}))

	t.Run("deadline", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
		defer cancel()
		res, err := w.Send(ctx, testInstruction(t, "key-timeout"))
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Send error = %v, want one wrapping context.DeadlineExceeded", err)
		}
		d := w.Codes().Decide(res, err)
		if d.Outcome != Retryable || d.ErrorCode != CodeRailTimeout || !d.RailCalled {
			t.Fatalf("decision = %+v, want retryable RAIL_TIMEOUT", d)
		}
		assertNoSecret(t, "timeout error", err.Error())
		select {
		case sig := <-signatures:
			if strings.Contains(err.Error(), strings.TrimPrefix(sig, "v1=")) {
				t.Fatalf("error %q contains the request signature", err)
			}
		default: // the request never reached the server: nothing to compare
		}
	})
	t.Run("deadline with cause", func(t *testing.T) {
		t.Parallel()
		// Under WithTimeoutCause net/http reports the cause, not
		// DeadlineExceeded; it is still a timeout.
		ctx, cancel := context.WithTimeoutCause(t.Context(), 200*time.Millisecond, errors.New("dispatch budget spent"))
		defer cancel()
		res, err := w.Send(ctx, testInstruction(t, "key-timeout-cause"))
		if d := w.Codes().Decide(res, err); d.ErrorCode != CodeRailTimeout {
			t.Fatalf("decision = %+v (err %v), want RAIL_TIMEOUT", d, err)
		}
	})
}

func TestWebhookConnectionRefused(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there any more

	w, err := NewWebhook(WebhookOptions{URL: "http://" + addr + "/pay?token=abc", Secret: testWebhookSecret})
	if err != nil {
		t.Fatal(err)
	}
	res, err := w.Send(t.Context(), testInstruction(t, "key-refused"))
	var opErr *net.OpError
	if !errors.Is(err, syscall.ECONNREFUSED) && !(errors.As(err, &opErr) && opErr.Op == "dial") {
		t.Fatalf("Send error = %v, want a refused dial", err)
	}
	d := w.Codes().Decide(res, err)
	if d.Outcome != Retryable || d.ErrorCode != CodeRailUnavailable || d.RailCalled {
		t.Fatalf("decision = %+v, want retryable RAIL_UNAVAILABLE, rail not called", d)
	}
	assertNoSecret(t, "refused error", err.Error())
	if strings.Contains(err.Error(), "token=abc") {
		t.Fatalf("error %q shows the URL query", err)
	}
}

func TestWebhookVerifiesTLS(t *testing.T) {
	t.Parallel()
	var reached atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		reached.Add(1)
	}))
	// The refused handshake is expected; keep its log line out of the output.
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	t.Cleanup(srv.Close)

	t.Run("untrusted certificate", func(t *testing.T) {
		t.Parallel()
		w, err := NewWebhook(WebhookOptions{URL: srv.URL, Secret: testWebhookSecret})
		if err != nil {
			t.Fatal(err)
		}
		res, err := w.Send(t.Context(), testInstruction(t, "key-tls"))
		var verr *tls.CertificateVerificationError
		if !errors.As(err, &verr) {
			t.Fatalf("Send error = %v, want a certificate verification error", err)
		}
		if d := w.Codes().Decide(res, err); d.Outcome != Retryable || d.ErrorCode != CodeRailTransport {
			t.Fatalf("decision = %+v, want retryable RAIL_TRANSPORT_ERROR", d)
		}
		assertNoSecret(t, "TLS error", err.Error())
	})
	t.Run("CAFile", func(t *testing.T) {
		t.Parallel()
		caFile := filepath.Join(t.TempDir(), "ca.pem")
		pemBytes := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
		if err := os.WriteFile(caFile, pemBytes, 0o600); err != nil {
			t.Fatal(err)
		}
		w, err := NewWebhook(WebhookOptions{URL: srv.URL, Secret: testWebhookSecret, CAFile: caFile})
		if err != nil {
			t.Fatal(err)
		}
		res, err := w.Send(t.Context(), testInstruction(t, "key-cafile"))
		if d := w.Codes().Decide(res, err); d.Outcome != Dispatched {
			t.Fatalf("decision = %+v (err %v), want dispatched", d, err)
		}
	})
	t.Run("caller's client", func(t *testing.T) {
		t.Parallel()
		w, err := NewWebhook(WebhookOptions{URL: srv.URL, Secret: testWebhookSecret, Client: srv.Client()})
		if err != nil {
			t.Fatal(err)
		}
		res, err := w.Send(t.Context(), testInstruction(t, "key-client"))
		if d := w.Codes().Decide(res, err); d.Outcome != Dispatched {
			t.Fatalf("decision = %+v (err %v), want dispatched", d, err)
		}
	})
	t.Cleanup(func() {
		if n := reached.Load(); n != 2 {
			t.Errorf("server handled %d requests, want 2 (the untrusted one must not arrive)", n)
		}
	})
}

func TestNewWebhookRejectsUnsafeOptions(t *testing.T) {
	t.Parallel()
	badCA := filepath.Join(t.TempDir(), "bad.pem")
	if err := os.WriteFile(badCA, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	insecure := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	for name, o := range map[string]WebhookOptions{
		"plain http to a remote host": {URL: "http://rail.example.com/pay"},
		"other scheme":                {URL: "ftp://rail.example.com/pay"},
		"no host":                     {URL: "https:///pay"},
		"credentials in the URL":      {URL: "https://user:pw@rail.example.com/pay"},
		"unparsable URL":              {URL: "https://rail.example.com/%zz"},
		"empty secret":                {URL: "https://rail.example.com/pay", Secret: []byte{}},
		"missing CA file":             {URL: "https://rail.example.com/pay", CAFile: filepath.Join(t.TempDir(), "none.pem")},
		"CA file without certs":       {URL: "https://rail.example.com/pay", CAFile: badCA},
		"client skipping TLS checks":  {URL: "https://rail.example.com/pay", Client: insecure},
		"client plus CA options":      {URL: "https://rail.example.com/pay", Client: http.DefaultClient, RootCAs: x509.NewCertPool()},
		"negative connection age":     {URL: "https://rail.example.com/pay", ConnectionMaxAge: -time.Second},
		"client plus connection age":  {URL: "https://rail.example.com/pay", Client: http.DefaultClient, ConnectionMaxAge: time.Minute},
	} {
		if o.Secret == nil {
			o.Secret = testWebhookSecret
		}
		_, err := NewWebhook(o)
		if err == nil {
			t.Errorf("%s: NewWebhook succeeded", name)
			continue
		}
		assertNoSecret(t, name, err.Error())
	}
	for _, u := range []string{"https://rail.example.com/pay", "http://127.0.0.1:8080/", "http://localhost:9/x", "http://[::1]:9/"} {
		if _, err := NewWebhook(WebhookOptions{URL: u, Secret: testWebhookSecret}); err != nil {
			t.Errorf("NewWebhook(%s): %v", u, err)
		}
	}
}

// TestWebhookRefusesClientOnInsecureDefaultTransport: a client without a
// Transport of its own (http.DefaultClient, &http.Client{}) sends through
// http.DefaultTransport, which a program may have set to skip TLS
// verification; such a client is refused like one whose own transport
// skips it. The check needs the process-wide default changed, so it runs
// in a child process of the test binary.
func TestWebhookRefusesClientOnInsecureDefaultTransport(t *testing.T) {
	t.Parallel()
	const childEnv = "RAILS_TEST_INSECURE_DEFAULT_TRANSPORT"
	if os.Getenv(childEnv) == "1" {
		http.DefaultTransport.(*http.Transport).TLSClientConfig = &tls.Config{InsecureSkipVerify: true}
		for name, c := range map[string]*http.Client{"http.DefaultClient": http.DefaultClient, "a client without a transport": {}} {
			if _, err := NewWebhook(WebhookOptions{URL: "https://rail.example.com/pay", Secret: testWebhookSecret, Client: c}); err == nil {
				t.Errorf("%s over an insecure http.DefaultTransport: NewWebhook succeeded", name)
			}
		}
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestWebhookRefusesClientOnInsecureDefaultTransport$", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
}

func TestWebhookSecretNeverPrinted(t *testing.T) {
	t.Parallel()
	opts := WebhookOptions{URL: "https://rail.example.com/pay?token=q", Secret: testWebhookSecret, Codes: WebhookCodes}
	w, err := NewWebhook(opts)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X", "%d"} {
		for _, v := range []any{opts, &opts, w, *w} {
			fmt.Fprintf(&out, verb+"\n", v)
		}
	}
	if !strings.Contains(out.String(), webhookRedacted) {
		t.Errorf("formatted options do not say the secret is redacted:\n%s", out.String())
	}

	var logs bytes.Buffer
	for _, h := range []slog.Handler{slog.NewTextHandler(&logs, nil), slog.NewJSONHandler(&logs, nil)} {
		slog.New(h).Info("webhook configured", "opts", opts, "opts_ptr", &opts, "webhook", w, "webhook_value", *w)
	}
	//lint:ignore SA1026 Client is nil here; this checks that encoding/json never shows the secret
	js, err := json.Marshal(opts)
	if err != nil {
		t.Fatal(err)
	}
	for what, s := range map[string]string{"fmt": out.String(), "slog": logs.String(), "json": string(js)} {
		assertNoSecret(t, what, s)
	}
}

// assertNoSecret fails if s shows testWebhookSecret in any common encoding.
func assertNoSecret(t *testing.T, what, s string) {
	t.Helper()
	for _, form := range []string{
		string(testWebhookSecret),
		hex.EncodeToString(testWebhookSecret),
		strings.ToUpper(hex.EncodeToString(testWebhookSecret)),
		base64.StdEncoding.EncodeToString(testWebhookSecret),
		strings.Trim(fmt.Sprint(testWebhookSecret[:12]), "[]"), // decimal bytes
	} {
		if strings.Contains(s, form) {
			t.Fatalf("%s shows the secret (%q):\n%s", what, form, s)
		}
	}
}

func TestVerifySignature(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_900_000_000, 0)
	body := []byte(`{"idempotency_key":"k1","amount_minor":100}`)
	signed := func(ts time.Time, secret []byte, b []byte) http.Header {
		h := http.Header{}
		h.Set(HeaderIdempotencyKey, "k1") // the body's key
		s := strconv.FormatInt(ts.Unix(), 10)
		h.Set(HeaderTimestamp, s)
		h.Set(HeaderSignature, Sign(secret, s, b))
		return h
	}
	without := func(h http.Header, key string) http.Header { h.Del(key); return h }
	with := func(h http.Header, key, v string) http.Header { h.Set(key, v); return h }
	plus := func(h http.Header, key, v string) http.Header { h.Add(key, v); return h }
	good := signed(now, testWebhookSecret, body)
	noKeyBody := []byte(`{"amount_minor":100}`)
	notJSON := []byte(`k1`)

	tests := []struct {
		name      string
		secret    []byte
		header    http.Header
		body      []byte
		tolerance time.Duration
		ok        bool
		binding   bool // fails only the Idempotency-Key binding (errKeyBinding)
	}{
		{name: "good", header: good, ok: true},
		{name: "clock skew within tolerance", header: signed(now.Add(-4*time.Minute), testWebhookSecret, body), ok: true},
		{name: "rotation: any listed signature", header: with(signed(now, testWebhookSecret, body), HeaderSignature,
			Sign([]byte("old secret"), strconv.FormatInt(now.Unix(), 10), body)+", "+good.Get(HeaderSignature)), ok: true},
		{name: "custom tolerance", header: signed(now.Add(-20*time.Minute), testWebhookSecret, body), tolerance: time.Hour, ok: true},
		{name: "bad secret", header: signed(now, []byte("another secret"), body)},
		{name: "tampered body", header: good, body: []byte(`{"idempotency_key":"k1","amount_minor":900}`)},
		{name: "stale timestamp", header: signed(now.Add(-6*time.Minute), testWebhookSecret, body)},
		{name: "future timestamp", header: signed(now.Add(6*time.Minute), testWebhookSecret, body)},
		{name: "timestamp not the signed one", header: with(signed(now, testWebhookSecret, body), HeaderTimestamp, strconv.FormatInt(now.Unix()+1, 10))},
		{name: "malformed timestamp", header: with(signed(now, testWebhookSecret, body), HeaderTimestamp, "+"+strconv.FormatInt(now.Unix(), 10))},
		{name: "missing timestamp", header: without(signed(now, testWebhookSecret, body), HeaderTimestamp)},
		{name: "missing signature", header: without(signed(now, testWebhookSecret, body), HeaderSignature)},
		{name: "unknown version", header: with(signed(now, testWebhookSecret, body), HeaderSignature, strings.Replace(good.Get(HeaderSignature), "v1=", "v0=", 1))},
		{name: "not hex", header: with(signed(now, testWebhookSecret, body), HeaderSignature, "v1=zz")},
		{name: "empty secret", secret: []byte{}, header: good},
		// The signature does not cover the headers: a captured request
		// replayed under another Idempotency-Key must not verify.
		{name: "swapped Idempotency-Key", header: with(signed(now, testWebhookSecret, body), HeaderIdempotencyKey, "k2"), binding: true},
		{name: "Idempotency-Key differs in case", header: with(signed(now, testWebhookSecret, body), HeaderIdempotencyKey, "K1"), binding: true},
		{name: "missing Idempotency-Key", header: without(signed(now, testWebhookSecret, body), HeaderIdempotencyKey), binding: true},
		{name: "second Idempotency-Key", header: plus(signed(now, testWebhookSecret, body), HeaderIdempotencyKey, "k2"), binding: true},
		{name: "body without a key", header: signed(now, testWebhookSecret, noKeyBody), body: noKeyBody, binding: true},
		{name: "body not JSON", header: signed(now, testWebhookSecret, notJSON), body: notJSON, binding: true},
		// A bad signature is reported as such, not as a binding problem.
		{name: "bad secret and swapped key", header: with(signed(now, []byte("another secret"), body), HeaderIdempotencyKey, "k2")},
	}
	for _, tt := range tests {
		secret, b := tt.secret, tt.body
		if secret == nil {
			secret = testWebhookSecret
		}
		if b == nil {
			b = body
		}
		err := VerifySignature(secret, tt.header, b, now, tt.tolerance)
		switch {
		case tt.ok && err != nil:
			t.Errorf("%s: %v", tt.name, err)
		case !tt.ok && !errors.Is(err, ErrBadSignature):
			t.Errorf("%s: error = %v, want ErrBadSignature", tt.name, err)
		case !tt.ok && errors.Is(err, errKeyBinding) != tt.binding:
			t.Errorf("%s: error = %v, want errKeyBinding %t", tt.name, err, tt.binding)
		case err != nil:
			assertNoSecret(t, tt.name, err.Error())
			if strings.Contains(err.Error(), strings.TrimPrefix(good.Get(HeaderSignature), "v1=")) {
				t.Errorf("%s: error shows the signature", tt.name)
			}
		}
	}

	// The header format is part of the protocol: lowercase hex after "v1=".
	if sig := good.Get(HeaderSignature); !strings.HasPrefix(sig, "v1=") || len(sig) != 3+64 || strings.ToLower(sig) != sig {
		t.Errorf("signature header %q is not v1=<64 lowercase hex>", sig)
	}
}

func TestWebhookRequestRoundTrip(t *testing.T) {
	t.Parallel()
	money := testInstruction(t, "key-rt")
	zero := testInstruction(t, "key-zero")
	zero.Payment = &payment.Payment{} // present but zero: must survive as present
	event := payment.Instruction{InstructionID: "evt-1", ParticipantID: "p", IdempotencyKey: "key-evt", RailType: "event",
		Metadata: json.RawMessage(`{"kind":"usage","units":3}`)}
	bare := payment.Instruction{InstructionID: "i", ParticipantID: "p", IdempotencyKey: "key-bare", RailType: "event"}

	for _, ins := range []payment.Instruction{money, zero, event, bare} {
		ins.AttemptNo = 0 // not carried by the body (see TestWebhookRetryBodyIsIdentical)
		b, err := json.Marshal(NewWebhookRequest(ins))
		if err != nil {
			t.Fatal(err)
		}
		var req WebhookRequest
		if err := json.Unmarshal(b, &req); err != nil {
			t.Fatal(err)
		}
		got, err := req.Instruction()
		if err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		if !reflect.DeepEqual(got, ins) {
			t.Errorf("round trip of %s\n got %+v\nwant %+v", b, got, ins)
		}
	}

	// Event instructions carry no money fields and no empty optional fields.
	b, _ := json.Marshal(NewWebhookRequest(event))
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(b, &fields); err != nil {
		t.Fatal(err)
	}
	for _, absent := range []string{"amount_minor", "currency", "destination", "outbox_id", "tenant_id", "correlation_id", "sequence_id", "attempt_no"} {
		if _, ok := fields[absent]; ok {
			t.Errorf("event request has %q: %s", absent, b)
		}
	}
	// No body carries the attempt number, whatever the instruction's.
	b, _ = json.Marshal(NewWebhookRequest(money))
	if bytes.Contains(b, []byte("attempt")) {
		t.Errorf("money request carries the attempt number: %s", b)
	}
	if string(fields["metadata"]) != `{"kind":"usage","units":3}` {
		t.Errorf("metadata = %s, want the raw object", fields["metadata"])
	}

	for name, req := range map[string]WebhookRequest{
		"no key":        {InstructionID: "i"},
		"bad outbox id": {IdempotencyKey: "k", OutboxID: "not-a-uuid"},
	} {
		if _, err := req.Instruction(); !errors.Is(err, payment.ErrValidation) {
			t.Errorf("%s: error = %v, want a validation error", name, err)
		}
	}
}

func TestWebhookRefusesUnsendableInstructions(t *testing.T) {
	t.Parallel()
	var reached atomic.Int64
	w, _ := tlsWebhook(t, http.HandlerFunc(func(http.ResponseWriter, *http.Request) { reached.Add(1) }))
	noKey := testInstruction(t, "")
	badMeta := testInstruction(t, "key-bad-meta")
	badMeta.Metadata = json.RawMessage(`{"unterminated"`)
	// net/http trims a header value's leading and trailing spaces, so
	// "key-1 " and " key-1" would both reach the receiver as "key-1": a
	// receiver deduplicating on the header answers the second of two
	// payments as a replay of the first (recorded dispatched, never paid),
	// and VerifySignature refuses each (header and body keys differ).
	trailing, leading := testInstruction(t, "key-1 "), testInstruction(t, " key-1")
	for name, ins := range map[string]payment.Instruction{"no key": noKey, "invalid metadata": badMeta,
		"trailing space in key": trailing, "leading space in key": leading} {
		res, err := w.Send(t.Context(), ins)
		if d := w.Codes().Decide(res, err); d.Outcome != Failed || d.ErrorCode != CodeValidationFailed || d.RailCalled {
			t.Errorf("%s: decision = %+v, want terminal VALIDATION_FAILED without calling the rail", name, d)
		}
	}
	if n := reached.Load(); n != 0 {
		t.Errorf("the rail was called %d times", n)
	}
}

func TestLoadSecret(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	lf := write("lf", string(testWebhookSecret)+"\n")
	crlf := write("crlf", string(testWebhookSecret)+"\r\n")
	empty := write("empty", "\n")

	// A variable name no other test uses: t.Setenv cannot be combined with
	// t.Parallel, and a unique name cannot disturb anyone.
	envVar := "RAILS_TEST_WEBHOOK_SECRET_" + strconv.Itoa(os.Getpid())
	emptyVar := envVar + "_EMPTY"
	os.Setenv(envVar, string(testWebhookSecret))
	os.Setenv(emptyVar, "")
	t.Cleanup(func() { os.Unsetenv(envVar); os.Unsetenv(emptyVar) })

	for _, tt := range []struct{ file, env string }{{lf, ""}, {crlf, ""}, {"", envVar}, {lf, emptyVar}} {
		got, err := LoadSecret(tt.file, tt.env)
		if err != nil || !bytes.Equal(got, testWebhookSecret) {
			t.Errorf("LoadSecret(%q, %q) = %q, %v", tt.file, tt.env, got, err)
		}
	}
	for _, tt := range []struct{ file, env string }{{"", ""}, {empty, ""}, {filepath.Join(dir, "missing"), envVar}, {"", emptyVar}, {"", envVar + "_UNSET"}} {
		if _, err := LoadSecret(tt.file, tt.env); err == nil {
			t.Errorf("LoadSecret(%q, %q) succeeded", tt.file, tt.env)
		} else {
			assertNoSecret(t, "LoadSecret error", err.Error())
		}
	}
}

// TestSecretFileModes: a secret file other users can read, or that its
// group or others can write, is refused with ErrSecretExposed (without the
// secret in the message) unless explicitly allowed; owner-only and
// group-readable files load.
func TestSecretFileModes(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, tt := range []struct {
		mode    os.FileMode
		exposed bool
	}{
		{0o600, false}, {0o400, false}, {0o640, false},
		{0o644, true}, {0o604, true}, {0o660, true}, {0o602, true}, {0o666, true},
	} {
		p := filepath.Join(dir, fmt.Sprintf("secret-%04o", tt.mode))
		if err := os.WriteFile(p, testWebhookSecret, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, tt.mode); err != nil { // WriteFile's mode is subject to the umask
			t.Fatal(err)
		}
		got, err := LoadSecret(p, "")
		switch {
		case tt.exposed && !errors.Is(err, ErrSecretExposed):
			t.Errorf("mode %04o: LoadSecret = %q, %v; want ErrSecretExposed", tt.mode, got, err)
		case tt.exposed:
			assertNoSecret(t, "exposed secret error", err.Error())
		case err != nil || !bytes.Equal(got, testWebhookSecret):
			t.Errorf("mode %04o: LoadSecret = %q, %v", tt.mode, got, err)
		}
		allowed, err := SecretSource{File: p, AllowWorldReadable: true}.Load()
		if err != nil || !bytes.Equal(allowed, testWebhookSecret) {
			t.Errorf("mode %04o allowed: Load = %q, %v", tt.mode, allowed, err)
		}
	}
}

// TestWebhookRetryBodyIsIdentical: every attempt of one instruction sends
// the same bytes (receivers fingerprint the payload per idempotency key
// and answer a changed payload 422, which would dead-letter a paid
// instruction); only the X-Outbox-Attempt header says which attempt it is.
func TestWebhookRetryBodyIsIdentical(t *testing.T) {
	t.Parallel()
	type seen struct {
		body                 []byte
		signature, timestamp string
		attempt              string
	}
	got := make(chan seen, 3)
	w, _ := tlsWebhook(t, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got <- seen{body, r.Header.Get(HeaderSignature), r.Header.Get(HeaderTimestamp), r.Header.Get(HeaderAttempt)}
		rw.WriteHeader(http.StatusOK)
	}))
	now := time.Unix(time.Now().Unix(), 0)
	w.now = func() time.Time { return now } // same timestamp for every attempt

	ins := testInstruction(t, "key-identical")
	var sent []seen
	for _, attempt := range []int{1, 2, 7} {
		ins.AttemptNo = attempt
		if _, err := w.Send(t.Context(), ins); err != nil {
			t.Fatalf("attempt %d: %v", attempt, err)
		}
		s := <-got
		if s.attempt != strconv.Itoa(attempt) {
			t.Errorf("attempt %d: %s header = %q", attempt, HeaderAttempt, s.attempt)
		}
		sent = append(sent, s)
	}
	for i, s := range sent[1:] {
		if !bytes.Equal(s.body, sent[0].body) {
			t.Errorf("attempt %d body differs from the first:\n%s\n%s", i+2, s.body, sent[0].body)
		}
		if s.timestamp != sent[0].timestamp || s.signature != sent[0].signature {
			t.Errorf("attempt %d: signature %s at %s, first %s at %s", i+2, s.signature, s.timestamp, sent[0].signature, sent[0].timestamp)
		}
	}
}

// TestWebhookReplayAfterWriteIsNotUnavailable: net/http replays a request
// with an Idempotency-Key on a new connection when a reused one breaks after
// the request was written. When that re-dial is refused, the error looks
// like "connection refused", but the rail did receive the request once: it
// must not classify as RAIL_UNAVAILABLE with the rail not called.
func TestWebhookReplayAfterWriteIsNotUnavailable(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	received := make(chan string, 2) // idempotency keys, as the server read them
	served := make(chan error, 1)
	go func() {
		// One connection, served by hand so each step is deterministic:
		// answer the first request (the client pools the connection), read
		// the second, then stop listening and drop the connection without
		// answering. The client's automatic replay then finds the port
		// closed: connection refused.
		served <- func() error {
			conn, err := ln.Accept()
			if err != nil {
				return err
			}
			defer conn.Close()
			br := bufio.NewReader(conn)
			for i := range 2 {
				req, err := http.ReadRequest(br)
				if err != nil {
					return err
				}
				io.Copy(io.Discard, req.Body)
				received <- req.Header.Get(HeaderIdempotencyKey)
				if i == 0 {
					if _, err := io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"); err != nil {
						return err
					}
				}
			}
			return ln.Close() // before conn.Close (deferred): the re-dial is refused
		}()
	}()

	w, err := NewWebhook(WebhookOptions{URL: "http://" + ln.Addr().String() + "/pay", Secret: testWebhookSecret})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.client.CloseIdleConnections)
	if res, err := w.Send(t.Context(), testInstruction(t, "key-warm-up")); err != nil || res.Code != "HTTP_200" {
		t.Fatalf("first send: %+v, %v", res, err)
	}
	ins := testInstruction(t, "key-written-then-refused")
	res, err := w.Send(t.Context(), ins)
	if err := <-served; err != nil {
		t.Fatalf("server: %v", err)
	}
	if <-received; <-received != ins.IdempotencyKey {
		t.Fatal("the server did not read the second request")
	}
	// The scenario this test is about: the error says "refused".
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("Send error = %v, want a refused re-dial", err)
	}
	d := w.Codes().Decide(res, err)
	if d.Outcome != Retryable || d.ErrorCode != CodeRailTransport || !d.RailCalled {
		t.Fatalf("decision = %+v, want retryable RAIL_TRANSPORT_ERROR with the rail called", d)
	}
}

// TestWebhookRedactsURLPath: hook URLs often carry a token in the path
// (Slack style). Errors go into attempt rows and logs, so they show only
// scheme://host:port, as does String.
func TestWebhookRedactsURLPath(t *testing.T) {
	t.Parallel()
	const token = "T0SECRET/B0SECRET/xoxTOKEN1234567890"
	hook := func(t *testing.T, base string) *Webhook {
		t.Helper()
		w, err := NewWebhook(WebhookOptions{URL: base + "/services/" + token + "?q=QUERYTOKEN", Secret: testWebhookSecret})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(w.client.CloseIdleConnections)
		return w
	}
	check := func(t *testing.T, what, s string) {
		t.Helper()
		for _, part := range []string{"T0SECRET", "xoxTOKEN", "services", "QUERYTOKEN"} {
			if strings.Contains(s, part) {
				t.Errorf("%s shows the URL path or query (%q): %s", what, part, s)
			}
		}
	}
	send := func(t *testing.T, w *Webhook, ctx context.Context) {
		t.Helper()
		res, err := w.Send(ctx, testInstruction(t, "key-redact"))
		if err != nil {
			check(t, "Send error", err.Error())
		}
		d := w.Codes().Decide(res, err)
		check(t, "decision message", d.Message)
		if d.Outcome == Dispatched {
			t.Errorf("decision = %+v, want a failure", d)
		}
	}

	t.Run("connection refused", func(t *testing.T) {
		t.Parallel()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		w := hook(t, "http://"+addr)
		send(t, w, t.Context())
		check(t, "String", w.String())
		// However it is printed: %#v does not call String, and a copied
		// value has no String of its own unless the value type has one.
		for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x"} {
			check(t, "the webhook printed with "+verb, fmt.Sprintf(verb, w))
			check(t, "a copy printed with "+verb, fmt.Sprintf(verb, *w))
		}
		check(t, "options", fmt.Sprint(WebhookOptions{URL: "http://" + addr + "/services/" + token}))
		check(t, "options without a scheme", fmt.Sprint(WebhookOptions{URL: "hooks.example/services/" + token}))
		if !strings.Contains(w.String(), "http://"+addr) {
			t.Errorf("String %s does not say which endpoint", w)
		}
	})
	t.Run("timeout", func(t *testing.T) {
		t.Parallel()
		srv := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			<-r.Context().Done()
		}))
		t.Cleanup(srv.Close)
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		defer cancel()
		send(t, hook(t, srv.URL), ctx)
	})
	t.Run("error status", func(t *testing.T) {
		t.Parallel()
		srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
			rw.WriteHeader(http.StatusInternalServerError)
		}))
		t.Cleanup(srv.Close)
		send(t, hook(t, srv.URL), t.Context())
	})
	t.Run("malformed status line", func(t *testing.T) {
		t.Parallel()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		done := make(chan struct{})
		go func() {
			defer close(done)
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			defer conn.Close()
			if req, err := http.ReadRequest(bufio.NewReader(conn)); err == nil {
				io.Copy(io.Discard, req.Body)
				io.WriteString(conn, "HTTP/1.1 2x0 OK\r\n\r\n")
			}
		}()
		send(t, hook(t, "http://"+ln.Addr().String()), t.Context())
		<-done
	})
}

// TestWebhookAnswerDecodedStrictly: a rail's answer that names
// "reference" twice, or only in another letter case, gives no reference
// (a 200 is still the answer); unknown members are ignored.
func TestWebhookAnswerDecodedStrictly(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		body, ref, msg string
	}{
		{`{"reference":"r-1","extra":true}`, "r-1", ""},
		{`{"reference":"r-1","reference":"r-2"}`, "", "appears more than once"},
		{`{"REFERENCE":"r-1"}`, "", ""},
		// Only the first 64 KiB of an answer are read: a reference past
		// them is not (and a rail cannot make the relayer buffer more).
		{`{"message":"` + strings.Repeat("x", webhookMaxResponseBytes) + `","reference":"r-far"}`, "", "answer body refused"},
		{`{"reference":"r-near","message":"` + strings.Repeat("x", webhookMaxResponseBytes) + `"}`, "", "answer body refused"},
	} {
		w, _ := tlsWebhook(t, http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
			rw.WriteHeader(http.StatusOK)
			io.WriteString(rw, tt.body)
		}))
		res, err := w.Send(t.Context(), testInstruction(t, "key-answer"))
		d := w.Codes().Decide(res, err)
		if d.Outcome != Dispatched || d.Reference != tt.ref || !strings.Contains(d.Message, tt.msg) {
			t.Errorf("answer %s: decision %+v, want dispatched with reference %q and a message containing %q", tt.body, d, tt.ref, tt.msg)
		}
	}
}
