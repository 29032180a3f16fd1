package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/migrations"
	"github.com/ledgerline/outbox/rails"
)

// Batcher runs and pipelines statements; pgx.Tx, *pgx.Conn and
// *pgxpool.Pool satisfy it.
type Batcher = store.Batcher

// RelayOnce makes one synchronous pass in db: it claims what is due (up to
// BatchSize, with the relayer's ordering and rails), dispatches each
// instruction in turn through the relayer's rails, and records the
// outcomes, all through db, which may be a test's open transaction; a pass
// that finds nothing else due takes one suspect (an instruction whose
// relayer died with it in flight) alone. It is
// what a running relayer does continuously, for tests (package outboxtest)
// and tools; it does not need Start, and of Stats it counts only its
// claim statements (Claims). While a rail's breaker is half-open, a pass
// claims one instruction of that rail, its probe, as a relayer does. Its
// first pass checks the schema, as Start does: on one behind this build
// it returns a [*migrations.SchemaError] and claims nothing. A pass whose
// claim fails without the server's answer returns the error; in a
// transaction the claim goes with it, but through a pool it may have
// committed, and what it took then waits in flight for the reaper: a
// running relayer's claim loop looks for such claims and hands them back
// (docs/architecture.md), bounded by the claims it heard of, which
// passes, each its own, do not keep, and a look bounded otherwise could
// take the claims a running relayer of the same id dispatches.
//
// Each pass registers as a run of the relayer id through db before it
// claims, and removes the registration once its outcomes are recorded (in
// a transaction, both go with it): a running relayer of the same id
// leaves the pass's claims alone while the pass sends them, and reports
// the pass as another run of its id if it sees it. Do not run passes
// under the id of a running relayer all the same (Config.RelayerID).
func (r *Relayer) RelayOnce(ctx context.Context, db Batcher) ([]Recorded, error) {
	if !r.onceSchemaChecked.Load() {
		// As Start: on a schema behind this build, a claim could reach
		// the rail and its outcome's write then fail.
		if _, err := migrations.Ready(ctx, db, r.cfg.Schema); err != nil {
			return nil, fmt.Errorf("engine: relay once: %w", err)
		}
		r.onceSchemaChecked.Store(true)
	}
	closed, halfOpen := r.cfg.Rails.Claimable()
	types := append(closed, halfOpen...)
	if len(types) == 0 {
		return nil, nil
	}
	ru := &run{Relayer: r, dispatchCtx: ctx, slotWait: ctx}
	// The pass's registration covers its claims as a run's does
	// (registration.go): they must be sent before its claims_until.
	pass := newRegistration()
	claimStart := time.Now()
	if _, _, err := r.store.RegisterRun(ctx, db, store.RunParams{RunID: pass.id, RelayerID: r.cfg.RelayerID,
		Host: pass.host, PID: pass.pid, ClaimsFor: runClaimsFor}); err != nil {
		return nil, fmt.Errorf("engine: relay once: %w", err)
	}
	claimCtx, cancel := context.WithDeadline(ctx, claimStart.Add(runClaimsFor))
	// As a running relayer claims: a half-open rail gets one instruction,
	// its probe (the breaker would refuse the rest as CIRCUIT_OPEN).
	claimed, err := ru.claim(claimCtx, db, r.cfg.BatchSize)
	if err == nil && len(claimed) == 0 {
		// Nothing else due: one suspect, alone (see store.ClaimParams).
		claimed, err = r.store.Claim(claimCtx, db, store.ClaimParams{RelayerID: r.cfg.RelayerID, Limit: 1,
			Leases: ru.leases(types), Suspects: true})
	}
	cancel()
	if err != nil {
		// The pass sends nothing: its registration covers no claim it
		// dispatches (a claim that committed unheard is nobody's).
		_ = r.store.EndRun(ctx, db, pass.id)
		return nil, fmt.Errorf("engine: relay once: %w", err)
	}
	if len(claimed) > 0 {
		r.noteClaim(claimed[0].ClaimedAt, claimStart)
	}
	outcomes := make([]store.Outcome, 0, len(claimed))
	for _, c := range claimed {
		var d rails.Decision
		var latency time.Duration
		ins, perr := railInstruction(&c)
		if perr != nil {
			d = payloadFailure(perr)
		} else {
			start := time.Now()
			d = ru.execute(&c, &ins, ru.callDeadline(claimStart, c))
			latency = time.Since(start)
		}
		outcomes = append(outcomes, r.outcome(c, d, latency))
	}
	// No hand-off: the pass dispatches what it claimed, and the next pass
	// finds the successors the outcomes made due.
	recorded, _, err := r.store.Record(ctx, db, outcomes, store.HandoffParams{RelayerID: r.cfg.RelayerID})
	if err != nil {
		// The registration stays, covering the claims left in flight,
		// until the reaper removes it.
		return nil, fmt.Errorf("engine: relay once: %w", err)
	}
	if err := r.store.EndRun(ctx, db, pass.id); err != nil {
		r.log.Warn("could not remove a pass's registration; the reaper's pass removes it", "run_id", pass.id, "err", err)
	}
	late := make(map[string]bool)
	for _, rec := range recorded {
		if rec.Late {
			late[rec.ClaimAttemptID.String()] = true
		}
	}
	now := r.dbNow()
	out := make([]Recorded, len(outcomes))
	for i, o := range outcomes {
		out[i] = Recorded{Outcome: o, EnqueuedAt: claimed[i].EnqueuedAt, RecordedAt: now, Late: late[o.ClaimAttemptID.String()]}
	}
	return out, nil
}
