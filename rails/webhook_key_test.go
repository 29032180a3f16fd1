package rails

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/ledgerline/outbox/payment"
)

// TestWebhookRefusesNonASCIIKeys: a key outside printable ASCII is refused
// before anything is sent (terminal VALIDATION_FAILED, the rail never
// called), at enqueue as at dispatch. net/http sends it as raw UTF-8 bytes
// (obs-text), which HTTP receivers may read as ISO-8859-1 ("clé" becomes
// "clÃ©"), and proxies may reject or rewrite: the rail would deduplicate on
// a key that is not the body's, or refuse the signed request as a
// mismatch. Run against a real HTTP server, so what would arrive is what
// the server reads.
func TestWebhookRefusesNonASCIIKeys(t *testing.T) {
	t.Parallel()
	var (
		mu      sync.Mutex
		arrived []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		arrived = append(arrived, r.Header.Get(HeaderIdempotencyKey))
	}))
	t.Cleanup(srv.Close)
	w, err := NewWebhook(WebhookOptions{URL: srv.URL, Secret: testWebhookSecret})
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"clé-1", "key-\u00a0", "\u00a0key", "ключ-1", "key-€"} {
		ins := testInstruction(t, key)
		if err := (payment.Generic{}).Validate(ins); err == nil {
			t.Errorf("%q: payment validation accepts it", key)
		}
		res, err := w.Send(t.Context(), ins)
		if d := w.Codes().Decide(res, err); d.Outcome != Failed || d.ErrorCode != CodeValidationFailed || d.RailCalled {
			t.Errorf("%q: decision = %+v, want terminal VALIDATION_FAILED without calling the rail", key, d)
		}
	}
	mu.Lock()
	for _, k := range arrived {
		t.Errorf("the rail received Idempotency-Key %q (%x)", k, k)
	}
	mu.Unlock()
	// Printable ASCII, inner spaces included, still goes out as it is.
	res, err := w.Send(t.Context(), testInstruction(t, "key 1~!"))
	if d := w.Codes().Decide(res, err); d.Outcome != Dispatched {
		t.Fatalf("an ASCII key: %+v (err %v)", d, err)
	}
}
