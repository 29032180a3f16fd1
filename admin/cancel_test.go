package admin_test

import (
	"html"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"

	"github.com/ledgerline/outbox/admin"
	"github.com/ledgerline/outbox/internal/store"
)

// TestCancelThroughAPIAndConsole: operators cancel a pending instruction
// through the API and the instructions page's form, auditors may not; an
// instruction in flight cannot be cancelled (409, IN_FLIGHT); the participant's next
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
	if code := b.call(t, "POST", "/api/v1/instructions/"+second.String()+"/cancel", operatorSecret, reason, &res); code != http.StatusConflict ||
		res.Done || res.Error != admin.InFlight || !strings.Contains(res.Note, "in flight") {
		t.Fatalf("cancel of an instruction in flight: %d %+v (want 409, %s)", code, res, admin.InFlight)
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
	if !strings.Contains(page, "Cancelled "+third.String()+" (instruction ins-k3 of participant") || !strings.Contains(page, ") as oscar") || strings.Contains(page, `action="/console/instructions/`+third.String()) {
		t.Fatalf("after the console's cancel:\n%s", page)
	}
	if page := auditor.get(t, "/console/trail?id="+third.String()); !strings.Contains(page, "CANCELLED") || !strings.Contains(page, "cancelled by oscar (database role "+b.sessionRole(t)+"): duplicate of k2") {
		t.Fatalf("the trail of the cancelled instruction:\n%s", page)
	}
	// A form shown while the instruction was pending, sent after a relayer
	// claimed it.
	page = operator.post(t, "/console/instructions/"+second.String()+"/cancel", url.Values{"reason": {"too late"}})
	if !strings.Contains(page, "Not cancelled, nothing was done: this instruction is in flight") {
		t.Fatalf("the console's cancel of an instruction in flight:\n%s", page)
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

// sessionRole is the database role the bundle's pool logs in as, which
// the operators' functions archive beside the operator's name (migration
// 035).
func (b *bundle) sessionRole(t *testing.T) string {
	t.Helper()
	var role string
	if err := b.pool.QueryRow(b.ctx, `SELECT format('%I', session_user)`).Scan(&role); err != nil {
		t.Fatal(err)
	}
	return role
}

// cutOff claims the next due instruction and records its outcome as a
// relayer's stop records a call it cut off: RETRYABLE CUT_OFF_AT_STOP,
// outcome unknown, due again after delay. It returns when the window
// ends, as the archive has it.
func (b *bundle) cutOff(t *testing.T, delay time.Duration) (uuid.UUID, time.Time) {
	t.Helper()
	c := b.claim(t, "r1", time.Hour)
	id := uuid.Must(uuid.NewV7())
	if _, _, err := b.st.Record(b.ctx, b.pool, []store.Outcome{{Identity: c.Identity, AttemptID: id, ClaimAttemptID: c.AttemptID,
		AttemptNo: c.AttemptNo, RelayerID: "r1", ClaimedAt: c.ClaimedAt, State: store.Retryable, ErrorCode: "CUT_OFF_AT_STOP",
		OutcomeUnknown: true, RetryDelay: delay}}, store.HandoffParams{}); err != nil {
		t.Fatal(err)
	}
	var until time.Time
	if err := b.pool.QueryRow(b.ctx, `SELECT next_attempt_at FROM outbox.attempts WHERE attempt_id = $1`, id).Scan(&until); err != nil {
		t.Fatal(err)
	}
	return c.OutboxID, until
}

// TestCancelRefusedWhileTheRailMayStillAct: the API answers a cancel of an
// instruction whose rail call a relayer's stop cut off with 409, a JSON
// body saying RAIL_MAY_STILL_ACT and retry_after, and a Retry-After
// header; the console's form says in words that nothing was done and
// when to try again. The instruction stays pending, nothing archived.
func TestCancelRefusedWhileTheRailMayStillAct(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	b.enqueue(t, "acme", "k1")
	id, until := b.cutOff(t, time.Hour)
	reason := map[string]string{"reason": "customer recalled it"}

	req, err := http.NewRequest("POST", b.url+"/api/v1/instructions/"+id.String()+"/cancel", strings.NewReader(`{"reason": "customer recalled it"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+operatorSecret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if secs, err := strconv.Atoi(resp.Header.Get("Retry-After")); resp.StatusCode != http.StatusConflict || err != nil || secs < 3500 || secs > 3601 {
		t.Fatalf("cancel during the window: %s, Retry-After %q (want 409 and about an hour)", resp.Status, resp.Header.Get("Retry-After"))
	}
	var res admin.ActionResult
	if code := b.call(t, "POST", "/api/v1/instructions/"+id.String()+"/cancel", operatorSecret, reason, &res); code != http.StatusConflict ||
		res.Done || res.Error != admin.RailMayStillAct || res.RetryAfter == nil || !res.RetryAfter.Equal(until) || res.Note == "" {
		t.Fatalf("cancel during the window: %d %+v (want 409, %s until %s)", code, res, admin.RailMayStillAct, until)
	}

	operator := consoleAs(t, b.url, operatorSecret)
	page := html.UnescapeString(operator.post(t, "/console/instructions/"+id.String()+"/cancel", url.Values{"reason": {"duplicate"}}))
	if !strings.Contains(page, "Not cancelled, nothing was done") || !strings.Contains(page, "may still be acting") ||
		!strings.Contains(page, "Try the cancel again after "+until.UTC().Format("2006-01-02 15:04:05.000 UTC")) {
		t.Fatalf("the console's refusal does not say what and until when:\n%s", page)
	}
	var pending, cancelled int
	if err := b.pool.QueryRow(b.ctx, `SELECT (SELECT count(*) FROM outbox.pending WHERE outbox_id = $1),
		(SELECT count(*) FROM outbox.attempts WHERE outbox_id = $1 AND state = 'CANCELLED')`, id).Scan(&pending, &cancelled); err != nil ||
		pending != 1 || cancelled != 0 {
		t.Fatalf("after the refusals: %d pending, %d cancelled (%v), want 1 and 0", pending, cancelled, err)
	}
}

// TestReplayOfAnInstructionInFlight: a replay or an acknowledgement,
// through the API, of an instruction a relayer has claimed answers 409
// IN_FLIGHT, as a cancel does, and does nothing. It answered 404
// NOT_FOUND, as for an unknown id: an operator told so could think the
// instruction lost and send the payment another way while its rail call
// was under way.
func TestReplayOfAnInstructionInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	id := b.enqueue(t, "acme", "k1")
	if held := b.claim(t, "r-1", time.Hour); held.OutboxID != id {
		t.Fatalf("claimed %s, want %s", held.OutboxID, id)
	}
	for _, action := range []string{"replay", "acknowledge"} {
		var res admin.ActionResult
		if code := b.call(t, "POST", "/api/v1/dead-letters/"+id.String()+"/"+action, operatorSecret, map[string]string{"reason": "rail fixed"}, &res); code != http.StatusConflict ||
			res.Done || res.Error != admin.InFlight || !strings.Contains(res.Note, "in flight") {
			t.Fatalf("%s of an instruction in flight: %d %+v (want 409, %s)", action, code, res, admin.InFlight)
		}
	}
}

// TestConsoleReplayOfADeadLetterNowInFlight: a dead letter's form, shown
// before another operator replayed it and a relayer claimed it, says that
// it was replayed and is in flight now, and does nothing: the rail call
// may be under way.
func TestConsoleReplayOfADeadLetterNowInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	id := b.enqueue(t, "acme", "k1")
	b.record(t, b.claim(t, "r1", time.Hour), store.Failed, "RAIL_REJECTED", 0)
	op := consoleAs(t, b.url, operatorSecret)
	page := op.get(t, "/console/dead-letters")
	path := "/console/dead-letters/" + id.String() + "/replay"
	form := shownForm(t, page, path, "account fixed")
	if code := b.call(t, "POST", "/api/v1/dead-letters/"+id.String()+"/replay", operatorSecret, map[string]string{"reason": "first"}, nil); code != http.StatusOK {
		t.Fatalf("the other operator's replay: %d", code)
	}
	if held := b.claim(t, "r1", time.Hour); held.OutboxID != id {
		t.Fatalf("claimed %s, want %s", held.OutboxID, id)
	}
	page = op.postShown(t, path, form)
	if !strings.Contains(page, `<p class="error" role="alert">That dead letter was already replayed and is in flight now`) {
		t.Fatalf("the form of a dead letter replayed and claimed since it was shown:\n%s", page)
	}
}
