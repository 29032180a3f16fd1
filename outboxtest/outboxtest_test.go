package outboxtest_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerline/outbox/engine"
	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/outboxtest"
	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/pending"
	"github.com/ledgerline/outbox/rails"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// recordingT is a testing.TB that records failures instead of stopping,
// so the helpers' own failures can be tested.
type recordingT struct {
	testing.TB
	failed []string
}

func (r *recordingT) Helper() {}
func (r *recordingT) Fatalf(format string, args ...any) {
	r.failed = append(r.failed, fmt.Sprintf(format, args...))
	panic(r)
}

// fails reports the failure message f raised through t, or "".
func fails(f func(t testing.TB)) (msg string) {
	rt := &recordingT{}
	defer func() {
		if p := recover(); p != nil {
			if p != rt {
				panic(p)
			}
			msg = rt.failed[0]
		}
	}()
	f(rt)
	return ""
}

func payout(key, participant string, amount int64) pending.Instruction {
	return pending.Instruction{InstructionID: "payout-" + key, ParticipantID: participant, IdempotencyKey: key,
		RailType: "sandbox", AmountMinor: amount, Currency: "USD", Destination: "acct-" + key}
}

// beginTx opens a transaction on a fresh test database, rolled back when
// the test ends: what each test enqueues stays inside it.
func beginTx(t *testing.T) (context.Context, pgx.Tx) {
	ctx := t.Context()
	tx, err := testdb.New(t).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.WithoutCancel(ctx)) })
	return ctx, tx
}

// decliningRail is a rail that records the key of every instruction it is
// sent in *sent, declines an amount of 99 (a terminal failure) and
// accepts any other, referenced "ref-<key>".
func decliningRail(sent *[]string) (outboxtest.TransportFunc, rails.CodeTable) {
	transport := outboxtest.TransportFunc(func(_ context.Context, ins payment.Instruction) (rails.Result, error) {
		*sent = append(*sent, ins.IdempotencyKey)
		if ins.Payment.AmountMinor == 99 {
			return rails.Result{Code: "DECLINED"}, nil
		}
		return rails.Result{Code: "OK", Reference: "ref-" + ins.IdempotencyKey}, nil
	})
	return transport, rails.CodeTable{"OK": {Outcome: rails.Dispatched}, "DECLINED": {Outcome: rails.Failed, Error: rails.CodeRailRejected}}
}

func TestRequireEnqueuedInsideTheTransaction(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := testdb.New(t)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := pending.Enqueue(ctx, tx, payout("k1", "m1", 1250)); err != nil {
		t.Fatal(err)
	}
	if _, err := pending.Enqueue(ctx, tx, payout("k2", "m1", 99)); err != nil {
		t.Fatal(err)
	}

	got := outboxtest.RequireEnqueued(ctx, t, tx, outboxtest.Want{IdempotencyKey: "k1", AmountMinor: 1250, Currency: "USD"})
	if got.SequenceID != 1 || got.Destination != "acct-k1" {
		t.Fatalf("got %+v", got)
	}
	outboxtest.RequireNotEnqueued(ctx, t, tx, outboxtest.Want{IdempotencyKey: "k3"})
	// Uncommitted: invisible outside the transaction.
	outboxtest.RequireNotEnqueued(ctx, t, pool, outboxtest.Want{IdempotencyKey: "k1"})

	for _, tt := range []struct {
		name string
		f    func(t testing.TB)
		want string
	}{
		{"wrong amount", func(tb testing.TB) {
			outboxtest.RequireEnqueued(ctx, tb, tx, outboxtest.Want{IdempotencyKey: "k1", AmountMinor: 1251})
		}, "found 0"},
		{"two match", func(tb testing.TB) { outboxtest.RequireEnqueued(ctx, tb, tx, outboxtest.Want{ParticipantID: "m1"}) }, "found 2"},
		{"present", func(tb testing.TB) {
			outboxtest.RequireNotEnqueued(ctx, tb, tx, outboxtest.Want{IdempotencyKey: "k2"})
		}, "found 1"},
	} {
		if msg := fails(tt.f); !strings.Contains(msg, tt.want) {
			t.Errorf("%s: failure %q, want one containing %q", tt.name, msg, tt.want)
		}
	}
}

func TestRelayOnceKeepsOrderAndRecords(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := testdb.New(t)
	var sent []string
	transport, codes := decliningRail(&sent)
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, in := range []pending.Instruction{payout("a1", "m1", 10), payout("a2", "m1", 99), payout("b1", "m2", 30)} {
			if _, err := pending.Enqueue(ctx, tx, in); err != nil {
				return err
			}
		}
		first := outboxtest.RelayOnce(ctx, t, tx, outboxtest.Relay{Transport: transport, Codes: codes})
		if len(first) != 2 || first[0].Result() != "dispatched" || first[1].Result() != "dispatched" {
			t.Fatalf("first pass %+v: want m1's first and m2's first dispatched", first)
		}
		second := outboxtest.RelayOnce(ctx, t, tx, outboxtest.Relay{Transport: transport, Codes: codes})
		if len(second) != 1 || second[0].IdempotencyKey != "a2" || second[0].Result() != "dead" {
			t.Fatalf("second pass %+v: want a2 dead-lettered", second)
		}
		outboxtest.RequireNotEnqueued(ctx, t, tx, outboxtest.Want{})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(sent, ",") != "a1,b1,a2" && strings.Join(sent, ",") != "b1,a1,a2" {
		t.Fatalf("sent %v: want a2 after a1 (ordering)", sent)
	}
}

// TestDrainSendsEveryParticipantsInstructionsInOrder: Drain makes passes
// until nothing is due, so a participant's instructions, one per pass with
// ordering on, are all sent, in sequence order; a rejected one is a dead
// letter and does not hold up its successors' passes.
func TestDrainSendsEveryParticipantsInstructionsInOrder(t *testing.T) {
	t.Parallel()
	ctx, tx := beginTx(t)
	for _, in := range []pending.Instruction{payout("a1", "m1", 10), payout("b1", "m2", 20), payout("a2", "m1", 99),
		payout("a3", "m1", 30), payout("b2", "m2", 40)} {
		if _, err := pending.Enqueue(ctx, tx, in); err != nil {
			t.Fatal(err)
		}
	}
	var sent []string
	transport, codes := decliningRail(&sent)
	recorded := outboxtest.Drain(ctx, t, tx, outboxtest.Relay{Transport: transport, Codes: codes})

	results := map[string]engine.Result{}
	for _, r := range recorded {
		results[r.IdempotencyKey] = r.Result()
	}
	want := map[string]engine.Result{"a1": engine.ResultDispatched, "a2": engine.ResultDead, "a3": engine.ResultDispatched,
		"b1": engine.ResultDispatched, "b2": engine.ResultDispatched}
	if len(recorded) != len(want) || fmt.Sprint(results) != fmt.Sprint(want) {
		t.Fatalf("drained %v (%d outcomes), want %v", results, len(recorded), want)
	}
	var m1, m2 []string
	for _, k := range sent {
		if k[0] == 'a' {
			m1 = append(m1, k)
		} else {
			m2 = append(m2, k)
		}
	}
	if strings.Join(m1, ",") != "a1,a2,a3" || strings.Join(m2, ",") != "b1,b2" {
		t.Fatalf("sent %v: want each participant's in sequence order", sent)
	}
	outboxtest.RequireNotEnqueued(ctx, t, tx, outboxtest.Want{})
	if again := outboxtest.Drain(ctx, t, tx, outboxtest.Relay{Transport: transport, Codes: codes}); len(again) != 0 {
		t.Fatalf("a drained queue drained again: %+v", again)
	}
}

// TestAssertionsSeeEveryPendingInstruction: the assertions read every
// pending instruction that matches. They read the first 10,000 only, so
// with more than that queued RequireNotEnqueued passed although the
// instruction was there, and RequireEnqueued said it was missing.
func TestAssertionsSeeEveryPendingInstruction(t *testing.T) {
	t.Parallel()
	ctx, tx := beginTx(t)
	const n = 10_001
	for start := 0; start < n; start += 1000 {
		var batch []pending.Instruction
		for i := start; i < min(start+1000, n); i++ {
			batch = append(batch, payout(fmt.Sprintf("k%05d", i), fmt.Sprintf("m%05d", i), 100))
		}
		if _, err := pending.EnqueueBatch(ctx, tx, batch); err != nil {
			t.Fatal(err)
		}
	}
	last := fmt.Sprintf("k%05d", n-1) // its participant sorts last
	if msg := fails(func(tb testing.TB) {
		outboxtest.RequireNotEnqueued(ctx, tb, tx, outboxtest.Want{IdempotencyKey: last})
	}); !strings.Contains(msg, "found 1") {
		t.Errorf("RequireNotEnqueued of the last of %d pending instructions: failure %q, want \"found 1\"", n, msg)
	}
	if msg := fails(func(tb testing.TB) {
		outboxtest.RequireEnqueued(ctx, tb, tx, outboxtest.Want{IdempotencyKey: last})
	}); msg != "" {
		t.Errorf("RequireEnqueued of the last of %d pending instructions: %s", n, msg)
	}
}

// TestEnqueuedMetadataIsJSONbsRendering pins what Enqueued's doc says of
// Metadata: the same JSON as given, but in jsonb's text, not the
// producer's or the canonical form, so a test compares it as JSON.
func TestEnqueuedMetadataIsJSONbsRendering(t *testing.T) {
	t.Parallel()
	ctx, tx := beginTx(t)
	in := payout("meta", "m1", 100)
	in.Metadata = []byte(`{"bb":1,"a":{"z":2,"y":[1,2]}}`)
	if _, err := pending.Enqueue(ctx, tx, in); err != nil {
		t.Fatal(err)
	}
	got := outboxtest.RequireEnqueued(ctx, t, tx, outboxtest.Want{IdempotencyKey: "meta"})
	if string(got.Metadata) != `{"a": {"y": [1, 2], "z": 2}, "bb": 1}` {
		t.Errorf("metadata %s: not jsonb's rendering", got.Metadata)
	}
	if !testdb.SameJSON(t, got.Metadata, in.Metadata) {
		t.Errorf("metadata %s: not the JSON enqueued, %s", got.Metadata, in.Metadata)
	}
}

// TestWantMetadataComparesJSON: Want.Metadata matches the same JSON value
// whatever its key order and spacing (what jsonb gives back is neither the
// producer's text nor canonical), and a different value does not match.
// For an event rail the metadata is the event: without it a test could
// not assert what was enqueued.
func TestWantMetadataComparesJSON(t *testing.T) {
	t.Parallel()
	ctx, tx := beginTx(t)
	event := pending.Instruction{InstructionID: "ev-1", ParticipantID: "order-9", IdempotencyKey: "ev-1", RailType: "event",
		Metadata: []byte(`{"type":"order.paid","order":{"id":"o-9","total_minor":1250}}`)}
	if _, err := pending.Enqueue(ctx, tx, event); err != nil {
		t.Fatal(err)
	}
	outboxtest.RequireEnqueued(ctx, t, tx, outboxtest.Want{RailType: "event",
		Metadata: []byte(`{ "order": {"total_minor": 1.25e3, "id": "o-9"}, "type": "order.paid" }`)})
	outboxtest.RequireNotEnqueued(ctx, t, tx, outboxtest.Want{RailType: "event",
		Metadata: []byte(`{"type":"order.paid","order":{"id":"o-9","total_minor":1251}}`)})
	if msg := fails(func(tb testing.TB) {
		outboxtest.RequireEnqueued(ctx, tb, tx, outboxtest.Want{Metadata: []byte(`{"type":`)})
	}); !strings.Contains(msg, "Want.Metadata") {
		t.Errorf("invalid Want.Metadata: failure %q, want one naming it", msg)
	}
}
