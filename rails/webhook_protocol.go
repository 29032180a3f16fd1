package rails

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gofrs/uuid/v5"

	"github.com/ledgerline/outbox/internal/strictjson"
	"github.com/ledgerline/outbox/payment"
)

// Headers of the webhook protocol (see [Webhook]).
const (
	// HeaderIdempotencyKey carries the instruction's idempotency key. The
	// receiver must treat a second request with the same key as a replay of
	// the first and answer 409 (or the original 2xx) without acting again;
	// while the first is still in progress, a retryable answer (503 or 429)
	// instead, as a 409 is recorded as dispatched.
	HeaderIdempotencyKey = "Idempotency-Key"
	// HeaderTimestamp carries the signing time in Unix seconds. It is part of
	// the signed string so a captured request cannot be replayed later.
	HeaderTimestamp = "X-Outbox-Timestamp"
	// HeaderSignature carries "v1=<lowercase hex HMAC-SHA256>" (see [Sign]).
	HeaderSignature = "X-Outbox-Signature"
	// HeaderAttempt carries the attempt number (1, 2, ...) of the dispatch,
	// for the receiver's logs. It is deliberately a header and not part of
	// the body: every attempt of one instruction must send a byte-identical
	// body, because receivers that fingerprint the payload per idempotency
	// key answer a changed payload under a known key with 422, which would
	// dead-letter an instruction that was in fact paid. It is not signed and
	// must never decide anything on the receiving side.
	HeaderAttempt = "X-Outbox-Attempt"
	// HeaderAttemptID carries the id of the dispatch's DISPATCHING row in
	// the outbox's archive (what `outbox audit trail` lists), so that the
	// receiver's logs name the attempt an auditor finds there. A header
	// for the same reason as HeaderAttempt, and like it informational and
	// not signed.
	HeaderAttemptID = "X-Outbox-Attempt-Id"
)

// DefaultSignatureTolerance is how far a request's timestamp may be from the
// receiver's clock before [VerifySignature] rejects it as a replay.
const DefaultSignatureTolerance = 5 * time.Minute

// ErrBadSignature is wrapped by every error of [VerifySignature]. The
// wrapping error says which check failed but never carries the secret or
// the signature values.
var ErrBadSignature = errors.New("webhook signature verification failed")

// signatureVersion prefixes the hex MAC in HeaderSignature, so the scheme
// can change later without ambiguity.
const signatureVersion = "v1"

// WebhookRequest is the JSON body of a webhook request. Optional fields are
// omitted when empty; the money fields are omitted for event instructions
// (nil Payment); Metadata is the instruction's raw JSON. It holds nothing
// that changes between attempts of one instruction (the attempt number is
// the [HeaderAttempt] header), so every attempt sends the same bytes.
type WebhookRequest struct {
	OutboxID       string          `json:"outbox_id,omitempty"`
	InstructionID  string          `json:"instruction_id"`
	ParticipantID  string          `json:"participant_id"`
	SequenceID     int64           `json:"sequence_id,omitempty"`
	IdempotencyKey string          `json:"idempotency_key"`
	Rail           string          `json:"rail"`
	TenantID       string          `json:"tenant_id,omitempty"`
	CorrelationID  string          `json:"correlation_id,omitempty"`
	AmountMinor    *int64          `json:"amount_minor,omitempty"` // a pointer: present whenever payment.Payment is
	Currency       string          `json:"currency,omitempty"`
	Destination    string          `json:"destination,omitempty"`
	Metadata       json.RawMessage `json:"metadata,omitempty"`
}

// NewWebhookRequest builds the request body of an instruction.
func NewWebhookRequest(ins payment.Instruction) WebhookRequest {
	r := WebhookRequest{
		InstructionID:  ins.InstructionID,
		ParticipantID:  ins.ParticipantID,
		SequenceID:     ins.SequenceID,
		IdempotencyKey: ins.IdempotencyKey,
		Rail:           ins.RailType,
		TenantID:       ins.TenantID,
		CorrelationID:  ins.CorrelationID,
	}
	if ins.OutboxID != uuid.Nil {
		r.OutboxID = ins.OutboxID.String()
	}
	if p := ins.Payment; p != nil {
		amount := p.AmountMinor
		r.AmountMinor, r.Currency, r.Destination = &amount, p.Currency, p.Destination
	}
	if len(bytes.TrimSpace(ins.Metadata)) > 0 {
		r.Metadata = ins.Metadata
	}
	return r
}

// Instruction decodes a request body back into an instruction (the
// receiving side of the protocol). Any money field present means a Payment.
// AttemptNo is left zero: the body does not carry it (it is the
// [HeaderAttempt] header). It fails with a [*payment.ValidationError] when
// the idempotency key is missing or the outbox id is not a UUID.
func (r WebhookRequest) Instruction() (payment.Instruction, error) {
	ins := payment.Instruction{
		InstructionID:  r.InstructionID,
		ParticipantID:  r.ParticipantID,
		SequenceID:     r.SequenceID,
		IdempotencyKey: r.IdempotencyKey,
		RailType:       r.Rail,
		TenantID:       r.TenantID,
		CorrelationID:  r.CorrelationID,
	}
	if r.IdempotencyKey == "" {
		return payment.Instruction{}, payment.Invalid(payment.FieldIdempotencyKey, payment.ReasonRequired, "idempotency_key is required")
	}
	if r.OutboxID != "" {
		id, err := uuid.FromString(r.OutboxID)
		if err != nil {
			return payment.Instruction{}, payment.Invalid("outbox_id", payment.ReasonInvalid, "outbox_id is not a UUID")
		}
		ins.OutboxID = id
	}
	if r.AmountMinor != nil || r.Currency != "" || r.Destination != "" {
		ins.Payment = &payment.Payment{Currency: r.Currency, Destination: r.Destination}
		if r.AmountMinor != nil {
			ins.Payment.AmountMinor = *r.AmountMinor
		}
	}
	if len(r.Metadata) > 0 {
		ins.Metadata = bytes.Clone(r.Metadata)
	}
	return ins, nil
}

// Sign returns the X-Outbox-Signature header value for a request:
// "v1=" followed by the lowercase hex HMAC-SHA256 of timestamp + "." + body
// under secret. The timestamp is the exact X-Outbox-Timestamp header value.
func Sign(secret []byte, timestamp string, body []byte) string {
	return signatureVersion + "=" + hex.EncodeToString(webhookMAC(secret, timestamp, body))
}

func webhookMAC(secret []byte, timestamp string, body []byte) []byte {
	m := hmac.New(sha256.New, secret)
	io.WriteString(m, timestamp)
	m.Write([]byte{'.'})
	m.Write(body)
	return m.Sum(nil)
}

// errKeyBinding is wrapped, besides [ErrBadSignature], by the errors of
// [VerifySignature] whose signature is good but whose Idempotency-Key
// header is not the body's idempotency_key, so the sandbox server can
// answer those 400 (a bad request) rather than 401.
var errKeyBinding = errors.New("the Idempotency-Key header does not match the body's idempotency_key")

// VerifySignature checks a request's signature headers against its body:
// the timestamp must be within tolerance of now (either direction; zero
// or negative means [DefaultSignatureTolerance]) so captured requests
// cannot be replayed later, and one of the "v1=" signatures in
// X-Outbox-Signature (comma-separated, or repeated headers, to allow secret
// rotation) must match, compared in constant time.
//
// The signature covers the timestamp and the body, not the headers, so a
// valid signature is not enough: the request must also carry exactly one
// Idempotency-Key header, equal to the idempotency_key of the (JSON) body.
// Otherwise a captured request replayed with another Idempotency-Key header
// would verify and get past a receiver that deduplicates on the header.
//
// An empty secret verifies nothing. Errors wrap [ErrBadSignature].
func VerifySignature(secret []byte, header http.Header, body []byte, now time.Time, tolerance time.Duration) error {
	if len(secret) == 0 {
		return fmt.Errorf("%w: no secret configured", ErrBadSignature)
	}
	ts := header.Get(HeaderTimestamp)
	if ts == "" {
		return fmt.Errorf("%w: missing %s header", ErrBadSignature, HeaderTimestamp)
	}
	sigs := header.Values(HeaderSignature)
	if len(sigs) == 0 {
		return fmt.Errorf("%w: missing %s header", ErrBadSignature, HeaderSignature)
	}
	// Plain digits only: the signed string is the header text, so lenient
	// parsing ("+17", " 17") would let one signature cover several texts.
	if !isDigits(ts) || len(ts) > 12 {
		return fmt.Errorf("%w: malformed %s header", ErrBadSignature, HeaderTimestamp)
	}
	sec, _ := strconv.ParseInt(ts, 10, 64)
	if tolerance <= 0 {
		tolerance = DefaultSignatureTolerance
	}
	if d := now.Sub(time.Unix(sec, 0)); d > tolerance || d < -tolerance {
		return fmt.Errorf("%w: timestamp outside the %s tolerance", ErrBadSignature, tolerance)
	}
	want := webhookMAC(secret, ts, body)
	for _, h := range sigs {
		for part := range strings.SplitSeq(h, ",") {
			version, sig, ok := strings.Cut(strings.TrimSpace(part), "=")
			if !ok || version != signatureVersion {
				continue
			}
			got, err := hex.DecodeString(sig)
			if err == nil && hmac.Equal(got, want) {
				return verifyKeyBinding(header, body)
			}
		}
	}
	return fmt.Errorf("%w: signature mismatch", ErrBadSignature)
}

// verifyKeyBinding checks, for an authentic body, that the request has
// exactly one Idempotency-Key header and that it is the body's
// idempotency_key (compared as decoded by encoding/json, as receivers in
// this package decode the body). Errors wrap ErrBadSignature and
// errKeyBinding and never show the keys.
func verifyKeyBinding(header http.Header, body []byte) error {
	keys := header.Values(HeaderIdempotencyKey)
	if len(keys) != 1 {
		return fmt.Errorf("%w: %w (want exactly one such header, got %d)", ErrBadSignature, errKeyBinding, len(keys))
	}
	var b struct {
		IdempotencyKey string `json:"idempotency_key"`
	}
	// Strict like the receivers of this package: a repeated
	// idempotency_key, or one in another letter case, is refused rather
	// than resolved one way here and another way by the handler.
	if err := strictjson.UnmarshalKnown(body, &b); err != nil {
		return fmt.Errorf("%w: %w (the body is not a JSON object)", ErrBadSignature, errKeyBinding)
	}
	if keys[0] != b.IdempotencyKey {
		return fmt.Errorf("%w: %w", ErrBadSignature, errKeyBinding)
	}
	return nil
}
