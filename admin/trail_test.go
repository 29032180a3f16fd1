package admin_test

import (
	"strings"
	"testing"
	"time"

	"github.com/ledgerline/outbox/admin"
	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/pending"
)

// TestTrailByInstructionIDSaysWhichInstruction: a producer's instruction
// id enqueued under two idempotency keys is two instructions (two outbox
// ids, two payments). The console's trail by instruction id lists both
// trails in one timeline, so each event must say which outbox id it is
// of: otherwise one's DISPATCHED reads as the other's outcome, and two
// payments as one.
func TestTrailByInstructionIDSaysWhichInstruction(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	enqueue := func(key string) string {
		t.Helper()
		r, err := b.producer.Enqueue(b.ctx, b.pool, pending.Instruction{
			InstructionID: "payout-7", ParticipantID: "acme-" + key, IdempotencyKey: key,
			RailType: "sandbox", AmountMinor: 100, Currency: "USD", Destination: "acct-1",
		})
		if err != nil {
			t.Fatal(err)
		}
		return r.OutboxID.String()
	}
	failed := enqueue("k1")
	b.record(t, b.claim(t, "r1", time.Hour), store.Failed, "RAIL_REJECTED", 0)
	sent := enqueue("k2")
	b.record(t, b.claim(t, "r1", time.Hour), store.Dispatched, "", 0)
	page := consoleAt(t, b.url).get(t, "/console/trail?instruction_id=payout-7")
	timeline := page[strings.Index(page, `<ol class="timeline">`):]
	if !strings.Contains(timeline, failed) || !strings.Contains(timeline, sent) {
		t.Fatalf("the trail of an instruction id enqueued as %s and %s does not say which event is whose:\n%s", failed, sent, timeline)
	}
}
