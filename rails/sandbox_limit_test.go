package rails

import (
	"bytes"
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/ledgerline/outbox/internal/strictjson"
	"github.com/ledgerline/outbox/payment"
)

// worstCaseInstruction is the instruction whose webhook body is the
// largest for a payload of limit bytes (as PostgreSQL writes it back, what
// producers count): every identifier at its 200-byte limit and every
// string of the payload made of '<', which the webhook's encoding/json
// writes as the six bytes \u003c.
func worstCaseInstruction(t *testing.T, limit int) payment.Instruction {
	t.Helper()
	id := strings.Repeat("<", 200)
	ins := payment.Instruction{InstructionID: id, ParticipantID: id, IdempotencyKey: id, RailType: id,
		TenantID: id, CorrelationID: id,
		Payment: &payment.Payment{AmountMinor: 1, Currency: "USD", Destination: strings.Repeat("<", 256)}}
	if err := payment.ValidateText(payment.FieldDestination, ins.Payment.Destination, 256); err != nil {
		t.Fatal(err)
	}
	stored := func(fill int) (json.RawMessage, int) {
		meta := json.RawMessage(`{"m": "` + strings.Repeat("<", fill) + `"}`)
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false) // '<' as PostgreSQL writes it back
		if err := enc.Encode(payment.Payload{AmountMinor: 1, Currency: "USD", Destination: ins.Payment.Destination, Metadata: meta}); err != nil {
			t.Fatal(err)
		}
		n, err := strictjson.StoredSize(buf.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		return meta, n
	}
	_, base := stored(0)
	meta, n := stored(limit - base)
	if n != limit {
		t.Fatalf("payload of %d bytes, want %d", n, limit)
	}
	ins.Metadata = meta
	return ins
}

// TestSandboxHandlerTakesLargestPayload: the sandbox server takes the
// webhook body of any payload its producers' limit lets through, and
// refuses a body beyond WebhookBodyLimit with 413. Its cap was 80 KiB,
// whatever the limit: an instruction at the default 64 KiB whose strings
// encoding/json escapes (384 KiB on the wire), or any payload above 64 KiB
// under a raised limit, was answered 413, an unknown code the relayer
// retried until it dead-lettered a payment the engine had accepted.
func TestSandboxHandlerTakesLargestPayload(t *testing.T) {
	t.Parallel()
	for _, limit := range []int{0, payment.DefaultMaxPayloadBytes, 256 << 10} {
		t.Run(strconv.Itoa(limit), func(t *testing.T) {
			t.Parallel()
			s := NewSandbox(SandboxOptions{})
			srv := httptest.NewServer(NewSandboxHandlerLimit(s, testWebhookSecret, limit))
			t.Cleanup(srv.Close)
			w, err := NewWebhook(WebhookOptions{URL: srv.URL, Secret: testWebhookSecret})
			if err != nil {
				t.Fatal(err)
			}
			effective := limit
			if effective == 0 {
				effective = payment.DefaultMaxPayloadBytes
			}
			ins := worstCaseInstruction(t, effective)
			body, _ := json.Marshal(NewWebhookRequest(ins))
			if int64(len(body)) > WebhookBodyLimit(effective) {
				t.Fatalf("a body of %d bytes is beyond WebhookBodyLimit(%d) = %d", len(body), effective, WebhookBodyLimit(effective))
			}
			res, err := w.Send(t.Context(), ins)
			if d := w.Codes().Decide(res, err); d.Outcome != Dispatched || d.RailCode != "HTTP_200" {
				t.Fatalf("a %d-byte payload (%d-byte body): %+v (err %v), want dispatched HTTP_200", effective, len(body), d, err)
			}

			// One byte past the limit is refused before it is read.
			over := bytes.Repeat([]byte(" "), int(WebhookBodyLimit(effective))+1)
			resp, err := http.Post(srv.URL, "application/json", bytes.NewReader(over))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusRequestEntityTooLarge {
				t.Fatalf("a body one byte over the limit: %d, want 413", resp.StatusCode)
			}
			if st := s.Stats(); st.Payments != 1 || st.Calls != 1 {
				t.Fatalf("stats %+v, want the one payment", st)
			}
		})
	}
}

// TestSandboxHandlerDefaultTakesDefaultPayload: NewSandboxHandler takes
// the largest body of a payload at DefaultMaxPayloadBytes.
func TestSandboxHandlerDefaultTakesDefaultPayload(t *testing.T) {
	t.Parallel()
	_, _, w := sandboxServer(t, SandboxOptions{})
	ins := worstCaseInstruction(t, payment.DefaultMaxPayloadBytes)
	res, err := w.Send(t.Context(), ins)
	if d := w.Codes().Decide(res, err); d.Outcome != Dispatched || d.RailCode != "HTTP_200" {
		t.Fatalf("%+v (err %v), want dispatched HTTP_200", d, err)
	}
}

// TestWebhookBodyLimitSaturates: six times a payload limit near int's
// range wrapped to a negative cap, and a sandbox server given it refused
// every request (413). The cap saturates instead.
func TestWebhookBodyLimitSaturates(t *testing.T) {
	t.Parallel()
	for _, n := range []int{math.MaxInt, math.MaxInt64 / 6} {
		if got := WebhookBodyLimit(n); got < int64(n) {
			t.Errorf("WebhookBodyLimit(%d) = %d, want at least the payload limit", n, got)
		}
	}
}
