package engine

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/rails"
)

// strictRails is the rail set of a newer build that validates more
// strictly than the one that enqueued: the sandbox rail now takes at
// least 101 minor units, so instruction(p, 0) (100) fails validation
// while instruction(p, 1) and later pass.
func strictRails(t *testing.T, tr rails.Transport) *rails.Set {
	t.Helper()
	set, err := rails.NewSet(rails.Options{Type: "sandbox", Profile: payment.Generic{Limits: payment.Limits{MinAmountMinor: 101}},
		Transport: tr, Codes: rails.SandboxCodes, Timeout: 2 * time.Second, Breaker: rails.BreakerOptions{Disabled: true}})
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// TestStricterValidationAfterUpgradeDeadLetters: an instruction enqueued
// by an older build that this build's validation refuses is neither sent
// nor retried nor left pending: it becomes a dead letter at once, with
// the terminal VALIDATION_FAILED naming the field, not counted as
// outcome unknown (the rail was not called), and its participant's
// later instructions go on. (docs/operations.md, "Upgrading".)
func TestStricterValidationAfterUpgradeDeadLetters(t *testing.T) {
	t.Parallel()
	b := setup(t, rails.SandboxOptions{})
	b.enqueue(t, 3, 1) // p000-0 (100), p000-1 (101), p000-2 (102), in that order
	b.rails = strictRails(t, b.sandbox)
	cfg := b.config("upgraded")
	cfg.MaxAttempts = 5
	b.start(t, cfg)
	b.waitDrained(t, 30*time.Second)

	rep := b.verify(t, true)
	if rep.Dispatched != 2 || rep.DeadLetters != 1 {
		t.Fatalf("report %+v, want 2 dispatched and 1 dead letter", rep)
	}
	var (
		id, code, msg string
		unknown       bool
	)
	if err := b.pool.QueryRow(b.ctx, `SELECT instruction_id, error_code, error_message, outcome_unknown FROM outbox.dead_letters`).
		Scan(&id, &code, &msg, &unknown); err != nil {
		t.Fatal(err)
	}
	if id != "p000-0" || code != string(rails.CodeValidationFailed) || unknown || !strings.Contains(msg, payment.FieldAmount) {
		t.Errorf("dead letter %s: %s %q outcome unknown %v; want p000-0, VALIDATION_FAILED naming %s, not unknown", id, code, msg, unknown, payment.FieldAmount)
	}
	var tries int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox.attempts WHERE instruction_id = 'p000-0' AND state <> 'DISPATCHING'`).Scan(&tries); err != nil {
		t.Fatal(err)
	}
	if tries != 1 {
		t.Errorf("p000-0 has %d outcomes, want 1: a validation failure is not retried", tries)
	}
	if st := b.sandbox.Stats(); st.Calls != 2 || st.Payments != 2 {
		t.Errorf("sandbox stats %+v: want the two valid instructions sent and paid, the refused one never sent", st)
	}
}

// TestOutcomeUnknownSurvivesAStricterBuild: an instruction whose first
// attempt timed out under the older build (the rail may have paid it)
// and that the newer build's validation then refuses is a dead letter
// whose outcome is unknown: its last attempt never reached the rail, but
// that proves nothing about the first. Operators replay the dead letters
// without outcome_unknown as ones the rail certainly did not act on
// (docs/operations.md, "After a rail outage").
func TestOutcomeUnknownSurvivesAStricterBuild(t *testing.T) {
	t.Parallel()
	b := setup(t, rails.SandboxOptions{})
	b.enqueue(t, 1, 1) // p000-0, 100 minor units
	b.useTransport(t, funcTransport(func(ctx context.Context, ins payment.Instruction) (rails.Result, error) {
		<-ctx.Done() // the rail got the request and never answered
		return rails.Result{}, ctx.Err()
	}), 100*time.Millisecond)
	cfg := b.config("older")
	cfg.MaxAttempts = 100
	older := b.start(t, cfg)
	for deadline := time.Now().Add(30 * time.Second); countCode(t, b, string(rails.CodeRailTimeout)) == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no RAIL_TIMEOUT recorded")
		}
	}
	stop, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	if err := older.Stop(stop); err != nil {
		t.Fatal(err)
	}

	b.rails = strictRails(t, b.sandbox)
	b.start(t, b.config("newer"))
	b.waitDrained(t, 30*time.Second)
	var (
		code    string
		unknown bool
	)
	if err := b.pool.QueryRow(b.ctx, `SELECT error_code, outcome_unknown FROM outbox.dead_letters`).Scan(&code, &unknown); err != nil {
		t.Fatal(err)
	}
	if code != string(rails.CodeValidationFailed) || !unknown {
		t.Errorf("dead letter %s, outcome unknown %v; want VALIDATION_FAILED with outcome unknown: an earlier attempt timed out", code, unknown)
	}
}
