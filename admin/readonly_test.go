package admin_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ledgerline/outbox/admin"
	"github.com/ledgerline/outbox/engine"
	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/pending"
	"github.com/ledgerline/outbox/rails"
)

// TestReadinessOnAStandby: a relayer whose connections reach a standby
// (PgBouncer's host names the old primary, which came back as a standby
// after a failover; a URL without target_session_attrs=read-write) has
// every claim refused as read-only, and is not ready. Behind a
// transaction pooler it polls only, so no LISTEN failure says so either:
// before the fix /readyz answered ready (the database answers, the schema
// is there) while the relayer could claim nothing.
func TestReadinessOnAStandby(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	primary, pool := testdb.OwnCluster(t)
	if _, err := pending.Enqueue(ctx, pool, pending.Instruction{InstructionID: "i-1", ParticipantID: "p-1",
		IdempotencyKey: "k-1", RailType: "sandbox", AmountMinor: 100, Currency: "USD", Destination: "acct-1"}); err != nil {
		t.Fatal(err)
	}
	replica := startStandby(t, primary)
	set, err := rails.NewSet(rails.Options{Type: "sandbox", Profile: payment.Generic{}, Transport: rails.NewSandbox(rails.SandboxOptions{})})
	if err != nil {
		t.Fatal(err)
	}
	r, err := engine.New(replica, engine.Config{Rails: set, PollInterval: 50 * time.Millisecond, PollOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Stop(context.Background()) })
	srv, err := admin.New(admin.Config{Pool: replica, Relayer: r})
	if err != nil {
		t.Fatal(err)
	}
	var rd admin.Readiness
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if rd = srv.Readiness(ctx); rd.Status == "not_ready" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("readiness of a relayer on a standby: %+v, want not_ready", rd)
		}
	}
	for _, c := range rd.Checks {
		if c.Name == "relayer" && !c.OK && strings.Contains(c.Cause, "read-only") {
			return
		}
	}
	t.Fatalf("readiness %+v: want the relayer check failed, saying its database is read-only", rd)
}
