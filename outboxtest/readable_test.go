package outboxtest_test

import (
	"strings"
	"testing"

	"github.com/ledgerline/outbox/outboxtest"
	"github.com/ledgerline/outbox/pending"
)

// TestRequireEnqueuedSaysWhatItFound: a RequireEnqueued that finds no
// match shows the pending instructions its narrowing fields (instruction
// id, key, participant, rail) did find, and how each differs from the
// Want. It said "found 0" alone, so a test whose code enqueued 1251 cents
// instead of 1250 said nothing of the 1251.
func TestRequireEnqueuedSaysWhatItFound(t *testing.T) {
	t.Parallel()
	ctx, tx := beginTx(t)
	if _, err := pending.Enqueue(ctx, tx, payout("k1", "m1", 1250)); err != nil {
		t.Fatal(err)
	}
	msg := fails(func(tb testing.TB) {
		outboxtest.RequireEnqueued(ctx, tb, tx, outboxtest.Want{IdempotencyKey: "k1", AmountMinor: 1251, Currency: "USD"})
	})
	for _, want := range []string{"found 0", `instruction_id="payout-k1"`, "sequence 1", "amount_minor 1250, want 1251"} {
		if !strings.Contains(msg, want) {
			t.Errorf("failure %q: want it to contain %q", msg, want)
		}
	}
	if strings.Contains(msg, `currency "USD", want`) {
		t.Errorf("failure %q names a field that matches", msg)
	}
	// Nothing narrows the search to the instruction: it is still shown,
	// as the only one pending.
	msg = fails(func(tb testing.TB) {
		outboxtest.RequireEnqueued(ctx, tb, tx, outboxtest.Want{Destination: "acct-k2"})
	})
	if !strings.Contains(msg, `destination "acct-k1", want "acct-k2"`) {
		t.Errorf("failure %q: want it to show the pending instruction's destination", msg)
	}
	// Nothing pending at all says so.
	msg = fails(func(tb testing.TB) {
		outboxtest.RequireEnqueued(ctx, tb, tx, outboxtest.Want{ParticipantID: "m2"})
	})
	if !strings.Contains(msg, "none is pending") {
		t.Errorf("failure %q: want it to say none is pending", msg)
	}
}
