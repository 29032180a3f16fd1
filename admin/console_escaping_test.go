package admin_test

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"

	"github.com/ledgerline/outbox/admin"
	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/pending"
)

// TestConsoleEscapesWhatOthersWrote: what the console shows was written
// by producers (participant, instruction and tenant ids, idempotency
// keys), rails (error codes, messages, references) and operators
// (reasons): markup in any of it is shown as text on every page that
// shows it, never run, and an id in a link stays inside its query.
func TestConsoleEscapesWhatOthersWrote(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	const (
		participant = `p"><img src=x onerror=alert(1)>`
		instruction = `i</td><script>alert(2)</script>`
		message     = `<script>alert(3)</script> declined`
		reference   = `ref"><svg onload=alert(4)>`
		reason      = `"><script>alert(5)</script>`
		rail        = `<b onmouseover=alert(6)>`
	)
	if _, err := b.producer.Enqueue(b.ctx, b.pool, pending.Instruction{
		InstructionID: instruction, ParticipantID: participant, IdempotencyKey: `k<i>1`,
		RailType: "sandbox", AmountMinor: 100, Currency: "USD", Destination: "acct-1",
	}); err != nil {
		t.Fatal(err)
	}
	c := b.claim(t, "r1", time.Hour)
	id := uuid.Must(uuid.NewV7())
	if _, _, err := b.st.Record(b.ctx, b.pool, []store.Outcome{{Identity: c.Identity, AttemptID: id, ClaimAttemptID: c.AttemptID,
		AttemptNo: c.AttemptNo, RelayerID: "r1", ClaimedAt: c.ClaimedAt, State: store.Failed, ErrorCode: "RAIL_REJECTED",
		ErrorMessage: message, RailReference: reference, CountAttempt: true}}, store.HandoffParams{}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.producer.Enqueue(b.ctx, b.pool, pending.Instruction{
		InstructionID: instruction + "-2", ParticipantID: participant, IdempotencyKey: `k<i>2`,
		RailType: "sandbox", AmountMinor: 100, Currency: "USD", Destination: "acct-1",
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.st.PauseRail(b.ctx, b.pool, "sandbox", "oscar", reason); err != nil {
		t.Fatal(err)
	}
	operator := consoleAs(t, b.url, operatorSecret)
	q := url.QueryEscape(participant)
	pages := map[string]string{
		"overview":     operator.get(t, "/console/"),
		"rails":        operator.get(t, "/console/rails"),
		"instructions": operator.get(t, "/console/instructions?participant="+q),
		"participant":  operator.get(t, "/console/participant?id="+q),
		"dead letters": operator.get(t, "/console/dead-letters?participant="+q),
		"trail":        operator.get(t, "/console/trail?id="+c.OutboxID.String()),
		"trail by id":  operator.get(t, "/console/trail?instruction_id="+url.QueryEscape(instruction)),
		"a pause":      operator.post(t, "/console/rails/pause", url.Values{"rail": {rail}, "reason": {reason}}),
	}
	pages["an acknowledgement"] = operator.post(t, "/console/dead-letters/"+c.OutboxID.String()+"/acknowledge",
		url.Values{"reason": {reason}, "participant": {participant}, "failed": {"1"}})
	for name, page := range pages {
		for _, raw := range []string{"<img src=x", "<script>alert", "<svg onload", "<b onmouseover", "<i>", `href="javascript:`} {
			if strings.Contains(page, raw) {
				t.Errorf("the %s page shows %q unescaped:\n%s", name, raw, page)
			}
		}
	}
	for name, want := range map[string]string{
		"instructions": "&lt;script&gt;alert(2)&lt;/script&gt;",
		"dead letters": "&lt;script&gt;alert(3)&lt;/script&gt; declined",
		"trail":        "&lt;svg onload=alert(4)&gt;",
		"overview":     "&lt;script&gt;alert(5)&lt;/script&gt;",
	} {
		if !strings.Contains(pages[name], want) {
			t.Errorf("the %s page lacks %q as text:\n%s", name, want, pages[name])
		}
	}
	if !strings.Contains(pages["dead letters"], `href="/console/participant?id=p%22%3e%3cimg`) {
		t.Errorf("the participant's link does not keep its id inside the query:\n%s", pages["dead letters"])
	}
}

// TestReasonsWithControlCharactersAreRefused: an operator's reason is
// archived as the why of a replay, an acknowledgement, a cancel or a
// pause, and read on the console, in `outbox audit` and in logs. A bidi
// override (U+202E) in it reverses how the text after it reads (the rest
// of an audit line in a terminal), a line break starts a new line; the
// ids a producer gives are refused such characters, and the reasons were
// archived with them. An action whose reason has one is refused, with
// the character named, and nothing is done, in the API and on the console.
func TestReasonsWithControlCharactersAreRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	dead := b.enqueue(t, "p1", "k1")
	b.record(t, b.claim(t, "r1", time.Hour), store.Failed, "RAIL_REJECTED", 0)
	pendingID := b.enqueue(t, "p2", "k2")
	dl, err := b.st.DeadLetter(b.ctx, b.pool, dead)
	if err != nil || dl == nil {
		t.Fatalf("dead letter: %v %v", dl, err)
	}
	for _, reason := range []string{"refunded by hand \u202edesrever", "line one\nline two"} {
		var answer map[string]any
		for _, path := range []string{"/api/v1/dead-letters/" + dead.String() + "/replay", "/api/v1/instructions/" + pendingID.String() + "/cancel",
			"/api/v1/rails/sandbox/pause"} {
			if code := b.call(t, "POST", path, operatorSecret, map[string]string{"reason": reason}, &answer); code != http.StatusBadRequest ||
				!strings.Contains(fmt.Sprint(answer["error"]), "control or format character") {
				t.Errorf("POST %s with the reason %q: %d %v", path, reason, code, answer)
			}
		}
	}
	operator := consoleAs(t, b.url, operatorSecret)
	reason := "refunded by hand \u202edesrever"
	for path, form := range map[string]url.Values{
		"/console/dead-letters/" + dead.String() + "/acknowledge": {"reason": {reason}, "failed": {strconv.FormatInt(dl.FailedAt.UnixMicro(), 10)}},
		"/console/instructions/" + pendingID.String() + "/cancel": {"reason": {reason}},
		"/console/rails/pause": {"rail": {"sandbox"}, "reason": {reason}},
	} {
		if page := operator.post(t, path, form); !strings.Contains(page, "Nothing was done: the reason contains the control or format character U&#43;202E") {
			t.Errorf("POST %s with a reason holding U+202E:\n%s", path, page)
		}
	}
	var ov admin.Overview
	if code := b.call(t, "GET", "/api/v1/overview", auditorSecret, nil, &ov); code != http.StatusOK || ov.Queue.Pending != 1 ||
		ov.Queue.DeadLetters != 1 || len(ov.Queue.PausedRails) != 0 {
		t.Errorf("the queue after the refusals: %d %+v", code, ov.Queue)
	}
}
