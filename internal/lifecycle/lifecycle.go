// Package lifecycle is the one start/stop contract of the outbox's
// long-running services: the relayer (engine.Relayer), the zombie reaper
// (reaper.Reaper) and the relay service that runs both (relay.Service).
//
// The contract, the same for all of them:
//
//   - Start(ctx) starts the background work and returns. ctx is used for
//     start-up work only (a database check, say); cancelling it later does
//     not stop anything, Stop does. A Start that fails leaves the service
//     stopped, and it may be started again.
//   - Start on a running service returns [ErrAlreadyStarted] and changes
//     nothing.
//   - Stop(ctx) stops and returns once everything the service started has
//     ended. ctx bounds the graceful part (in-flight work finishing); when
//     it ends first, Stop cuts the rest off and returns ctx's error, but the
//     service is stopped all the same.
//   - Stop on a service that is not running (never started, or stopped
//     already) returns nil at once. Concurrent Stops: one stops, the others
//     wait for it and return nil (or their own ctx's error if that ends
//     first).
//   - Start after Stop starts the service again, with fresh internal state;
//     counters carry over.
//   - Run(ctx) starts the service and runs until ctx is done, then stops
//     it; a Stop of another goroutine ends Run too, once that Stop has
//     ended, and Run returns nil ([Lifecycle.StartDone]).
//   - Start and Stop never run at the same time: a Start issued during a
//     Stop waits for the Stop to finish (or for its own ctx), and the
//     other way round.
package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
)

// ErrAlreadyStarted is returned by Start on a running service.
var ErrAlreadyStarted = errors.New("already started")

// StopFunc stops what a successful start started (see the package
// contract for ctx).
type StopFunc func(ctx context.Context) error

// Lifecycle implements the contract for one service. The zero value is a
// stopped service. It is safe for concurrent use.
type Lifecycle struct {
	init sync.Once
	// token has one slot: holding it is the right to start or stop. A
	// channel rather than a mutex, so that waiting for it honours a context.
	token chan struct{}
	stop  StopFunc // nil while stopped; read and written holding the token
	// serving is true from a successful start until a stop begins; read
	// without the token, so a probe never waits for a slow stop.
	serving atomic.Bool
}

func (l *Lifecycle) acquire(ctx context.Context) error {
	l.init.Do(func() { l.token = make(chan struct{}, 1) })
	// A free token is taken whatever ctx says: ctx bounds the wait for a
	// Start or Stop in progress, not the Stop itself. A select over both
	// picks at random when ctx is already done, and a Stop given a
	// cancelled context then returned its error half the time without
	// stopping anything.
	select {
	case l.token <- struct{}{}:
		return nil
	default:
	}
	select {
	case l.token <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (l *Lifecycle) release() { <-l.token }

// Start runs start unless the service is running. start gets ctx and
// returns the function that stops what it started.
func (l *Lifecycle) Start(ctx context.Context, start func(ctx context.Context) (StopFunc, error)) error {
	if err := l.acquire(ctx); err != nil {
		return fmt.Errorf("start: %w", err)
	}
	defer l.release()
	if l.stop != nil {
		return ErrAlreadyStarted
	}
	stop, err := start(ctx)
	if err != nil {
		return err
	}
	l.stop = stop
	l.serving.Store(true)
	return nil
}

// StartDone is Start, and also returns a channel closed once what this
// start started has been stopped, by whichever Stop: what a Run waits on
// besides its context, so that it returns when a Stop of another
// goroutine (a program's shutdown hook) stopped the service. nil when the
// start failed.
func (l *Lifecycle) StartDone(ctx context.Context, start func(ctx context.Context) (StopFunc, error)) (<-chan struct{}, error) {
	var done chan struct{}
	err := l.Start(ctx, func(ctx context.Context) (StopFunc, error) {
		stop, err := start(ctx)
		if err != nil {
			return nil, err
		}
		done = make(chan struct{})
		return func(ctx context.Context) error {
			defer close(done)
			return stop(ctx)
		}, nil
	})
	if err != nil {
		return nil, err
	}
	return done, nil
}

// Stop stops the service if it runs (see the package contract).
func (l *Lifecycle) Stop(ctx context.Context) error {
	if err := l.acquire(ctx); err != nil {
		return fmt.Errorf("stop: %w", err)
	}
	defer l.release()
	stop := l.stop
	if stop == nil {
		return nil
	}
	l.stop = nil
	l.serving.Store(false)
	return stop(ctx)
}

// Running reports whether the service is started and not stopped. It waits
// for a Start or Stop in progress.
func (l *Lifecycle) Running() bool {
	_ = l.acquire(context.Background())
	defer l.release()
	return l.stop != nil
}

// Serving reports, without waiting, whether the service started and no
// stop has begun: what a readiness probe asks.
func (l *Lifecycle) Serving() bool { return l.serving.Load() }

// ProcessID returns an id for a service of this process: host, pid and a
// random suffix (two services of one process get different ids). It names
// relayers and reapers in attempt rows, logs and pg_stat_activity.
func ProcessID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	return fmt.Sprintf("%s-%d-%06x", host, os.Getpid(), rand.IntN(1<<24))
}
