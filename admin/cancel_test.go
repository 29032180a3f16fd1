package admin_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/ledgerline/outbox/admin"
)

// TestCancelThroughAPIAndConsole: operators cancel a pending instruction
// through the API and the instructions page's form, auditors may not; an
// instruction in flight cannot be cancelled; the participant's next
// instruction becomes due.
func TestCancelThroughAPIAndConsole(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	first, second, third := b.enqueue(t, "acme", "k1"), b.enqueue(t, "acme", "k2"), b.enqueue(t, "acme", "k3")
	path := "/api/v1/instructions/" + first.String() + "/cancel"
	reason := map[string]string{"reason": "customer recalled it"}
	if code := b.call(t, "POST", path, operatorSecret, nil, nil); code != http.StatusBadRequest {
		t.Fatalf("cancel without a reason: %d", code)
	}
	if code := b.call(t, "POST", path, auditorSecret, reason, nil); code != http.StatusForbidden {
		t.Fatalf("cancel as auditor: %d", code)
	}
	var res admin.ActionResult
	if code := b.call(t, "POST", path, operatorSecret, reason, &res); code != 200 || !res.Done || res.By != "oscar" {
		t.Fatalf("cancel as operator: %d %+v", code, res)
	}
	if code := b.call(t, "POST", path, operatorSecret, reason, &res); code != http.StatusNotFound || res.Done || res.Note == "" {
		t.Fatalf("cancel again: %d %+v", code, res)
	}
	held := b.claim(t, "r-1", time.Hour) // the next one, due now
	if held.OutboxID != second {
		t.Fatalf("claimed %s after the cancel, want the next instruction %s", held.OutboxID, second)
	}
	if code := b.call(t, "POST", "/api/v1/instructions/"+second.String()+"/cancel", operatorSecret, reason, &res); code != http.StatusNotFound || res.Done {
		t.Fatalf("cancel of an instruction in flight: %d %+v", code, res)
	}

	auditor, operator := consoleAt(t, b.url), consoleAs(t, b.url, operatorSecret)
	if page := auditor.get(t, "/console/instructions"); !strings.Contains(page, third.String()) || strings.Contains(page, "/cancel") {
		t.Fatalf("the auditor's instructions page: the queued one, no cancel form:\n%s", page)
	}
	page := operator.get(t, "/console/instructions")
	if !strings.Contains(page, `action="/console/instructions/`+third.String()+`/cancel"`) {
		t.Fatalf("the operator's instructions page lacks the cancel form:\n%s", page)
	}
	if page := operator.get(t, "/console/instructions?state=in_flight"); strings.Contains(page, "/cancel") {
		t.Fatalf("an instruction in flight has a cancel form:\n%s", page)
	}
	page = operator.post(t, "/console/instructions/"+third.String()+"/cancel", url.Values{"reason": {""}})
	if !strings.Contains(page, "A reason is required") {
		t.Fatalf("a cancel without a reason:\n%s", page)
	}
	page = operator.post(t, "/console/instructions/"+third.String()+"/cancel", url.Values{"reason": {"duplicate of k2"}})
	if !strings.Contains(page, "Cancelled "+third.String()+" as oscar") || strings.Contains(page, `action="/console/instructions/`+third.String()) {
		t.Fatalf("after the console's cancel:\n%s", page)
	}
	if page := auditor.get(t, "/console/trail?id="+third.String()); !strings.Contains(page, "CANCELLED") || !strings.Contains(page, "cancelled by oscar: duplicate of k2") {
		t.Fatalf("the trail of the cancelled instruction:\n%s", page)
	}
	form := url.Values{"reason": {"x"}, "csrf": {"forged"}}
	resp, err := auditor.client.PostForm(b.url+"/console/instructions/"+second.String()+"/cancel", form)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("an auditor's cancel: %s", resp.Status)
	}
}
