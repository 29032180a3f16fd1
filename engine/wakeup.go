package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerline/outbox/internal/retry"
	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/migrations"
)

// listenBackoffCap is the longest wait between reconnects of the listener.
const listenBackoffCap = 30 * time.Second

// listenCheckAfter is how long the listener waits for a notification
// before it asks its connection whether it is still there (the LISTEN
// again, answered within the round-trip deadline). A listening connection is idle for as long as
// nothing is enqueued or the relayer is busy, and nothing else would ever
// notice that it went silent (a primary that died without resetting it,
// a firewall or load balancer that dropped it while idle, a network
// black-holed): the relayer would report itself listening, producers
// would go on paying for NOTIFY, and every instruction would wait for the
// next poll, for as long as the process ran.
const listenCheckAfter = 10 * time.Second

// listenCheck is listenCheckAfter, or what a test set.
func (r *run) listenCheck() time.Duration {
	if d := r.testHooks.listenCheck; d > 0 {
		return d
	}
	return listenCheckAfter
}

// listen runs the LISTEN connection until ctx ends, each (re)connect on a
// fresh connection. Every (re)connect counts as a wake, because
// notifications sent while disconnected are lost. A connection that
// fails, or does not answer a ping after listenCheck without a
// notification, is closed and replaced.
//
// While the database is unreachable the listener reconnects with capped
// exponential backoff (ReconnectDelay at least) and logs once per change
// of state, not per attempt.
func (r *run) listen(ctx context.Context) {
	defer close(r.listenDone)
	defer r.listening.Store(false)
	failures := &retry.Loop{Log: r.log, What: "listener (polling meanwhile)", Min: r.cfg.ReconnectDelay, Max: listenBackoffCap}
	for {
		err := r.listenOn(ctx, failures)
		r.listening.Store(false)
		if ctx.Err() != nil {
			return
		}
		if !r.sleep(ctx, max(failures.Failed(err), r.cfg.ReconnectDelay)) {
			return
		}
	}
}

// listenOn listens on one connection until it fails or ctx ends.
func (r *run) listenOn(ctx context.Context, failures *retry.Loop) error {
	conn, err := r.connectListener(ctx)
	if err != nil {
		return fmt.Errorf("listener: connect: %w", err)
	}
	defer func() {
		// Closing sends a message; on a silent connection it must not
		// wait for the network.
		cctx, cancel := r.bounded(context.WithoutCancel(ctx))
		defer cancel()
		_ = conn.Close(cctx)
	}()
	listen := "listen " + pgx.Identifier{migrations.NotifyChannel}.Sanitize()
	lctx, cancel := r.bounded(ctx)
	_, err = conn.Exec(lctx, listen)
	cancel()
	if err != nil {
		return fmt.Errorf("listener: listen: %w", err)
	}
	// From now on notifications arrive; anything enqueued while we were
	// not listening is picked up by one claim.
	r.listening.Store(true)
	failures.Succeeded()
	r.signal()
	for {
		wctx, cancel := context.WithTimeout(ctx, r.listenCheck())
		n, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case err == nil:
			if n != nil { // nil if the pool's config handles notifications itself
				r.log.Debug("notified", "pid", n.PID, "payload", n.Payload)
			}
			r.stats.notifications.Add(1)
			r.signal()
			continue
		case ctx.Err() != nil:
			return ctx.Err()
		case !errors.Is(err, context.DeadlineExceeded):
			return fmt.Errorf("listener: waiting for notification: %w", err)
		}
		// Nothing for a while: a wait that timed out leaves the connection
		// usable (pgx only sets a read deadline), so ask the server
		// whether it is still there. The ping is the LISTEN again (a no-op
		// for a channel listened to), so that pg_stat_activity goes on
		// showing the connection's LISTEN.
		pctx, cancel := r.bounded(ctx)
		_, err = conn.Exec(pctx, listen)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("listener: connection silent (no answer to a ping within %s): %w", r.roundTripDeadline(), err)
		}
	}
}

// connectListener opens the listener's connection, with the pool's
// settings and its application_name marked, so that operators tell the
// listener from the pool in pg_stat_activity.
func (r *run) connectListener(ctx context.Context) (*pgx.Conn, error) {
	cfg := r.pool.Config().ConnConfig.Copy()
	if name := cfg.RuntimeParams["application_name"]; name != "" {
		cfg.RuntimeParams["application_name"] = name + " listen"
	}
	return pgx.ConnectConfig(ctx, cfg)
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
