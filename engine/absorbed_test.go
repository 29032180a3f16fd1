package engine

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"

	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/rails"
)

// TestObserverSeesAnAbsorbedOutcome: while the relayer's rail call is
// held, another writer records an outcome of the same claim (as a second
// process under the same relayer id could). The relayer's own outcome
// then finds its claim closed: it is late and absorbed (not archived,
// migration 050), and OnRecorded and Stats say so. They said Late alone,
// as for an outcome archived after a reaped lease.
func TestObserverSeesAnAbsorbedOutcome(t *testing.T) {
	t.Parallel()
	b := setup(t, rails.SandboxOptions{})
	release := make(chan struct{})
	b.useTransport(t, funcTransport(func(ctx context.Context, ins payment.Instruction) (rails.Result, error) {
		select {
		case <-release:
		case <-ctx.Done():
			return rails.Result{}, ctx.Err()
		}
		return rails.Result{Code: rails.SandboxAccepted, Reference: "ref-" + ins.IdempotencyKey}, nil
	}), 20*time.Second)
	var (
		mu       sync.Mutex
		observed []Recorded
	)
	cfg := b.config("absorbing")
	cfg.LeaseGrace = 30 * time.Second // no lease ends during the test
	cfg.OnRecorded = func(batch []Recorded) {
		mu.Lock()
		defer mu.Unlock()
		observed = append(observed, batch...)
	}
	r := b.start(t, cfg)
	b.enqueue(t, 1, 1)
	b.waitInFlight(t, 1)

	// The other writer's outcome, for the claim the relayer holds.
	var c store.Outcome
	if err := b.pool.QueryRow(b.ctx, `SELECT outbox_id, instruction_id, participant_id, sequence_id, idempotency_key,
		rail_type, attempt_id, attempt_no, relayer_id, claimed_at FROM outbox.inflight`).Scan(
		&c.OutboxID, &c.InstructionID, &c.ParticipantID, &c.SequenceID, &c.IdempotencyKey,
		&c.RailType, &c.ClaimAttemptID, &c.AttemptNo, &c.RelayerID, &c.ClaimedAt); err != nil {
		t.Fatal(err)
	}
	c.AttemptID = uuid.Must(uuid.NewV7())
	c.State, c.RailCode, c.RailReference, c.CountAttempt = store.Dispatched, rails.SandboxAccepted, "ref-other", true
	st, err := store.New("")
	if err != nil {
		t.Fatal(err)
	}
	if rec, _, err := st.Record(b.ctx, b.pool, []store.Outcome{c}, store.HandoffParams{}); err != nil || len(rec) != 1 || rec[0].Late {
		t.Fatalf("the other writer's outcome: %+v, %v", rec, err)
	}

	close(release)
	var got []Recorded
	for deadline := time.Now().Add(30 * time.Second); len(got) == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v: the relayer's outcome was never observed", r.Stats())
		}
		mu.Lock()
		got = append([]Recorded(nil), observed...)
		mu.Unlock()
	}
	if len(got) != 1 || got[0].OutboxID != c.OutboxID || !got[0].Late || !got[0].Absorbed {
		t.Fatalf("observed %+v: want the relayer's outcome of %s late and absorbed", got, c.OutboxID)
	}
	if s := r.Stats(); s.Late != 1 || s.Absorbed != 1 || s.Dispatched != 0 {
		t.Errorf("stats %+v: want one late outcome, absorbed, and nothing dispatched by this relayer", s)
	}
	var outcomes int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox.attempts
		WHERE claim_attempt_id = $1 AND state <> 'DISPATCHING'`, c.ClaimAttemptID).Scan(&outcomes); err != nil {
		t.Fatal(err)
	}
	if outcomes != 1 {
		t.Errorf("the claim has %d outcomes archived: want the other writer's alone", outcomes)
	}
}
