package rails

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/gofrs/uuid/v5"

	"github.com/ledgerline/outbox/internal/strictjson"
	"github.com/ledgerline/outbox/payment"
)

// webhookEnvelopeBytes bounds what a webhook body holds besides the
// payload: the outbox id, six identifiers of at most 200 bytes (each
// character up to the six bytes of a \u003c escape), member names and
// punctuation.
const webhookEnvelopeBytes = 16 << 10

// WebhookBodyLimit is the largest body the [Webhook] transport sends for an
// instruction whose payload is at most maxPayloadBytes as producers count
// it (PostgreSQL's text form, see [payment.DefaultMaxPayloadBytes]; zero or
// less means that default): a receiver that caps request bodies must take
// this much, or it refuses instructions the outbox accepted. It is six
// times the payload plus the envelope, because encoding/json writes '<',
// '>' and '&' as six-byte escapes that PostgreSQL writes as one byte.
func WebhookBodyLimit(maxPayloadBytes int) int64 {
	if maxPayloadBytes <= 0 {
		maxPayloadBytes = payment.DefaultMaxPayloadBytes
	}
	if int64(maxPayloadBytes) > (math.MaxInt64-webhookEnvelopeBytes)/6 {
		// Saturating: wrapped, a negative cap refused every body.
		return math.MaxInt64
	}
	return 6*int64(maxPayloadBytes) + webhookEnvelopeBytes
}

// SandboxStatsResponse is the JSON form of [SandboxStats] served by GET
// /stats. It converts both ways with a plain conversion
// (SandboxStatsResponse(st), SandboxStats(resp)); a field added to
// SandboxStats without one here stops that conversion from compiling.
type SandboxStatsResponse struct {
	Calls               int64 `json:"calls"`
	Payments            int64 `json:"payments"`
	Replays             int64 `json:"replays"`
	Rejected            int64 `json:"rejected"`
	Retryable           int64 `json:"retryable"`
	Timeouts            int64 `json:"timeouts"`
	Hangs               int64 `json:"hangs"`
	EffectiveDuplicates int64 `json:"effective_duplicates"`
}

// sandboxAnswer is the JSON body of every answer to a payment request.
type sandboxAnswer struct {
	Reference string `json:"reference,omitempty"`
	Code      string `json:"code"`
	Message   string `json:"message,omitempty"`
}

// Codes of answers produced by the HTTP layer itself, before the sandbox
// ledger is involved.
const (
	sandboxHTTPUnauthorized = "UNAUTHORIZED"
	sandboxHTTPBadRequest   = "BAD_REQUEST"
	sandboxHTTPTooLarge     = "TOO_LARGE"
	sandboxHTTPNotAllowed   = "METHOD_NOT_ALLOWED"
)

// NewSandboxHandler serves the webhook protocol (see [Webhook]) in front of
// an in-memory [Sandbox], so the rail can live in its own process and
// outlive the relayers that call it (crash tests, `outbox sandbox serve`).
//
//   - POST to any path other than the three below: verify the signature
//     with secret (401 on failure; an empty secret rejects everything),
//     decode the body (400 if malformed or if the Idempotency-Key header is
//     not exactly the body's idempotency_key, both checked by
//     [VerifySignature]; 400 too if the X-Outbox-Attempt header is present
//     but not a positive number, or the X-Outbox-Attempt-Id header is
//     present but not a UUID), then s.Send with the request's context and
//     the attempt's number and id of the headers (0 and uuid.Nil without
//     them; the number seeds the sandbox's choices as in-process), so
//     injected latency, hangs and paid-then-silent timeouts last until the
//     client gives up, exactly as in-process. Answers:
//     ACCEPTED 200, DUPLICATE 409, REJECTED 422, TEMPORARILY_UNAVAILABLE
//     503, RATE_LIMITED 429 with Retry-After: 1; body {"reference",
//     "code", "message"}.
//   - GET /stats: [SandboxStatsResponse].
//   - GET /attempts: [SandboxAttemptsResponse] (404 unless the sandbox
//     records attempts, [SandboxOptions].RecordAttempts).
//   - GET /healthz: 200.
//
// Request bodies are capped at [WebhookBodyLimit] of
// [payment.DefaultMaxPayloadBytes]; see [NewSandboxHandlerLimit] for
// producers with another limit.
func NewSandboxHandler(s *Sandbox, secret []byte) http.Handler {
	return NewSandboxHandlerLimit(s, secret, payment.DefaultMaxPayloadBytes)
}

// NewSandboxHandlerLimit is [NewSandboxHandler] for producers whose payload
// limit is maxPayloadBytes (pending.Config.MaxPayloadBytes, `outbox
// enqueue --max-payload-bytes`; zero or less means the default): request
// bodies up to [WebhookBodyLimit] of it are read, longer ones answered 413.
func NewSandboxHandlerLimit(s *Sandbox, secret []byte, maxPayloadBytes int) http.Handler {
	key := bytes.Clone(secret)
	return newSandboxHandler(s, maxPayloadBytes, func(time.Time) [][]byte { return [][]byte{key} })
}

// NewSandboxHandlerSecret is [NewSandboxHandlerLimit] whose secret can
// change while it serves: a request is accepted if it is signed with any
// secret secret.Accepted lists, the one in force and, for the window the
// secret was given, the one it replaced, so that senders that have not
// reloaded their copy yet are not refused during a rotation.
func NewSandboxHandlerSecret(s *Sandbox, secret *RotatingSecret, maxPayloadBytes int) http.Handler {
	return newSandboxHandler(s, maxPayloadBytes, secret.Accepted)
}

// newSandboxHandler builds the handler; keys lists the secrets accepted at
// a time, the one in force first.
func newSandboxHandler(s *Sandbox, maxPayloadBytes int, keys func(time.Time) [][]byte) http.Handler {
	h := &sandboxHandler{
		sandbox:  s,
		maxBytes: WebhookBodyLimit(maxPayloadBytes),
		verify: func(header http.Header, body []byte) error {
			now := time.Now()
			var first error
			for _, key := range keys(now) {
				err := VerifySignature(key, header, body, now, DefaultSignatureTolerance)
				if err == nil || errors.Is(err, errKeyBinding) {
					return err // authentic: this key's answer is the answer
				}
				if first == nil {
					first = err
				}
			}
			return first
		},
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /stats", h.stats)
	mux.HandleFunc("GET /attempts", h.attempts)
	mux.HandleFunc("GET /healthz", h.healthz)
	mux.HandleFunc("POST /", h.pay)
	return mux
}

type sandboxHandler struct {
	sandbox  *Sandbox
	maxBytes int64 // request body cap
	// verify holds the secret in a closure, out of reach of anything that
	// prints the handler.
	verify func(header http.Header, body []byte) error
}

func (h *sandboxHandler) pay(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/stats" || r.URL.Path == "/attempts" || r.URL.Path == "/healthz" {
		// "POST /" would otherwise take these paths and pay.
		w.Header().Set("Allow", "GET, HEAD")
		sandboxWriteJSON(w, http.StatusMethodNotAllowed, sandboxAnswer{Code: sandboxHTTPNotAllowed, Message: "use GET"})
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.maxBytes))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			sandboxWriteJSON(w, http.StatusRequestEntityTooLarge, sandboxAnswer{Code: sandboxHTTPTooLarge, Message: "request body too large"})
		}
		return // otherwise the client went away mid-body
	}
	// The signature is checked before the body is used: an
	// unauthenticated caller learns nothing about what we accept.
	// VerifySignature also binds the Idempotency-Key header (what
	// intermediaries and dedup layers see) to the body's key (what gets
	// paid); a signed request that fails only that check is a bad request.
	if err := h.verify(r.Header, body); err != nil {
		if errors.Is(err, errKeyBinding) {
			sandboxWriteJSON(w, http.StatusBadRequest, sandboxAnswer{Code: sandboxHTTPBadRequest, Message: err.Error()})
			return
		}
		sandboxWriteJSON(w, http.StatusUnauthorized, sandboxAnswer{Code: sandboxHTTPUnauthorized, Message: err.Error()})
		return
	}
	var req WebhookRequest
	if err := strictjson.Unmarshal(body, &req); err != nil {
		sandboxWriteJSON(w, http.StatusBadRequest, sandboxAnswer{Code: sandboxHTTPBadRequest, Message: "malformed body: " + err.Error()})
		return
	}
	ins, err := req.Instruction()
	if err != nil {
		sandboxWriteJSON(w, http.StatusBadRequest, sandboxAnswer{Code: sandboxHTTPBadRequest, Message: err.Error()})
		return
	}
	// The attempt number travels in a header so that every attempt's body
	// is the same bytes (see HeaderAttempt).
	if ins.AttemptNo, err = parseAttemptHeader(r.Header); err != nil {
		sandboxWriteJSON(w, http.StatusBadRequest, sandboxAnswer{Code: sandboxHTTPBadRequest, Message: err.Error()})
		return
	}
	if ins.AttemptID, err = parseAttemptIDHeader(r.Header); err != nil {
		sandboxWriteJSON(w, http.StatusBadRequest, sandboxAnswer{Code: sandboxHTTPBadRequest, Message: err.Error()})
		return
	}

	res, err := h.sandbox.Send(r.Context(), ins)
	if err != nil {
		if r.Context().Err() != nil {
			return // the client gave up; nobody is left to answer
		}
		// SetDown: the rail refuses before acting. Never fall through to
		// an implicit 200, which the client would take as a payment.
		sandboxWriteJSON(w, http.StatusServiceUnavailable, sandboxAnswer{Code: SandboxUnavailable, Message: err.Error()})
		return
	}
	if res.Code == SandboxRateLimited {
		w.Header().Set("Retry-After", "1")
	}
	sandboxWriteJSON(w, sandboxHTTPStatus(res.Code), sandboxAnswer{Reference: res.Reference, Code: res.Code, Message: res.Message})
}

// parseAttemptHeader reads the [HeaderAttempt] header: 0 when absent,
// otherwise a positive decimal number of at most 9 digits (plain digits
// only, as for the timestamp).
func parseAttemptHeader(h http.Header) (int, error) {
	vs := h.Values(HeaderAttempt)
	switch {
	case len(vs) == 0:
		return 0, nil
	case len(vs) > 1:
		return 0, fmt.Errorf("more than one %s header", HeaderAttempt)
	}
	v := vs[0]
	if v == "" || len(v) > 9 || !isDigits(v) {
		return 0, fmt.Errorf("malformed %s header", HeaderAttempt)
	}
	n, _ := strconv.Atoi(v)
	if n == 0 {
		return 0, fmt.Errorf("%s header must be at least 1", HeaderAttempt)
	}
	return n, nil
}

// parseAttemptIDHeader reads the [HeaderAttemptID] header: uuid.Nil when
// absent, otherwise a UUID in its canonical form.
func parseAttemptIDHeader(h http.Header) (uuid.UUID, error) {
	vs := h.Values(HeaderAttemptID)
	switch {
	case len(vs) == 0:
		return uuid.Nil, nil
	case len(vs) > 1:
		return uuid.Nil, fmt.Errorf("more than one %s header", HeaderAttemptID)
	}
	id, err := uuid.FromString(vs[0])
	if err != nil || len(vs[0]) != 36 || id == uuid.Nil {
		return uuid.Nil, fmt.Errorf("malformed %s header", HeaderAttemptID)
	}
	return id, nil
}

// sandboxHTTPStatus maps a sandbox answer code to the status whose
// [WebhookCodes] rule matches the code's [SandboxCodes] rule.
func sandboxHTTPStatus(code string) int {
	switch code {
	case SandboxAccepted:
		return http.StatusOK
	case SandboxDuplicate:
		return http.StatusConflict
	case SandboxRejected:
		return http.StatusUnprocessableEntity
	case SandboxUnavailable:
		return http.StatusServiceUnavailable
	case SandboxRateLimited:
		return http.StatusTooManyRequests
	}
	// A code this server does not know: retryable on the client side, and
	// never a success.
	return http.StatusInternalServerError
}

func (h *sandboxHandler) stats(w http.ResponseWriter, _ *http.Request) {
	sandboxWriteJSON(w, http.StatusOK, SandboxStatsResponse(h.sandbox.Stats()))
}

// SandboxAttemptsResponse is the JSON body of GET /attempts: the ids of
// the attempts the sandbox was called for ([Sandbox.AttemptIDs]).
type SandboxAttemptsResponse struct {
	AttemptIDs []uuid.UUID `json:"attempt_ids"`
}

func (h *sandboxHandler) attempts(w http.ResponseWriter, _ *http.Request) {
	if !h.sandbox.opts.RecordAttempts {
		sandboxWriteJSON(w, http.StatusNotFound, sandboxAnswer{Code: "NOT_RECORDING",
			Message: "this sandbox does not record attempts (record_attempts, outbox sandbox serve --record-attempts)"})
		return
	}
	sandboxWriteJSON(w, http.StatusOK, SandboxAttemptsResponse{AttemptIDs: h.sandbox.AttemptIDs()})
}

func (h *sandboxHandler) healthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	io.WriteString(w, "ok\n")
}

// sandboxWriteJSON writes v as the JSON answer.
func sandboxWriteJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, "encoding answer", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}
