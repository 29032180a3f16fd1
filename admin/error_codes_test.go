package admin_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"

	"github.com/ledgerline/outbox/admin"
)

// TestEveryErrorAnswerHasACode: every error answer of the API carries its
// refusal in "code" (the table in docs/operations.md, "The API's error
// codes"), and the action results keep their "error" as before. Clients
// read the codes; some answers named theirs in "error" (IN_FLIGHT), some
// in "code" (BUSY), and most (401, 403, 400, 404, 413) in neither, only
// in words.
func TestEveryErrorAnswerHasACode(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	none := uuid.Must(uuid.NewV7()).String()
	inFlight := b.enqueue(t, "p1", "k1")
	b.claim(t, "r1", time.Hour)
	reason := map[string]string{"reason": "x"}
	for _, c := range []struct {
		method, path, secret string
		body                 any
		status               int
		code, error          string // error: "" for a message in words
	}{
		{"GET", "/api/v1/overview", "", nil, 401, "UNAUTHORIZED", ""},
		{"GET", "/api/v1/overview", "wrong-secret-0123456789", nil, 401, "UNAUTHORIZED", ""},
		{"POST", "/api/v1/dead-letters/" + none + "/replay", auditorSecret, reason, 403, "FORBIDDEN", ""},
		{"GET", "/api/v1/instructions?limit=0", auditorSecret, nil, 400, "BAD_REQUEST", ""},
		{"GET", "/api/v1/instructions?state=done", auditorSecret, nil, 400, "BAD_REQUEST", ""},
		{"GET", "/api/v1/dead-letters?after=zz", auditorSecret, nil, 400, "BAD_REQUEST", ""},
		{"GET", "/api/v1/trail/not-an-id", auditorSecret, nil, 400, "BAD_REQUEST", ""},
		{"GET", "/api/v1/trail", auditorSecret, nil, 400, "BAD_REQUEST", ""},
		{"POST", "/api/v1/dead-letters/not-an-id/replay", operatorSecret, reason, 400, "BAD_REQUEST", ""},
		{"POST", "/api/v1/dead-letters/" + none + "/replay", operatorSecret, map[string]string{}, 400, "BAD_REQUEST", ""},
		{"POST", "/api/v1/instructions/" + none + "/cancel", operatorSecret, map[string]string{"reason": "a\u202ereversed"}, 400, "BAD_REQUEST", ""},
		{"POST", "/api/v1/dead-letters/" + none + "/replay", operatorSecret, reason, 404, "NOT_FOUND", "-"},
		{"POST", "/api/v1/instructions/" + none + "/cancel", operatorSecret, reason, 404, "NOT_FOUND", "-"},
		{"POST", "/api/v1/instructions/" + inFlight.String() + "/cancel", operatorSecret, reason, 409, "IN_FLIGHT", "IN_FLIGHT"},
		{"POST", "/api/v1/rails/sandbox/halt", operatorSecret, reason, 404, "NOT_FOUND", ""},
		{"POST", "/api/v1/rails/sandbox/resume", operatorSecret, reason, 404, "NOT_PAUSED", "-"},
		{"POST", "/api/v1/rails/sandbox/pause", operatorSecret, strings.Repeat("x", admin.MaxRequestBody+1), 413, "BODY_TOO_LARGE", ""},
	} {
		var rd io.Reader
		if c.body != nil {
			data, err := json.Marshal(c.body)
			if err != nil {
				t.Fatal(err)
			}
			rd = bytes.NewReader(data)
		}
		resp, data := sendAPI(t, b.ctx, c.method, b.url+c.path, c.secret, rd)
		var body map[string]any
		if err := json.Unmarshal(data, &body); err != nil || resp.StatusCode != c.status {
			t.Errorf("%s %s: %d %s (%v), want %d and JSON", c.method, c.path, resp.StatusCode, data, err, c.status)
			continue
		}
		if body["code"] != c.code {
			t.Errorf("%s %s: code %v, want %q: %s", c.method, c.path, body["code"], c.code, data)
		}
		switch e, _ := body["error"].(string); c.error {
		case "":
			if e == "" {
				t.Errorf("%s %s: no error message: %s", c.method, c.path, data)
			}
		case "-":
			if _, ok := body["error"]; ok {
				t.Errorf("%s %s: an error field where there was none: %s", c.method, c.path, data)
			}
		default:
			if e != c.error {
				t.Errorf("%s %s: error %q, want %q as before", c.method, c.path, e, c.error)
			}
		}
	}
	// Last: it throttles this address.
	for range admin.AuthFailureLimit {
		b.call(t, "GET", "/api/v1/overview", "wrong-secret-0123456789", nil, nil)
	}
	var body map[string]string
	if code := b.call(t, "GET", "/api/v1/overview", auditorSecret, nil, &body); code != 429 || body["code"] != "TOO_MANY_FAILURES" || body["error"] == "" {
		t.Errorf("a throttled request: %d %v", code, body)
	}
}

// sendAPI sends an API request, with secret as its bearer token unless
// empty, and returns the answer with its body read and closed.
func sendAPI(t *testing.T, ctx context.Context, method, url, secret string, body io.Reader) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	if secret != "" {
		req.Header.Set("Authorization", "Bearer "+secret)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, data
}
