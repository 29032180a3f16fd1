package engine

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgxlisten"

	"github.com/ledgerline/outbox/internal/retry"
	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/migrations"
)

// listenBackoffCap is the longest wait between reconnects of the listener.
const listenBackoffCap = 30 * time.Second

// listen runs the LISTEN connection until ctx ends. pgxlisten reconnects
// with a fresh connection each time; every (re)connect counts as a wake,
// because notifications sent while disconnected are lost.
//
// While the database is unreachable the listener reconnects with capped
// exponential backoff (pgxlisten's own delay is fixed) and logs once per
// change of state, not per attempt.
func (r *run) listen(ctx context.Context) {
	defer close(r.listenDone)
	failures := &retry.Loop{Log: r.log, What: "listener (polling meanwhile)", Min: r.cfg.ReconnectDelay, Max: listenBackoffCap}
	// Connect, LogError and HandleBacklog all run on Listen's goroutine.
	var wait time.Duration
	l := &pgxlisten.Listener{
		Connect: func(ctx context.Context) (*pgx.Conn, error) {
			extra := wait - r.cfg.ReconnectDelay // pgxlisten already waited ReconnectDelay
			if extra > 0 && !r.sleep(ctx, extra) {
				return nil, ctx.Err()
			}
			cfg := r.pool.Config().ConnConfig.Copy()
			if name := cfg.RuntimeParams["application_name"]; name != "" {
				// Operators tell the listener from the pool in pg_stat_activity.
				cfg.RuntimeParams["application_name"] = name + " listen"
			}
			return pgx.ConnectConfig(ctx, cfg)
		},
		LogError: func(ctx context.Context, err error) {
			r.listening.Store(false)
			if ctx.Err() == nil {
				wait = failures.Failed(err)
			}
		},
		ReconnectDelay: r.cfg.ReconnectDelay,
	}
	r.listenRecovered = func() {
		failures.Succeeded()
		wait = 0
	}
	// Handlers are registered before Listen starts.
	l.Handle(migrations.NotifyChannel, notifyHandler{r})
	_ = l.Listen(ctx)
	r.listening.Store(false)
}

type notifyHandler struct{ r *run }

// HandleNotification wakes the claim loop; the claim loop debounces.
func (h notifyHandler) HandleNotification(_ context.Context, n *pgconn.Notification, _ *pgx.Conn) error {
	h.r.log.Debug("notified", "pid", n.PID, "payload", n.Payload)
	h.r.stats.notifications.Add(1)
	h.r.signal()
	return nil
}

// HandleBacklog runs right after LISTEN succeeded (also after a reconnect):
// from now on notifications arrive, and anything enqueued while we were not
// listening is picked up by one claim.
func (h notifyHandler) HandleBacklog(context.Context, string, *pgx.Conn) error {
	h.r.listening.Store(true)
	h.r.listenRecovered()
	h.r.signal()
	return nil
}

// goIdle runs the adaptive NOTIFY protocol after an empty claim. It
// registers (or refreshes) this relayer in relayer_idle, so the pending
// trigger notifies from now on. A producer whose trigger ran before the
// registration was visible did not notify, so:
//  1. claim once more: catches producers that committed before now;
//  2. wait for the transactions that were in progress when the
//     registration committed (they may include such a producer), then claim
//     again. Producers that start later see the registration and notify.
//     While some of them are still running, claim now and then as well
//     (see awaitFinished).
//
// found reports that one of these claims returned work.
func (r *run) goIdle(ctx context.Context) (found bool, err error) {
	if h := r.testHooks.beforeRegister; h != nil {
		h()
	}
	if err := r.registerIdle(ctx); err != nil {
		return false, err
	}
	// The snapshot must be taken after the registration committed, so it
	// is a separate statement (and implicit transaction).
	running, err := r.runningWriters(ctx)
	if err != nil {
		return false, err
	}
	if n, _, err := r.claimOnce(ctx); err != nil || n > 0 {
		return n > 0, err
	}
	if h := r.testHooks.afterIdleClaim; h != nil {
		h()
	}
	if len(running) == 0 {
		return false, nil
	}
	return r.awaitFinished(ctx, running)
}

// awaitClaimFirst is how long awaitFinished waits before its first claim
// while listed transactions are still running; the wait doubles after each.
const awaitClaimFirst = 50 * time.Millisecond

// awaitFinished polls until the listed transactions have all ended, then
// claims. The list is every writer of the cluster, so one unrelated long
// transaction (another database's, a report's) can keep it waiting: while
// any is still running it also claims after awaitClaimFirst, then after
// doubling waits, so a producer that committed without notifying is found
// within about twice the time it took to commit, a handful of claims in
// all. It gives up (found false) after one poll interval or when woken,
// since the poll and the wake both lead to a claim anyway.
func (r *run) awaitFinished(ctx context.Context, xids []string) (found bool, err error) {
	start := time.Now()
	deadline := start.Add(r.cfg.PollInterval)
	nextClaim, claimWait := start.Add(awaitClaimFirst), awaitClaimFirst
	delay := time.Millisecond
	for time.Now().Before(deadline) {
		done, err := r.allFinished(ctx, xids)
		if err != nil {
			return false, nil // the claim loop's next claim reports the database's trouble
		}
		if done || !time.Now().Before(nextClaim) {
			n, _, err := r.claimOnce(ctx)
			if done || err != nil || n > 0 {
				return n > 0, err
			}
			claimWait *= 2
			nextClaim = time.Now().Add(claimWait)
		}
		t := time.NewTimer(min(delay, time.Until(nextClaim)))
		select {
		case <-ctx.Done():
			t.Stop()
			return false, nil
		case <-r.wake:
			t.Stop()
			r.signal() // leave the wake for the claim loop
			return false, nil
		case <-t.C:
		}
		delay = min(2*delay, 50*time.Millisecond)
	}
	return false, nil
}

// registerIdle, runningWriters, allFinished and unregisterIdle run their
// statements each within a round-trip deadline (see bounded).
func (r *run) registerIdle(ctx context.Context) error {
	ctx, cancel := r.bounded(ctx)
	defer cancel()
	return r.store.RegisterIdle(ctx, r.pool, r.cfg.RelayerID)
}

func (r *run) runningWriters(ctx context.Context) ([]string, error) {
	ctx, cancel := r.bounded(ctx)
	defer cancel()
	return store.RunningWriters(ctx, r.pool)
}

func (r *run) allFinished(ctx context.Context, xids []string) (bool, error) {
	ctx, cancel := r.bounded(ctx)
	defer cancel()
	return store.AllFinished(ctx, r.pool, xids)
}

func (r *run) unregisterIdle(ctx context.Context) error {
	ctx, cancel := r.bounded(ctx)
	defer cancel()
	return r.store.UnregisterIdle(ctx, r.pool, r.cfg.RelayerID)
}
