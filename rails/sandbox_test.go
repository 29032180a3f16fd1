package rails_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"

	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/rails"
)

// sandboxCodes sends one attempt for each key and returns the answer codes;
// concurrent sends run in parallel in reverse order.
func sandboxCodes(t *testing.T, opts rails.SandboxOptions, keys []string, concurrent bool) map[string]string {
	t.Helper()
	sbx := rails.NewSandbox(opts)
	var mu sync.Mutex
	codes := make(map[string]string, len(keys))
	send := func(key string) {
		res, err := sbx.Send(context.Background(), sandboxIns("r", key))
		if err != nil {
			t.Error(err)
		}
		mu.Lock()
		codes[key] = res.Code
		mu.Unlock()
	}
	if !concurrent {
		for _, k := range keys {
			send(k)
		}
		return codes
	}
	var wg sync.WaitGroup
	for i := len(keys) - 1; i >= 0; i-- {
		wg.Go(func() { send(keys[i]) })
	}
	wg.Wait()
	return codes
}

func TestSandboxDeterministic(t *testing.T) {
	t.Parallel()
	keys := make([]string, 200)
	for i := range keys {
		keys[i] = fmt.Sprintf("key-%03d", i)
	}
	opts := rails.SandboxOptions{Seed: 42, RetryableRate: 0.3, TerminalRate: 0.3}
	first := sandboxCodes(t, opts, keys, false)
	again := sandboxCodes(t, opts, keys, true)
	if !maps.Equal(first, again) {
		t.Fatal("same seed, different call order: different answers")
	}
	seen := map[string]int{}
	for _, c := range first {
		seen[c]++
	}
	for _, c := range []string{rails.SandboxAccepted, rails.SandboxRejected, rails.SandboxUnavailable} {
		if seen[c] == 0 {
			t.Fatalf("no %s among %v: the rates are not exercised", c, seen)
		}
	}
	opts.Seed = 43
	if maps.Equal(first, sandboxCodes(t, opts, keys, false)) {
		t.Fatal("a different seed gave the same answers")
	}
}

func TestSandboxReplay(t *testing.T) {
	t.Parallel()
	sbx := rails.NewSandbox(rails.SandboxOptions{})
	ins := sandboxIns("r", "k1")
	first, err := sbx.Send(context.Background(), ins)
	if err != nil || first.Code != rails.SandboxAccepted || first.Reference == "" {
		t.Fatalf("first: %+v, %v", first, err)
	}
	ins.AttemptNo = 2
	again, err := sbx.Send(context.Background(), ins)
	if err != nil || again.Code != rails.SandboxDuplicate || again.Reference != first.Reference {
		t.Fatalf("replay: %+v, %v (first reference %q)", again, err, first.Reference)
	}
	if st := sbx.Stats(); st.Calls != 2 || st.Payments != 1 || st.Replays != 1 || st.EffectiveDuplicates != 0 {
		t.Fatalf("stats %+v", st)
	}
	if !sbx.Paid("", "k1") || sbx.Paid("", "k2") {
		t.Fatal("Paid disagrees with the ledger")
	}
}

func TestSandboxEffectiveDuplicates(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		edit func(*payment.Instruction)
	}{
		// The producer re-enqueued the same outbox row under a new key:
		// a real rail would pay it twice.
		{"same outbox id, new key", func(i *payment.Instruction) { i.IdempotencyKey = "k2" }},
		// A key was reused for a different payment.
		{"same key, new amount", func(i *payment.Instruction) { i.Payment.AmountMinor++ }},
		{"same key, new outbox id", func(i *payment.Instruction) { i.OutboxID = uuid.NewV5(uuid.NamespaceOID, "other") }},
		// The metadata is part of what was asked (an event's body, a
		// payment's memo): a receiver that fingerprints payloads refuses
		// it changed under a known key, one that does not drops it.
		{"same key, new metadata", func(i *payment.Instruction) { i.Metadata = json.RawMessage(`{"memo": "other"}`) }},
		{"same key, metadata added", func(i *payment.Instruction) { i.Metadata = json.RawMessage(`{"memo": "rent"}`) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			sbx := rails.NewSandbox(rails.SandboxOptions{})
			ins := sandboxIns("r", "k1")
			if tc.name != "same key, metadata added" {
				ins.Metadata = json.RawMessage(`{"memo": "rent"}`)
			}
			sbx.Pay(ins, false)
			again := ins
			p := *ins.Payment
			again.Payment = &p
			tc.edit(&again)
			sbx.Pay(again, false)
			if n := sbx.Stats().EffectiveDuplicates; n != 1 {
				t.Fatalf("EffectiveDuplicates = %d, want 1", n)
			}
		})
	}
}

// TestSandboxReplayWithSameMetadata: a retry sends the stored metadata
// again, byte for byte: a replay, not a duplicate.
func TestSandboxReplayWithSameMetadata(t *testing.T) {
	t.Parallel()
	sbx := rails.NewSandbox(rails.SandboxOptions{})
	for _, meta := range []string{`{"memo": "rent"}`, ""} {
		ins := sandboxIns("r", "k-"+meta)
		ins.Metadata = json.RawMessage(meta)
		sbx.Pay(ins, false)
		again := ins
		again.Metadata = json.RawMessage(meta) // another slice, the same bytes
		if res := sbx.Pay(again, false); res.Code != rails.SandboxDuplicate {
			t.Fatalf("replay answered %+v", res)
		}
	}
	if st := sbx.Stats(); st.EffectiveDuplicates != 0 || st.Replays != 2 {
		t.Fatalf("stats %+v, want 2 replays and no effective duplicate", st)
	}
}

func TestSandboxRejectionSticks(t *testing.T) {
	t.Parallel()
	sbx := rails.NewSandbox(rails.SandboxOptions{})
	ins := sandboxIns("r", "k1")
	if res := sbx.Pay(ins, true); res.Code != rails.SandboxRejected {
		t.Fatalf("got %+v", res)
	}
	if res := sbx.Pay(ins, false); res.Code != rails.SandboxRejected || sbx.Paid("", "k1") {
		t.Fatalf("a rejected key was paid later: %+v", res)
	}
}

func TestSandboxTimeoutPaysThenRetryIsDuplicate(t *testing.T) {
	t.Parallel()
	sbx := rails.NewSandbox(rails.SandboxOptions{TimeoutRate: 1})
	ins := sandboxIns("r", "k1")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := sbx.Send(ctx, ins); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want the context's deadline", err)
	}
	if !sbx.Paid("", "k1") {
		t.Fatal("a timeout-rate call must pay before going silent")
	}
	ins.AttemptNo = 2
	res, err := sbx.Send(context.Background(), ins)
	if err != nil || res.Code != rails.SandboxDuplicate || res.Reference == "" {
		t.Fatalf("retry: %+v, %v", res, err)
	}
	if st := sbx.Stats(); st.Timeouts != 1 || st.Payments != 1 || st.Replays != 1 || st.EffectiveDuplicates != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestSandboxDown(t *testing.T) {
	t.Parallel()
	sbx := rails.NewSandbox(rails.SandboxOptions{})
	sbx.SetDown(rails.ErrUnavailable)
	_, err := sbx.Send(context.Background(), sandboxIns("r", "k1"))
	if d := sbx.Codes().Decide(rails.Result{}, err); d.ErrorCode != rails.CodeRailUnavailable || d.RailCalled {
		t.Fatalf("down: %+v", d)
	}
	if sbx.Paid("", "k1") {
		t.Fatal("a down rail paid")
	}
	sbx.SetDown(nil)
	if res, err := sbx.Send(context.Background(), sandboxIns("r", "k1")); err != nil || res.Code != rails.SandboxAccepted {
		t.Fatalf("back up: %+v, %v", res, err)
	}
}

// TestSandboxTenantScopedKeys: idempotency keys are unique per tenant, so
// two tenants using the same key are two payments.
func TestSandboxTenantScopedKeys(t *testing.T) {
	t.Parallel()
	sbx := rails.NewSandbox(rails.SandboxOptions{})
	for _, tenant := range []string{"t1", "t2"} {
		ins := sandboxIns("r", "k1")
		ins.TenantID = tenant
		ins.OutboxID = uuid.NewV5(uuid.NamespaceOID, tenant)
		if res := sbx.Pay(ins, false); res.Code != rails.SandboxAccepted {
			t.Fatalf("%s: %+v", tenant, res)
		}
	}
	if !sbx.Paid("t1", "k1") || !sbx.Paid("t2", "k1") || sbx.Paid("", "k1") {
		t.Fatal("Paid does not scope keys by tenant")
	}
	if st := sbx.Stats(); st.Payments != 2 || st.EffectiveDuplicates != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestSandboxNoOutboxIDIsNoDuplicate: instructions sent without an outbox
// id (outside a relayer) all have uuid.Nil; two different keys are two
// different payments, not one outbox row paid twice.
func TestSandboxNoOutboxIDIsNoDuplicate(t *testing.T) {
	t.Parallel()
	sbx := rails.NewSandbox(rails.SandboxOptions{})
	for _, key := range []string{"k1", "k2", "k3"} {
		ins := sandboxIns("r", key)
		ins.OutboxID = uuid.Nil
		if res := sbx.Pay(ins, false); res.Code != rails.SandboxAccepted {
			t.Fatalf("%s: %+v", key, res)
		}
	}
	// A replay of one of them is still recognised by its key.
	again := sandboxIns("r", "k2")
	again.OutboxID = uuid.Nil
	if res := sbx.Pay(again, false); res.Code != rails.SandboxDuplicate {
		t.Fatalf("replay: %+v", res)
	}
	if st := sbx.Stats(); st.Payments != 3 || st.Replays != 1 || st.EffectiveDuplicates != 0 {
		t.Fatalf("stats %+v, want 3 payments, 1 replay, 0 effective duplicates", st)
	}
}

// TestSandboxRememberBoundsItsLedger: with Remember, the sandbox answers
// replays of its recent payments only, as a rail whose idempotency store
// expires does: always the last Remember, never more than twice as many.
func TestSandboxRememberBoundsItsLedger(t *testing.T) {
	t.Parallel()
	const remember, paid = 3, 20
	sbx := rails.NewSandbox(rails.SandboxOptions{Remember: remember})
	for i := range paid {
		if res, err := sbx.Send(context.Background(), sandboxIns("r", fmt.Sprintf("k%d", i))); err != nil || res.Code != rails.SandboxAccepted {
			t.Fatalf("k%d: %+v, %v", i, res, err)
		}
		known := 0
		for j := range i + 1 {
			if sbx.Paid("", fmt.Sprintf("k%d", j)) {
				known++
			} else if j > i-remember {
				t.Fatalf("after k%d: k%d, one of the last %d, is forgotten", i, j, remember)
			}
		}
		if known > 2*remember {
			t.Fatalf("after k%d: %d payments remembered, want at most %d", i, known, 2*remember)
		}
	}
	if sbx.Paid("", "k0") {
		t.Error("k0 still remembered after 20 payments")
	}
	res, err := sbx.Send(context.Background(), sandboxIns("r", fmt.Sprintf("k%d", paid-1)))
	if err != nil || res.Code != rails.SandboxDuplicate {
		t.Fatalf("replay of a remembered key: %+v, %v", res, err)
	}
	if st := sbx.Stats(); st.Payments != paid || st.Replays != 1 || st.EffectiveDuplicates != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestSandboxRememberBoundsItsRejections: with Remember, the keys the
// sandbox refused for good are bounded like its payments: the last
// Remember are still refused, and the oldest forgotten (a call under it
// then pays). They used to be kept for good, whatever Remember said.
func TestSandboxRememberBoundsItsRejections(t *testing.T) {
	t.Parallel()
	const remember, refused = 3, 20
	sbx := rails.NewSandbox(rails.SandboxOptions{Remember: remember})
	for i := range refused {
		if res := sbx.Pay(sandboxIns("r", fmt.Sprintf("k%d", i)), true); res.Code != rails.SandboxRejected {
			t.Fatalf("k%d: %+v, want refused", i, res)
		}
	}
	for i := refused - remember; i < refused; i++ {
		if res := sbx.Pay(sandboxIns("r", fmt.Sprintf("k%d", i)), false); res.Code != rails.SandboxRejected {
			t.Errorf("k%d, one of the last %d refused: %+v, want refused again", i, remember, res)
		}
	}
	if res := sbx.Pay(sandboxIns("r", "k0"), false); res.Code != rails.SandboxAccepted {
		t.Errorf("k0, refused %d keys ago: %+v, want it forgotten (paid)", refused, res)
	}
	if err := (rails.SandboxOptions{Remember: -1}).Check(nil); err == nil || !strings.Contains(err.Error(), "remember") {
		t.Errorf("a negative remember: %v, want it refused", err)
	}
	if got := rails.DefaultConfig().Transports["sandbox"].Sandbox.Remember; got != rails.DefaultSandboxRemember {
		t.Errorf("the default configuration's sandbox remembers %d, want %d", got, rails.DefaultSandboxRemember)
	}
}
