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
// id is its tenant's: the same instruction id in two tenants is two
// instructions (two outbox ids, two payments). (Before migration 030 one
// tenant could also enqueue an instruction id under two keys; it is now
// refused.) The console's trail by instruction id lists both trails in one
// timeline, so each event must say which outbox id, and whose, it is of:
// otherwise one's DISPATCHED reads as the other's outcome, and two
// payments as one.
func TestTrailByInstructionIDSaysWhichInstruction(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	enqueue := func(tenant string) string {
		t.Helper()
		r, err := b.producer.Enqueue(b.ctx, b.pool, pending.Instruction{
			InstructionID: "payout-7", ParticipantID: "acme-" + tenant, IdempotencyKey: "payout-7", TenantID: tenant,
			RailType: "sandbox", AmountMinor: 100, Currency: "USD", Destination: "acct-1",
		})
		if err != nil {
			t.Fatal(err)
		}
		return r.OutboxID.String()
	}
	failed := enqueue("tenant-a")
	b.record(t, b.claim(t, "r1", time.Hour), store.Failed, "RAIL_REJECTED", 0)
	sent := enqueue("tenant-b")
	b.record(t, b.claim(t, "r1", time.Hour), store.Dispatched, "", 0)
	page := consoleAt(t, b.url).get(t, "/console/trail?instruction_id=payout-7")
	timeline := page[strings.Index(page, `<ol class="timeline">`):]
	if !strings.Contains(timeline, failed) || !strings.Contains(timeline, sent) ||
		!strings.Contains(timeline, "tenant tenant-a") || !strings.Contains(timeline, "tenant tenant-b") {
		t.Fatalf("the trail of an instruction id enqueued as %s (tenant-a) and %s (tenant-b) does not say which event is whose:\n%s", failed, sent, timeline)
	}
	if !strings.Contains(page, "2 instructions (outbox ids), of different tenants") {
		t.Fatalf("the trail does not warn that payout-7 is two instructions:\n%s", page)
	}
}
