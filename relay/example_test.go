package relay_test

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ledgerline/outbox/engine"
	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/pending"
	"github.com/ledgerline/outbox/rails"
	"github.com/ledgerline/outbox/relay"
)

// A program embeds the relay service (relayer, reaper, partition upkeep)
// and registers its metrics on the program's own Prometheus registry.
func ExampleService() {
	ctx := context.Background()
	pool := testdb.ForExample() // the program's own *pgxpool.Pool

	set, err := rails.NewSet(rails.Options{Type: "sandbox", Profile: payment.Generic{},
		Transport: rails.NewSandbox(rails.SandboxOptions{}), Timeout: 5 * time.Second})
	if err != nil {
		panic(err)
	}
	registry := prometheus.NewRegistry()
	svc, err := relay.New(pool, relay.Config{
		Relayer: engine.Config{Rails: set},
		Metrics: registry,
	})
	if err != nil {
		panic(err)
	}
	if err := svc.Start(ctx); err != nil {
		panic(err)
	}
	if _, err := pending.Enqueue(ctx, pool, pending.Instruction{
		InstructionID: "payout-1", ParticipantID: "merchant-7", IdempotencyKey: "payout-1",
		RailType: "sandbox", AmountMinor: 1250, Currency: "USD", Destination: "acct-42",
	}); err != nil {
		panic(err)
	}
	for deadline := time.Now().Add(30 * time.Second); svc.Relayer().Stats().Dispatched == 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := svc.Stop(stopCtx); err != nil {
		panic(err)
	}

	families, err := registry.Gather()
	if err != nil {
		panic(err)
	}
	for _, f := range families {
		if f.GetName() == "outbox_attempts_total" {
			for _, m := range f.GetMetric() {
				if l := m.GetLabel()[0]; l.GetValue() == "DISPATCHED" {
					fmt.Println("outbox_attempts_total{state=\"DISPATCHED\"}", m.GetCounter().GetValue())
				}
			}
		}
	}
	fmt.Println("heal bound within 2 minutes:", relay.Config{Relayer: engine.Config{Rails: set}}.HealBound() <= 2*time.Minute)
	// Output:
	// outbox_attempts_total{state="DISPATCHED"} 1
	// heal bound within 2 minutes: true
}

// Run is the whole life of the service in one call: it starts it, runs
// until ctx is cancelled (in a program, by signal.NotifyContext on SIGTERM)
// and stops it gracefully, giving dispatches in progress the relayer's
// StopTimeout. Here ctx is cancelled once the first outcome is recorded.
func ExampleService_Run() {
	pool := testdb.ForExample() // the program's own *pgxpool.Pool
	set, err := rails.NewSet(rails.Options{Type: "sandbox", Profile: payment.Generic{},
		Transport: rails.NewSandbox(rails.SandboxOptions{}), Timeout: 5 * time.Second})
	if err != nil {
		panic(err)
	}
	if _, err := pending.Enqueue(context.Background(), pool, pending.Instruction{
		InstructionID: "payout-1", ParticipantID: "merchant-7", IdempotencyKey: "payout-1",
		RailType: "sandbox", AmountMinor: 1250, Currency: "USD", Destination: "acct-42",
	}); err != nil {
		panic(err)
	}

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	svc, err := relay.New(pool, relay.Config{Relayer: engine.Config{
		Rails:       set,
		StopTimeout: 10 * time.Second,
		// OnRecorded sees each batch of outcomes once it is committed.
		OnRecorded: func(recs []engine.Recorded) {
			for _, r := range recs {
				fmt.Println(r.InstructionID, r.Result())
			}
			stop()
		},
	}})
	if err != nil {
		panic(err)
	}
	if err := svc.Run(ctx); err != nil {
		panic(err)
	}
	fmt.Println("stopped; running:", svc.Relayer().Health().Running)
	// Output:
	// payout-1 dispatched
	// stopped; running: false
}
