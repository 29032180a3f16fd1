package admin_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/gofrs/uuid/v5"

	"github.com/ledgerline/outbox/admin"
)

// TestUnknownAPIPathsAnswerJSONCodes: a path the API does not have is
// answered 404 NOT_FOUND, and a method a path does not take 405
// METHOD_NOT_ALLOWED with an Allow header, in JSON as every other error
// answer; they were net/http's plain-text 404 and 405, without a code.
// Authentication comes first: without a valid credential every /api/
// path, known or not, with any method, is answered 401, so that nobody
// unauthenticated learns which paths exist.
func TestUnknownAPIPathsAnswerJSONCodes(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	id := uuid.Must(uuid.NewV7()).String()
	for _, c := range []struct {
		method, path, secret string
		status               int
		code, allow          string
	}{
		{"GET", "/api/v1/nothing-here", auditorSecret, 404, admin.NotFound, ""},
		{"GET", "/api/v2/overview", operatorSecret, 404, admin.NotFound, ""},
		{"GET", "/api/", auditorSecret, 404, admin.NotFound, ""},
		{"DELETE", "/api/v1/overview", auditorSecret, 405, admin.MethodNotAllowed, "GET, HEAD"},
		{"GET", "/api/v1/dead-letters/" + id + "/replay", operatorSecret, 405, admin.MethodNotAllowed, "POST"},
		// An auditor learns the method of an operator's path, not more:
		// the 403 comes with the right method.
		{"PUT", "/api/v1/instructions/" + id + "/cancel", auditorSecret, 405, admin.MethodNotAllowed, "POST"},
		{"POST", "/api/v1/trail/" + id, auditorSecret, 405, admin.MethodNotAllowed, "GET, HEAD"},
		// Unauthenticated: 401 whatever the path and method.
		{"GET", "/api/v1/nothing-here", "", 401, admin.Unauthorized, ""},
		{"GET", "/api/v1/nothing-here", "wrong-secret-0123456789", 401, admin.Unauthorized, ""},
		{"DELETE", "/api/v1/overview", "", 401, admin.Unauthorized, ""},
		{"GET", "/api/v1/dead-letters/" + id + "/replay", "", 401, admin.Unauthorized, ""},
	} {
		resp, data := sendAPI(t, b.ctx, c.method, b.url+c.path, c.secret, nil)
		var body map[string]any
		if err := json.Unmarshal(data, &body); err != nil || resp.StatusCode != c.status {
			t.Errorf("%s %s: %d %q (%v), want %d and JSON", c.method, c.path, resp.StatusCode, data, err, c.status)
			continue
		}
		if body["code"] != c.code {
			t.Errorf("%s %s: code %v, want %s", c.method, c.path, body["code"], c.code)
		}
		if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
			t.Errorf("%s %s: Content-Type %q", c.method, c.path, ct)
		}
		if got := resp.Header.Get("Allow"); got != c.allow {
			t.Errorf("%s %s: Allow %q, want %q", c.method, c.path, got, c.allow)
		}
	}
	// The console's pages stay HTML: an unknown console path is not the
	// API's.
	resp, err := http.Get(b.url + "/console/no-such-page")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); strings.HasPrefix(ct, "application/json") {
		t.Errorf("an unknown console page answered %d %s", resp.StatusCode, ct)
	}
}
