package rails

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"

	"github.com/ledgerline/outbox/payment"
)

// sandboxServer serves a fresh sandbox over plain loopback HTTP (allowed
// for loopback hosts) and returns a webhook that talks to it.
func sandboxServer(t *testing.T, opts SandboxOptions) (*Sandbox, *httptest.Server, *Webhook) {
	t.Helper()
	s := NewSandbox(opts)
	srv := httptest.NewServer(NewSandboxHandler(s, testWebhookSecret))
	t.Cleanup(srv.Close)
	w, err := NewWebhook(WebhookOptions{URL: srv.URL, Secret: testWebhookSecret})
	if err != nil {
		t.Fatal(err)
	}
	return s, srv, w
}

func TestSandboxHandlerPaysOnce(t *testing.T) {
	t.Parallel()
	s, _, w := sandboxServer(t, SandboxOptions{})
	ins := testInstruction(t, "key-once")

	res, err := w.Send(t.Context(), ins)
	first := w.Codes().Decide(res, err)
	if first.Outcome != Dispatched || first.RailCode != "HTTP_200" || first.Reference == "" {
		t.Fatalf("first send: %+v (err %v), want dispatched HTTP_200 with a reference", first, err)
	}

	ins.AttemptNo = 2 // a retry carries the same key
	res, err = w.Send(t.Context(), ins)
	replay := w.Codes().Decide(res, err)
	if replay.Outcome != Dispatched || replay.RailCode != "HTTP_409" || replay.Reference != first.Reference {
		t.Fatalf("replay: %+v (err %v), want dispatched HTTP_409 with reference %q", replay, err, first.Reference)
	}
	st := s.Stats()
	if st.Payments != 1 || st.Replays != 1 || st.EffectiveDuplicates != 0 {
		t.Fatalf("stats = %+v, want 1 payment, 1 replay, 0 effective duplicates", st)
	}
}

func TestSandboxHandlerEventInstruction(t *testing.T) {
	t.Parallel()
	s, _, w := sandboxServer(t, SandboxOptions{})
	ins := payment.Instruction{InstructionID: "evt", ParticipantID: "p", IdempotencyKey: "key-event", RailType: "event",
		Metadata: json.RawMessage(`{"kind":"usage"}`)}
	res, err := w.Send(t.Context(), ins)
	if d := w.Codes().Decide(res, err); d.Outcome != Dispatched {
		t.Fatalf("decision = %+v (err %v), want dispatched", d, err)
	}
	if st := s.Stats(); st.Payments != 1 || st.EffectiveDuplicates != 0 {
		t.Fatalf("stats = %+v", st)
	}
}

func TestSandboxHandlerRejectsBadSignature(t *testing.T) {
	t.Parallel()
	s, srv, _ := sandboxServer(t, SandboxOptions{})
	w, err := NewWebhook(WebhookOptions{URL: srv.URL, Secret: []byte("not the sandbox's secret")})
	if err != nil {
		t.Fatal(err)
	}
	ins := testInstruction(t, "key-forged")
	res, err := w.Send(t.Context(), ins)
	d := w.Codes().Decide(res, err)
	if d.RailCode != "HTTP_401" || d.Outcome != Retryable || d.ErrorCode != CodeRailUnavailable {
		t.Fatalf("decision = %+v (err %v), want HTTP_401 retryable RAIL_UNAVAILABLE", d, err)
	}
	if st := s.Stats(); st.Calls != 0 || st.Payments != 0 || s.Paid(ins.TenantID, ins.IdempotencyKey) {
		t.Fatalf("stats = %+v: a forged request reached the ledger", st)
	}
}

func TestSandboxHandlerBadRequests(t *testing.T) {
	t.Parallel()
	s, srv, _ := sandboxServer(t, SandboxOptions{})
	body, err := json.Marshal(NewWebhookRequest(testInstruction(t, "key-bad")))
	if err != nil {
		t.Fatal(err)
	}
	post := func(path string, body []byte, key string, sign func(ts string, body []byte) string) int {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+path, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		ts := strconv.FormatInt(time.Now().Unix(), 10)
		req.Header.Set(HeaderIdempotencyKey, key)
		req.Header.Set(HeaderTimestamp, ts)
		if sign != nil {
			req.Header.Set(HeaderSignature, sign(ts, body))
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	good := func(ts string, b []byte) string { return Sign(testWebhookSecret, ts, b) }

	tests := []struct {
		name   string
		path   string
		body   []byte
		key    string
		sign   func(string, []byte) string
		status int
	}{
		{"unsigned", "/", body, "key-bad", nil, http.StatusUnauthorized},
		{"wrong secret", "/", body, "key-bad", func(ts string, b []byte) string { return Sign([]byte("x"), ts, b) }, http.StatusUnauthorized},
		{"signature of another body", "/", body, "key-bad", func(ts string, _ []byte) string { return Sign(testWebhookSecret, ts, []byte("{}")) }, http.StatusUnauthorized},
		{"malformed JSON", "/", []byte(`{"idempotency_key":`), "key-bad", good, http.StatusBadRequest},
		{"header and body keys differ", "/", body, "key-other", good, http.StatusBadRequest},
		{"no key at all", "/", []byte(`{"instruction_id":"i"}`), "", good, http.StatusBadRequest},
		{"POST to /stats", "/stats", body, "key-bad", good, http.StatusMethodNotAllowed},
	}
	for _, tt := range tests {
		if got := post(tt.path, tt.body, tt.key, tt.sign); got != tt.status {
			t.Errorf("%s: status %d, want %d", tt.name, got, tt.status)
		}
	}

	// A correctly signed but old request is a replay attempt.
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL, bytes.NewReader(body))
	old := strconv.FormatInt(time.Now().Add(-time.Hour).Unix(), 10)
	req.Header.Set(HeaderIdempotencyKey, "key-bad")
	req.Header.Set(HeaderTimestamp, old)
	req.Header.Set(HeaderSignature, Sign(testWebhookSecret, old, body))
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("stale request: status %d, want 401", resp.StatusCode)
	}

	if st := s.Stats(); st.Calls != 0 || st.Payments != 0 {
		t.Fatalf("stats = %+v: a bad request reached the ledger", st)
	}
}

func TestSandboxHandlerTimeoutThenRetry(t *testing.T) {
	t.Parallel()
	// Every first payment is made and then never answered: the worst case
	// for a relayer, which cannot know the rail acted.
	s, _, w := sandboxServer(t, SandboxOptions{TimeoutRate: 1})
	ins := testInstruction(t, "key-paid-silently")

	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	res, err := w.Send(ctx, ins)
	if d := w.Codes().Decide(res, err); d.Outcome != Retryable || d.ErrorCode != CodeRailTimeout {
		t.Fatalf("first send: %+v (err %v), want retryable RAIL_TIMEOUT", d, err)
	}
	// The sandbox did pay, even though the client never heard of it.
	if !s.Paid(ins.TenantID, ins.IdempotencyKey) {
		t.Fatal("the sandbox did not pay before withholding its answer")
	}
	if st := s.Stats(); st.Payments != 1 || st.Timeouts != 1 {
		t.Fatalf("stats = %+v, want the payment made and its answer withheld", st)
	}

	ins.AttemptNo = 2
	res, err = w.Send(t.Context(), ins)
	d := w.Codes().Decide(res, err)
	if d.Outcome != Dispatched || d.RailCode != "HTTP_409" || d.Reference == "" {
		t.Fatalf("retry: %+v (err %v), want dispatched HTTP_409 with the original reference", d, err)
	}
	if st := s.Stats(); st.Payments != 1 || st.Replays != 1 || st.EffectiveDuplicates != 0 {
		t.Fatalf("stats = %+v, want 1 payment, 1 replay, 0 effective duplicates", st)
	}
}

func TestSandboxHandlerFailures(t *testing.T) {
	t.Parallel()
	for name, tt := range map[string]struct {
		opts    SandboxOptions
		down    error
		rail    string
		outcome Outcome
		code    ErrorCode
	}{
		"rejected":    {opts: SandboxOptions{TerminalRate: 1}, rail: "HTTP_422", outcome: Failed, code: CodeRailRejected},
		"unavailable": {opts: SandboxOptions{RetryableRate: 1}, rail: "HTTP_503", outcome: Retryable, code: CodeRailUnavailable},
		"down":        {down: ErrUnavailable, rail: "HTTP_503", outcome: Retryable, code: CodeRailUnavailable},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s, _, w := sandboxServer(t, tt.opts)
			s.SetDown(tt.down)
			res, err := w.Send(t.Context(), testInstruction(t, "key-"+name))
			d := w.Codes().Decide(res, err)
			if d.RailCode != tt.rail || d.Outcome != tt.outcome || d.ErrorCode != tt.code {
				t.Fatalf("decision = %+v (err %v), want %s %s %s", d, err, tt.rail, tt.outcome, tt.code)
			}
			if st := s.Stats(); st.Payments != 0 {
				t.Fatalf("stats = %+v: nothing should be paid", st)
			}
		})
	}
}

// The HTTP status chosen for each sandbox code must classify, through
// WebhookCodes, exactly as the code does through SandboxCodes: a relayer
// must not care whether the sandbox is in-process or across the network.
func TestSandboxHTTPStatusAgreesWithCodes(t *testing.T) {
	t.Parallel()
	for code, want := range SandboxCodes {
		status := sandboxHTTPStatus(code)
		if got, ok := WebhookCodes[webhookCode(status)]; !ok || got != want {
			t.Errorf("%s -> HTTP %d -> %+v, want %+v", code, status, got, want)
		}
	}
	if status := sandboxHTTPStatus("SOMETHING_NEW"); status/100 == 2 || status == http.StatusConflict {
		t.Errorf("an unknown sandbox code maps to success status %d", status)
	}
}

func TestSandboxHandlerStatsAndHealth(t *testing.T) {
	t.Parallel()
	s, srv, w := sandboxServer(t, SandboxOptions{})
	ins := testInstruction(t, "key-stats")
	for range 2 {
		if _, err := w.Send(t.Context(), ins); err != nil {
			t.Fatal(err)
		}
	}

	resp, err := srv.Client().Get(srv.URL + "/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var raw map[string]int64
	if err := json.NewDecoder(resp.Body).Decode(&raw); err != nil {
		t.Fatalf("GET /stats: %v", err)
	}
	b, _ := json.Marshal(raw)
	var got SandboxStatsResponse
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if SandboxStats(got) != s.Stats() || got.Payments != 1 || got.Replays != 1 {
		t.Fatalf("GET /stats = %+v, sandbox has %+v", got, s.Stats())
	}
	for _, key := range []string{"calls", "payments", "replays", "rejected", "retryable", "timeouts", "hangs", "effective_duplicates"} {
		if _, ok := raw[key]; !ok {
			t.Errorf("GET /stats has no %q field: %v", key, raw)
		}
	}
	if len(raw) != 8 {
		t.Errorf("GET /stats has %d fields, want 8: %v", len(raw), raw)
	}

	for path, want := range map[string]int{"/healthz": http.StatusOK, "/": http.StatusMethodNotAllowed} {
		resp, err := srv.Client().Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s: status %d, want %d", path, resp.StatusCode, want)
		}
	}
	if st := s.Stats(); st.Calls != 2 {
		t.Errorf("GETs must not touch the ledger: %+v", st)
	}
}

// TestSandboxHandlerUsesAttemptHeader: the attempt number reaches the
// sandbox through the X-Outbox-Attempt header (the body no longer carries
// it), so its deterministic choices are the same over HTTP as in-process.
func TestSandboxHandlerUsesAttemptHeader(t *testing.T) {
	t.Parallel()
	opts := SandboxOptions{Seed: 7, RetryableRate: 0.5}
	remote, _, w := sandboxServer(t, opts)
	local := NewSandbox(opts)
	differs := false // some answer depends on the attempt number
	for i := range 20 {
		ins := testInstruction(t, "key-attempt-"+strconv.Itoa(i))
		var first string
		for attempt := 1; attempt <= 3; attempt++ {
			ins.AttemptNo = attempt
			want, err := local.Send(t.Context(), ins)
			if err != nil {
				t.Fatal(err)
			}
			res, err := w.Send(t.Context(), ins)
			if err != nil {
				t.Fatal(err)
			}
			if res.Code != webhookCode(sandboxHTTPStatus(want.Code)) {
				t.Fatalf("%s attempt %d: HTTP answer %s, in-process %s", ins.IdempotencyKey, attempt, res.Code, want.Code)
			}
			if attempt == 1 {
				first = want.Code
			} else if want.Code != first {
				differs = true
			}
		}
	}
	if !differs {
		t.Fatal("no answer depended on the attempt number: the test proves nothing")
	}
	if remote.Stats() != local.Stats() {
		t.Fatalf("stats over HTTP %+v, in-process %+v", remote.Stats(), local.Stats())
	}
}

func TestSandboxHandlerBadAttemptHeader(t *testing.T) {
	t.Parallel()
	s, srv, _ := sandboxServer(t, SandboxOptions{RecordAttempts: true})
	body, err := json.Marshal(NewWebhookRequest(testInstruction(t, "key-bad-attempt")))
	if err != nil {
		t.Fatal(err)
	}
	bad := map[string][][]string{
		HeaderAttempt: {{"0"}, {"-1"}, {"+2"}, {"two"}, {""}, {"1234567890"}, {"1", "2"}},
		HeaderAttemptID: {{"x"}, {""}, {uuid.Nil.String()}, {"0195f3c2a1b27c3d8e9fa0b1c2d3e4f5"},
			{"{0195f3c2-a1b2-7c3d-8e9f-a0b1c2d3e4f5}"}, {"0195f3c2-a1b2-7c3d-8e9f-a0b1c2d3e4f5", "0195f3c2-a1b2-7c3d-8e9f-a0b1c2d3e4f6"}},
	}
	for header, cases := range bad {
		for _, values := range cases {
			req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL, bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			ts := strconv.FormatInt(time.Now().Unix(), 10)
			req.Header.Set(HeaderIdempotencyKey, "key-bad-attempt")
			req.Header.Set(HeaderTimestamp, ts)
			req.Header.Set(HeaderSignature, Sign(testWebhookSecret, ts, body))
			req.Header[header] = values
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusBadRequest {
				t.Errorf("%s %q: status %d, want 400", header, values, resp.StatusCode)
			}
		}
	}
	if ids := s.AttemptIDs(); len(ids) != 0 {
		t.Errorf("bad requests recorded attempts %v", ids)
	}
	if st := s.Stats(); st.Calls != 0 {
		t.Fatalf("stats = %+v: a bad request reached the ledger", st)
	}
}

// TestSandboxHandlerRecordsAttempts: the webhook sends each attempt's id
// in the X-Outbox-Attempt-Id header, and a sandbox that records attempts
// serves the ids it was called for at GET /attempts, each once however
// often it was called for it; one that does not answers 404.
func TestSandboxHandlerRecordsAttempts(t *testing.T) {
	t.Parallel()
	s, srv, w := sandboxServer(t, SandboxOptions{RecordAttempts: true})
	first, second := uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
	ins := testInstruction(t, "key-record")
	for i, id := range []uuid.UUID{first, first, second, uuid.Nil} {
		ins.AttemptNo, ins.AttemptID = i+1, id
		if _, err := w.Send(t.Context(), ins); err != nil {
			t.Fatal(err)
		}
	}
	var got SandboxAttemptsResponse
	if status := getJSON(t, srv, "/attempts", &got); status != http.StatusOK {
		t.Fatalf("GET /attempts: status %d", status)
	}
	slices.SortFunc(got.AttemptIDs, func(a, b uuid.UUID) int { return bytes.Compare(a[:], b[:]) })
	if want := []uuid.UUID{first, second}; !slices.Equal(got.AttemptIDs, want) {
		t.Errorf("GET /attempts = %v, want %v", got.AttemptIDs, want)
	}
	if st := s.Stats(); st.Calls != 4 {
		t.Errorf("calls = %d, want 4", st.Calls)
	}

	quiet, quietSrv, quietHook := sandboxServer(t, SandboxOptions{})
	ins.AttemptID = first
	if _, err := quietHook.Send(t.Context(), ins); err != nil {
		t.Fatal(err)
	}
	if status := getJSON(t, quietSrv, "/attempts", &got); status != http.StatusNotFound {
		t.Errorf("GET /attempts without RecordAttempts: status %d, want 404", status)
	}
	if ids := quiet.AttemptIDs(); len(ids) != 0 {
		t.Errorf("a sandbox without RecordAttempts kept %v", ids)
	}
}

// getJSON GETs path from srv, decodes a 200 answer into v and returns the
// status.
func getJSON(t *testing.T, srv *httptest.Server, path string, v any) int {
	t.Helper()
	resp, err := srv.Client().Get(srv.URL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
	}
	return resp.StatusCode
}

// TestSandboxHandlerRefusesUnpayable: a correctly signed body that no rail
// could pay (no amount, a negative amount, an unknown currency, no
// destination, nothing at all) is refused 422 the way a real rail refuses
// it, and nothing is paid; a good one next to them is paid.
func TestSandboxHandlerRefusesUnpayable(t *testing.T) {
	t.Parallel()
	s, srv, _ := sandboxServer(t, SandboxOptions{})
	post := func(body string) int {
		t.Helper()
		var probe struct {
			Key string `json:"idempotency_key"`
		}
		if err := json.Unmarshal([]byte(body), &probe); err != nil {
			t.Fatal(err)
		}
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL, bytes.NewReader([]byte(body)))
		if err != nil {
			t.Fatal(err)
		}
		ts := strconv.FormatInt(time.Now().Unix(), 10)
		req.Header.Set(HeaderIdempotencyKey, probe.Key)
		req.Header.Set(HeaderTimestamp, ts)
		req.Header.Set(HeaderSignature, Sign(testWebhookSecret, ts, []byte(body)))
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, tt := range []struct {
		name, body string
		status     int
	}{
		{"no amount", `{"instruction_id":"i","participant_id":"p","idempotency_key":"k1","rail":"sandbox","currency":"USD","destination":"acct"}`, http.StatusUnprocessableEntity},
		{"negative amount", `{"instruction_id":"i","participant_id":"p","idempotency_key":"k2","rail":"sandbox","amount_minor":-5,"currency":"USD","destination":"acct"}`, http.StatusUnprocessableEntity},
		{"zero amount", `{"instruction_id":"i","participant_id":"p","idempotency_key":"k3","rail":"sandbox","amount_minor":0,"currency":"USD","destination":"acct"}`, http.StatusUnprocessableEntity},
		{"unknown currency", `{"instruction_id":"i","participant_id":"p","idempotency_key":"k4","rail":"sandbox","amount_minor":5,"currency":"ZZZ","destination":"acct"}`, http.StatusUnprocessableEntity},
		{"no destination", `{"instruction_id":"i","participant_id":"p","idempotency_key":"k5","rail":"sandbox","amount_minor":5,"currency":"USD"}`, http.StatusUnprocessableEntity},
		{"nothing to pay", `{"instruction_id":"i","participant_id":"p","idempotency_key":"k6","rail":"sandbox"}`, http.StatusUnprocessableEntity},
		{"good payment", `{"instruction_id":"i","participant_id":"p","idempotency_key":"k7","rail":"sandbox","amount_minor":5,"currency":"USD","destination":"acct"}`, http.StatusOK},
	} {
		if got := post(tt.body); got != tt.status {
			t.Errorf("%s: status %d, want %d", tt.name, got, tt.status)
		}
	}
	if st := s.Stats(); st.Payments != 1 || st.Rejected != 6 {
		t.Fatalf("stats = %+v, want 1 payment and 6 refusals", st)
	}
}

// TestSandboxHandlerRefusesAmbiguousBodies: a signed body naming
// idempotency_key twice (the header matching either one), or carrying a
// money field in another letter case, is a bad request and pays nothing;
// encoding/json would have taken the last one.
func TestSandboxHandlerRefusesAmbiguousBodies(t *testing.T) {
	t.Parallel()
	s, srv, _ := sandboxServer(t, SandboxOptions{})
	for _, tt := range []struct{ name, key, body string }{
		{"key twice, header names the first", "k-a", `{"instruction_id":"i","participant_id":"p","idempotency_key":"k-a","idempotency_key":"k-b","rail":"sandbox","amount_minor":5,"currency":"USD","destination":"acct"}`},
		{"key twice, header names the last", "k-b", `{"instruction_id":"i","participant_id":"p","idempotency_key":"k-a","idempotency_key":"k-b","rail":"sandbox","amount_minor":5,"currency":"USD","destination":"acct"}`},
		{"amount in another case", "k-c", `{"instruction_id":"i","participant_id":"p","idempotency_key":"k-c","rail":"sandbox","amount_minor":5,"AMOUNT_MINOR":99999999,"currency":"USD","destination":"acct"}`},
	} {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL, bytes.NewReader([]byte(tt.body)))
		if err != nil {
			t.Fatal(err)
		}
		ts := strconv.FormatInt(time.Now().Unix(), 10)
		req.Header.Set(HeaderIdempotencyKey, tt.key)
		req.Header.Set(HeaderTimestamp, ts)
		req.Header.Set(HeaderSignature, Sign(testWebhookSecret, ts, []byte(tt.body)))
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: status %d, want 400", tt.name, resp.StatusCode)
		}
	}
	if st := s.Stats(); st.Calls != 0 || st.Payments != 0 {
		t.Fatalf("stats %+v: an ambiguous body reached the ledger", st)
	}
}
