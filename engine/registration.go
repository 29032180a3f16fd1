package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gofrs/uuid/v5"

	"github.com/ledgerline/outbox/internal/retry"
	"github.com/ledgerline/outbox/internal/store"
)

// Each run of a relayer (each Start) registers in relayer_runs under its
// relayer id with a run id of its own, refreshes the registration every
// runRefreshInterval on a timer of its own (never per claim), and removes
// it when it stops gracefully (store.RegisterRun, migration 052). Two
// things rest on it:
//
//   - The look for a lost claim's rows (releaseLostClaim) tells this run's
//     claims from others' by relayer id alone. It returns nothing while
//     another run of the id is registered with claims it may dispatch
//     after the last claim this run heard of (store.LostClaims), so a
//     second process under the same id never has its claim handed back
//     RELEASED while it sends it.
//   - Another live run of the id is reported: an ERROR line naming both,
//     Stats.IDConflicts (outbox_relayer_id_conflicts_total) and
//     Health.SharedID (the readiness probe's degraded reason).
//
// The rule that keeps a dead run from being taken for gone too early: a
// registration's claims_until is the refresh's time plus runClaimsFor, and
// a run sends a claim only while the last refresh it heard back from
// (sent before that time) covers the claim's whole round trip
// (claimContext): a claim it dispatches answered before its deadline, so
// it began before the claims_until of a registration that committed
// before it was sent. The look compares claims_until with the last claim
// the looking run heard of, not with the clock: a run killed at any
// moment keeps its claims covered for as long as any of them is in
// flight, whatever their leases, and a run that started after it (a
// restart under a fixed id) makes the look again once it heard of a
// claim after the dead run's claims_until, within runClaimsFor of the
// dead run's last refresh. Until then a lost claim's rows wait for the
// reaper, as they did before the look existed. A run whose refreshes
// fail for longer than runClaimsFor less a round trip claims nothing
// until one succeeds: it tries one itself before its next claim.
const (
	// runRefreshInterval is how often a run refreshes its registration.
	runRefreshInterval = 5 * time.Second
	// runClaimsFor is how long past a refresh the registration covers the
	// run's claims (claims_until).
	runClaimsFor = time.Minute
	// sharedIDLogEvery is how often the ERROR line about another live run
	// of the id is repeated while it lasts.
	sharedIDLogEvery = time.Minute
)

// registration is a run's entry in relayer_runs.
type registration struct {
	id   uuid.UUID
	host string
	pid  int
	// covered is the moment, by this process's monotonic clock, until
	// which the last refresh heard back from covers a claim's round trip
	// (its send time plus runClaimsFor), as nanoseconds since base. Zero
	// before the first.
	covered atomic.Int64
	base    time.Time

	mu sync.Mutex // one refresh at a time (the timer's, the claim loop's)
	// startedAt is the database's time of the first registration.
	startedAt time.Time
	// logged is when each other run was last named in an ERROR line.
	logged map[uuid.UUID]time.Time
	// shared describes the other live runs the last refresh found ("":
	// none), for Health.SharedID.
	shared atomic.Pointer[string]
	// refreshes counts the registration's statements (tests).
	refreshes atomic.Int64
}

func newRegistration() *registration {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	return &registration{id: uuid.Must(uuid.NewV7()), host: host, pid: os.Getpid(), base: time.Now(),
		logged: make(map[uuid.UUID]time.Time)}
}

// covers reports whether the last refresh heard back from covers a claim
// whose round trip ends by deadline.
func (g *registration) covers(deadline time.Time) bool {
	c := g.covered.Load()
	return c != 0 && deadline.Sub(g.base) < time.Duration(c)
}

// cover notes a refresh sent at sent that was heard back from.
func (g *registration) cover(sent time.Time) {
	d := int64(sent.Add(runClaimsFor).Sub(g.base))
	for {
		c := g.covered.Load()
		if c >= d || g.covered.CompareAndSwap(c, d) {
			return
		}
	}
}

// refreshEvery is runRefreshInterval, or what a test set.
func (r *run) refreshEvery() time.Duration {
	if d := r.testHooks.runRefresh; d > 0 {
		return d
	}
	return runRefreshInterval
}

// register registers this run, or refreshes its registration, and
// reports the other runs of its relayer id it finds. A refresh never
// makes the registration again (store.RunParams.Refresh): a refresh the
// stop gave up on, run late by the server, would otherwise bring back
// the row the stop's endRegistration removed after it, and the id would
// look shared for runClaimsFor.
func (r *run) register(ctx context.Context) error {
	g := r.reg
	g.mu.Lock()
	defer g.mu.Unlock()
	sent := time.Now()
	ctx, cancel := r.bounded(ctx)
	defer cancel()
	p := store.RunParams{RunID: g.id, RelayerID: r.cfg.RelayerID, Host: g.host, PID: g.pid, ClaimsFor: runClaimsFor,
		Refresh: !g.startedAt.IsZero()}
	self, others, err := r.store.RegisterRun(ctx, r.pool, p)
	g.refreshes.Add(1)
	if errors.Is(err, store.ErrRunNotRegistered) {
		// Only the reaper's pass removes a live run's row, after it could
		// not refresh it for over an hour.
		r.log.Warn("this run's registration was removed while it ran (it could not refresh it for a long time); registering it again",
			"run_id", g.id)
		p.Refresh = false
		self, others, err = r.store.RegisterRun(ctx, r.pool, p)
		g.refreshes.Add(1)
	}
	if err != nil {
		return fmt.Errorf("register this run of the relayer: %w", err)
	}
	g.cover(sent)
	first := g.startedAt.IsZero()
	if first {
		g.startedAt = self.StartedAt
	}
	r.noteOthers(self, others, first)
	return nil
}

// noteOthers reports the other runs of this relayer id a registration
// found. At the first, a registration not past its claims_until may be a
// run killed moments ago (a restart under a fixed id) or a live one: it
// is named at WARN, and reported as live only if it refreshes. Later, a
// run is live if it refreshed since this run registered, within the last
// runClaimsFor (by the database's clock): a run killed before this one
// started never is, one killed since is for that long, and one stopped
// gracefully removed its row. The window is long against the refresh
// interval, so two runs whose refreshes drift apart do not flap.
func (r *run) noteOthers(self store.Run, others []store.Run, first bool) {
	g := r.reg
	var live []store.Run
	now := time.Now()
	for _, o := range others {
		switch {
		case first && o.ClaimsUntil.After(self.SeenAt):
			r.log.Warn("another run of this relayer id is registered and was seen recently: a run killed moments ago, or another relayer running under this id (reported at ERROR if it refreshes its registration)",
				"run_id", g.id, "host", g.host, "pid", g.pid,
				"other_run_id", o.RunID, "other_host", o.Host, "other_pid", o.PID, "other_started_at", o.StartedAt, "other_seen_at", o.SeenAt)
		case !first && o.SeenAt.After(g.startedAt) && o.SeenAt.After(self.SeenAt.Add(-runClaimsFor)):
			live = append(live, o)
		}
	}
	if len(live) == 0 {
		if g.shared.Load() != nil {
			g.shared.Store(nil)
		}
		return
	}
	r.stats.idConflicts.Add(1)
	var desc []string
	for _, o := range live {
		desc = append(desc, fmt.Sprintf("host %s pid %d run %s started %s", o.Host, o.PID, o.RunID, o.StartedAt.UTC().Format(time.RFC3339)))
		if at, ok := g.logged[o.RunID]; ok && now.Sub(at) < sharedIDLogEvery {
			continue
		}
		g.logged[o.RunID] = now
		r.log.Error("another relayer is running under this relayer id: give each running relayer its own id (--relayer-id); meanwhile the claims of a claim whose reply was lost are left to the reaper",
			"run_id", g.id, "host", g.host, "pid", g.pid, "started_at", g.startedAt,
			"other_run_id", o.RunID, "other_host", o.Host, "other_pid", o.PID, "other_started_at", o.StartedAt, "other_seen_at", o.SeenAt)
	}
	s := strings.Join(desc, "; ")
	g.shared.Store(&s)
}

// refreshLoop refreshes the run's registration every refreshEvery until
// the run stops.
func (r *run) refreshLoop() {
	defer close(r.regDone)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-r.stopping:
			cancel()
		case <-ctx.Done():
		}
	}()
	failures := &retry.Loop{Log: r.log, What: "run registration refresh", Min: r.refreshEvery(), Max: r.refreshEvery()}
	t := time.NewTicker(r.refreshEvery())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := r.register(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			failures.Failed(err)
		} else {
			failures.Succeeded()
		}
	}
}

// claimContext is the context of one claim's round trip: its own
// deadline, not cancelled by Stop (a claim that commits while its caller
// gives up would leave instructions in flight that nobody dispatches).
// The run's registration must cover that round trip (see registration):
// if the last refresh heard back from does not, the run refreshes first,
// and claims nothing if it cannot.
func (r *run) claimContext(ctx context.Context) (context.Context, context.CancelFunc, error) {
	claimCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.roundTripDeadline())
	deadline, _ := claimCtx.Deadline()
	if r.reg.covers(deadline) {
		return claimCtx, cancel, nil
	}
	if err := r.register(ctx); err != nil {
		cancel()
		return nil, nil, fmt.Errorf("not claiming until this run is registered: %w", err)
	}
	if !r.reg.covers(deadline) {
		cancel()
		return nil, nil, fmt.Errorf("not claiming: this run's registration does not cover a claim's round trip")
	}
	return claimCtx, cancel, nil
}

// endRegistration removes the run's registration at a graceful stop,
// unless the run leaves claims it dispatched in flight (left is true):
// then the registration stays, and keeps covering them, until the
// reaper's pass removes it.
func (r *run) endRegistration(ctx context.Context, left bool) {
	g := r.reg
	g.mu.Lock()
	registered := !g.startedAt.IsZero()
	g.mu.Unlock()
	switch {
	case !registered:
	case left:
		r.log.Info("this run's registration stays until the reaper removes it: claims it dispatched are left in flight", "run_id", g.id)
	default:
		if err := r.store.EndRun(ctx, r.pool, g.id); err != nil {
			r.log.Warn("could not remove this run's registration; the reaper's pass removes it", "run_id", g.id, "err", err)
		}
	}
}
