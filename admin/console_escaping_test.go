package admin_test

import (
	"net/url"
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
