package engine

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/pending"
	"github.com/ledgerline/outbox/rails"
)

// slowProfile is the generic profile with a validation that takes its
// time (a lookup of the destination, say): the time between a probe's
// claim and its call.
type slowProfile struct{ payment.Generic }

func (p slowProfile) Validate(ins payment.Instruction) error {
	time.Sleep(20 * time.Millisecond)
	return p.Generic.Validate(ins)
}

// recoveringRail refuses calls while down and otherwise accepts them
// after a moment.
type recoveringRail struct {
	down  atomic.Bool
	calls atomic.Int64
}

func (r *recoveringRail) Send(ctx context.Context, _ payment.Instruction) (rails.Result, error) {
	r.calls.Add(1)
	if r.down.Load() {
		return rails.Result{}, rails.ErrUnavailable
	}
	select {
	case <-time.After(50 * time.Millisecond):
		return rails.Result{Code: "OK"}, nil
	case <-ctx.Done():
		return rails.Result{}, ctx.Err()
	}
}

// TestHalfOpenRailGetsOneProbe: a relayer draining a backlog of one rail
// while another rail's breaker is half-open claims one instruction of the
// half-open rail, its probe, and no more until the probe's answer. The
// probe counted as in flight only once its call began, so each claim of
// the drain made between the probe's claim and its call (its validation,
// its wait for a rail slot) claimed another "probe", which the breaker
// refused: a DISPATCHING and a CIRCUIT_OPEN row in the archive for an
// instruction that was never sent, at a time the breaker was not open,
// and a claim (with ordering, its participant's head held back a second)
// for nothing.
func TestHalfOpenRailGetsOneProbe(t *testing.T) {
	t.Parallel()
	b := setup(t, rails.SandboxOptions{LatencyMin: time.Millisecond, LatencyMax: 3 * time.Millisecond})
	psp := &recoveringRail{}
	set, err := rails.NewSet(
		rails.Options{Type: "sandbox", Profile: payment.Generic{}, Transport: b.sandbox, Timeout: 2 * time.Second,
			Breaker: rails.BreakerOptions{Disabled: true}},
		rails.Options{Type: "psp", Profile: slowProfile{}, Transport: psp, Timeout: 2 * time.Second,
			Codes:   rails.CodeTable{"OK": {Outcome: rails.Dispatched}},
			Breaker: rails.BreakerOptions{ConsecutiveFailures: 1, OpenFor: 200 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	// The rail went down: its breaker opens.
	psp.down.Store(true)
	if d := set.Execute(b.ctx, payment.Instruction{InstructionID: "x", ParticipantID: "x", IdempotencyKey: "x", RailType: "psp",
		Payment: &payment.Payment{AmountMinor: 1, Currency: "USD", Destination: "acct-x"}}); d.ErrorCode != rails.CodeRailUnavailable {
		t.Fatalf("opening call: %+v", d)
	}
	psp.down.Store(false)

	producer, err := pending.NewProducer(pending.Config{Rails: set.Catalog()})
	if err != nil {
		t.Fatal(err)
	}
	var batch []pending.Instruction
	for i := range 20 {
		ins := instruction(fmt.Sprintf("psp-%02d", i), 0)
		ins.RailType = "psp"
		batch = append(batch, ins)
	}
	if err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		_, err := producer.EnqueueBatch(b.ctx, tx, batch)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	b.enqueue(t, 3000, 300) // the backlog the relayer drains meanwhile

	cfg := b.config("probe")
	cfg.Rails, cfg.BatchSize, cfg.MaxConcurrency = set, 8, 16
	b.start(t, cfg)
	b.waitDrained(t, 2*time.Minute)
	var refused, dispatched int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FILTER (WHERE error_code = 'CIRCUIT_OPEN'), count(*) FILTER (WHERE state = 'DISPATCHED')
		FROM outbox.attempts WHERE rail_type = 'psp'`).Scan(&refused, &dispatched); err != nil {
		t.Fatal(err)
	}
	if dispatched != 20 {
		t.Fatalf("%d of 20 instructions of the recovered rail dispatched", dispatched)
	}
	if refused != 0 {
		t.Fatalf("%d instructions of the half-open rail were claimed beside its probe and refused as CIRCUIT_OPEN", refused)
	}
}

// TestRelayOnceClaimsOneProbeOfAHalfOpenRail: a pass (outboxtest's, a
// tool's) made while a rail's breaker is half-open claims one of its
// instructions, the probe, as a running relayer does. It claimed a whole
// batch: with the probe failing, the breaker opened again and refused the
// rest of the batch, each an attempt and a CIRCUIT_OPEN row in the
// archive for a payment that was never sent.
func TestRelayOnceClaimsOneProbeOfAHalfOpenRail(t *testing.T) {
	t.Parallel()
	b := setup(t, rails.SandboxOptions{})
	psp := &recoveringRail{}
	set, err := rails.NewSet(rails.Options{Type: "psp", Profile: payment.Generic{}, Transport: psp, Timeout: 2 * time.Second,
		Codes:   rails.CodeTable{"OK": {Outcome: rails.Dispatched}},
		Breaker: rails.BreakerOptions{ConsecutiveFailures: 1, OpenFor: 50 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	psp.down.Store(true) // and stays down: the probe fails
	if d := set.Execute(b.ctx, payment.Instruction{InstructionID: "x", ParticipantID: "x", IdempotencyKey: "x", RailType: "psp",
		Payment: &payment.Payment{AmountMinor: 1, Currency: "USD", Destination: "acct-x"}}); d.ErrorCode != rails.CodeRailUnavailable {
		t.Fatalf("opening call: %+v", d)
	}
	producer, err := pending.NewProducer(pending.Config{Rails: set.Catalog()})
	if err != nil {
		t.Fatal(err)
	}
	var batch []pending.Instruction
	for i := range 5 {
		ins := instruction(fmt.Sprintf("psp-%02d", i), 0)
		ins.RailType = "psp"
		batch = append(batch, ins)
	}
	if err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		_, err := producer.EnqueueBatch(b.ctx, tx, batch)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // past OpenFor: half-open
	if _, halfOpen := set.Claimable(); len(halfOpen) != 1 {
		t.Fatalf("the breaker is not half-open: %v", halfOpen)
	}
	cfg := b.config("once")
	cfg.Rails, cfg.BatchSize = set, 8
	r, err := New(b.pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	recorded, err := r.RelayOnce(b.ctx, b.pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(recorded) != 1 || psp.calls.Load() != 2 {
		t.Errorf("the pass recorded %d outcomes and called the rail %d times after the opening call; want its one probe", len(recorded), psp.calls.Load()-1)
	}
	var refused int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox.attempts WHERE error_code = 'CIRCUIT_OPEN'`).Scan(&refused); err != nil {
		t.Fatal(err)
	}
	if refused != 0 {
		t.Errorf("%d instructions claimed beside the probe and refused as CIRCUIT_OPEN", refused)
	}
}
