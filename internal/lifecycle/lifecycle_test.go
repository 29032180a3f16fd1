package lifecycle

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fake is a service whose runs are counted.
type fake struct {
	lc               Lifecycle
	running, started atomic.Int64
	failNext         atomic.Bool
}

var errBoom = errors.New("boom")

func (f *fake) Start(ctx context.Context) error {
	return f.lc.Start(ctx, func(context.Context) (StopFunc, error) {
		if f.failNext.Swap(false) {
			return nil, errBoom
		}
		if f.running.Add(1) != 1 {
			panic("two runs at once")
		}
		f.started.Add(1)
		done := make(chan struct{})
		go func() { <-done }() // the background work
		return func(context.Context) error {
			close(done)
			f.running.Add(-1)
			return nil
		}, nil
	})
}

func (f *fake) Stop(ctx context.Context) error { return f.lc.Stop(ctx) }

func TestContract(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	f := &fake{}
	if err := f.Stop(ctx); err != nil || f.lc.Running() {
		t.Fatalf("stop before start: %v", err)
	}
	f.failNext.Store(true)
	if err := f.Start(ctx); !errors.Is(err, errBoom) || f.lc.Running() {
		t.Fatalf("failed start: %v, running %v", err, f.lc.Running())
	}
	if err := f.Start(ctx); err != nil || !f.lc.Running() {
		t.Fatalf("start after a failed start: %v", err)
	}
	if err := f.Start(ctx); !errors.Is(err, ErrAlreadyStarted) || f.started.Load() != 1 {
		t.Fatalf("second start: %v (%d runs)", err, f.started.Load())
	}
	if err := f.Stop(ctx); err != nil || f.lc.Running() || f.running.Load() != 0 {
		t.Fatalf("stop: %v", err)
	}
	if err := f.Stop(ctx); err != nil {
		t.Fatalf("double stop: %v", err)
	}
	if err := f.Start(ctx); err != nil || f.started.Load() != 2 {
		t.Fatalf("start after stop: %v (%d runs)", err, f.started.Load())
	}
	if err := f.Stop(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestStopWaitsForSlowStop: a Stop issued while another is in progress
// waits for it, or returns its own context's error.
func TestStopWaitsForSlowStop(t *testing.T) {
	t.Parallel()
	var lc Lifecycle
	release := make(chan struct{})
	if err := lc.Start(t.Context(), func(context.Context) (StopFunc, error) {
		return func(context.Context) error { <-release; return nil }, nil
	}); err != nil {
		t.Fatal(err)
	}
	first := make(chan error)
	go func() { first <- lc.Stop(context.Background()) }()
	for !stopping(&lc) {
		time.Sleep(time.Millisecond)
	}
	short, cancel := context.WithTimeout(t.Context(), 10*time.Millisecond)
	defer cancel()
	if err := lc.Stop(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second stop during a slow stop: %v", err)
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if err := lc.Stop(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// TestStopWithDoneContextStops: Stop with a context that is already done
// (a program that stops its services with the context whose cancellation
// told it to stop) cuts the graceful part off but stops the service, every
// time. Before, waiting for the token raced the done context: about half
// such Stops returned the context's error and left the service running,
// and the relay service's own stop then left its relayer running.
func TestStopWithDoneContextStops(t *testing.T) {
	t.Parallel()
	f := &fake{}
	done, cancel := context.WithCancel(t.Context())
	cancel()
	for i := range 100 {
		if err := f.Start(t.Context()); err != nil {
			t.Fatalf("start %d: %v", i, err)
		}
		_ = f.Stop(done)
		if f.lc.Running() || f.running.Load() != 0 {
			t.Fatalf("stop %d with a done context left the service running", i)
		}
	}
}

// stopping reports whether the token is held (a Start or Stop in progress).
func stopping(l *Lifecycle) bool {
	select {
	case l.token <- struct{}{}:
		<-l.token
		return false
	default:
		return true
	}
}

// TestStartStopStress starts and stops one service from many goroutines at
// once (run with -race): never two runs at a time, and after a final Stop
// nothing runs.
func TestStartStopStress(t *testing.T) {
	t.Parallel()
	f := &fake{}
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				if (g+i)%2 == 0 {
					if err := f.Start(t.Context()); err != nil && !errors.Is(err, ErrAlreadyStarted) {
						t.Error(err)
					}
				} else if err := f.Stop(t.Context()); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if err := f.Stop(t.Context()); err != nil || f.running.Load() != 0 || f.lc.Running() {
		t.Fatalf("after the final stop: %v, %d running", err, f.running.Load())
	}
	if f.started.Load() == 0 {
		t.Fatal("nothing ever started")
	}
}

func TestProcessIDsDiffer(t *testing.T) {
	t.Parallel()
	if a, b := ProcessID(), ProcessID(); a == b || a == "" {
		t.Fatalf("ProcessID() = %q, %q", a, b)
	}
}

// TestStartDone: the channel StartDone returns is closed once that start's
// service has been stopped, by any Stop, and not before; a failed start
// gives none; a restart gives a fresh one.
func TestStartDone(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	var l Lifecycle
	stopped := make(chan struct{})
	start := func(context.Context) (StopFunc, error) {
		return func(context.Context) error { close(stopped); return nil }, nil
	}
	if done, err := l.StartDone(ctx, func(context.Context) (StopFunc, error) { return nil, errBoom }); done != nil || !errors.Is(err, errBoom) {
		t.Fatalf("failed start: %v, %v", done, err)
	}
	done, err := l.StartDone(ctx, start)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
		t.Fatal("done before any stop")
	default:
	}
	if err := l.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	default:
		t.Fatal("not done after Stop returned")
	}
	select {
	case <-stopped:
	default:
		t.Fatal("done before the stop ran")
	}
	stopped = make(chan struct{})
	again, err := l.StartDone(ctx, start)
	if err != nil || again == done {
		t.Fatalf("restart: %v (same channel: %v)", err, again == done)
	}
	if err := l.Stop(ctx); err != nil {
		t.Fatal(err)
	}
}
