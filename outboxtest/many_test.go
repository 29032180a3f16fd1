package outboxtest_test

import (
	"strings"
	"testing"

	"github.com/ledgerline/outbox/outboxtest"
	"github.com/ledgerline/outbox/pending"
)

// TestRequireManyEnqueued: RequireManyEnqueued passes when a participant's
// pending instructions are exactly the Wants, in sequence order, and
// otherwise fails saying, line by line, what was expected and found: one
// missing, one too many, two in the wrong order, a field that differs.
// Another participant's instructions are not counted.
func TestRequireManyEnqueued(t *testing.T) {
	t.Parallel()
	ctx, tx := beginTx(t)
	for _, in := range []pending.Instruction{payout("k1", "m1", 500), payout("x1", "m2", 1), payout("k2", "m1", 700)} {
		if _, err := pending.Enqueue(ctx, tx, in); err != nil {
			t.Fatal(err)
		}
	}
	got := outboxtest.RequireManyEnqueued(ctx, t, tx, outboxtest.Participant{ParticipantID: "m1"},
		outboxtest.Want{IdempotencyKey: "k1", AmountMinor: 500}, outboxtest.Want{IdempotencyKey: "k2", AmountMinor: 700})
	if len(got) != 2 || got[0].SequenceID != 1 || got[1].SequenceID != 2 || got[1].Destination != "acct-k2" {
		t.Fatalf("got %+v", got)
	}
	outboxtest.RequireManyEnqueued(ctx, t, tx, outboxtest.Participant{ParticipantID: "m3"})

	for _, tt := range []struct {
		name  string
		wants []outboxtest.Want
		say   []string
	}{
		{"one missing", []outboxtest.Want{{IdempotencyKey: "k1"}, {IdempotencyKey: "k2"}, {IdempotencyKey: "k3"}},
			[]string{"want 3", "found 2", `#3: want {idempotency_key="k3"}, found nothing`}},
		{"one too many", []outboxtest.Want{{IdempotencyKey: "k1"}},
			[]string{"want 1", "found 2", `#2: want nothing, found outbox`, `idempotency_key="k2"`}},
		{"wrong order", []outboxtest.Want{{IdempotencyKey: "k2"}, {IdempotencyKey: "k1"}},
			[]string{`#1: idempotency_key "k1", want "k2"`, `#2: idempotency_key "k2", want "k1"`}},
		{"field differs", []outboxtest.Want{{IdempotencyKey: "k1"}, {IdempotencyKey: "k2", AmountMinor: 701}},
			[]string{"#2: amount_minor 700, want 701"}},
		{"nothing wanted", nil, []string{"want 0", "found 2"}},
		{"another participant", []outboxtest.Want{{IdempotencyKey: "k1", ParticipantID: "m2"}},
			[]string{`Want #1 names participant "m2"`}},
	} {
		msg := fails(func(tb testing.TB) {
			outboxtest.RequireManyEnqueued(ctx, tb, tx, outboxtest.Participant{ParticipantID: "m1"}, tt.wants...)
		})
		for _, s := range tt.say {
			if !strings.Contains(msg, s) {
				t.Errorf("%s: failure %q, want one containing %q", tt.name, msg, s)
			}
		}
	}
	if msg := fails(func(tb testing.TB) { outboxtest.RequireManyEnqueued(ctx, tb, tx, outboxtest.Participant{}) }); !strings.Contains(msg, "ParticipantID") {
		t.Errorf("no participant: failure %q, want one naming ParticipantID", msg)
	}
}
