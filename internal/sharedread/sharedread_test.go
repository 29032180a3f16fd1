package sharedread

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// counter is a read that counts its calls and returns the count; while
// gate is set, each call waits for it to close.
type counter struct {
	n    atomic.Int64
	gate chan struct{}
	err  error
}

func (c *counter) read(ctx context.Context) (int64, error) {
	n := c.n.Add(1)
	if c.gate != nil {
		select {
		case <-c.gate:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	return n, c.err
}

func TestConcurrentCallersShareOneRead(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		c := &counter{gate: make(chan struct{})}
		v := New(5*time.Second, c.read)
		var wg sync.WaitGroup
		got := make([]int64, 10)
		for i := range got {
			wg.Go(func() {
				var err error
				if got[i], err = v.Get(t.Context()); err != nil {
					t.Error(err)
				}
			})
		}
		synctest.Wait() // all ten are in Get: one reads, nine wait
		close(c.gate)
		wg.Wait()
		if n := c.n.Load(); n != 1 {
			t.Fatalf("%d reads for ten concurrent callers, want 1", n)
		}
		for i, g := range got {
			if g != 1 {
				t.Errorf("caller %d got %d, want the one read's 1", i, g)
			}
		}
	})
}

func TestResultKeptForMaxAge(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		c := &counter{}
		v := New(5*time.Second, c.read)
		get := func(want int64) {
			t.Helper()
			if got, err := v.Get(t.Context()); err != nil || got != want {
				t.Fatalf("Get = %d, %v; want %d", got, err, want)
			}
		}
		get(1)
		time.Sleep(4 * time.Second)
		get(1) // 4 s old: kept
		time.Sleep(time.Second)
		get(2) // 5 s old: read again
		get(2)
	})
}

// TestAgeCountsFromTheReadsStart: a result is as old as the state it
// read, so a slow read does not extend how long it is kept.
func TestAgeCountsFromTheReadsStart(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		slow := func(ctx context.Context) (time.Time, error) {
			start := time.Now()
			time.Sleep(3 * time.Second)
			return start, nil
		}
		v := New(5*time.Second, slow)
		first, _ := v.Get(t.Context())
		time.Sleep(2 * time.Second) // 5 s after the read started
		if again, _ := v.Get(t.Context()); again.Equal(first) {
			t.Fatal("a read that started 5 s ago was still kept")
		}
	})
}

func TestFailedReadNotKept(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		boom := errors.New("boom")
		c := &counter{err: boom}
		v := New(time.Hour, c.read)
		if _, err := v.Get(t.Context()); !errors.Is(err, boom) {
			t.Fatalf("Get = %v, want boom", err)
		}
		c.err = nil
		if got, err := v.Get(t.Context()); err != nil || got != 2 {
			t.Fatalf("Get after a failure = %d, %v; want a second read's 2", got, err)
		}
	})
}

// TestWaiterGivesUpAlone: a caller whose context ends while it waits for
// another's read returns its context's error; the read goes on and its
// result is kept for the others.
func TestWaiterGivesUpAlone(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		c := &counter{gate: make(chan struct{})}
		v := New(time.Hour, c.read)
		var first int64
		done := make(chan struct{})
		go func() {
			defer close(done)
			first, _ = v.Get(t.Context())
		}()
		synctest.Wait()
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		if _, err := v.Get(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("waiter's Get = %v, want its deadline", err)
		}
		close(c.gate)
		<-done
		if got, err := v.Get(t.Context()); err != nil || got != 1 || first != 1 {
			t.Fatalf("after the read: first %d, then %d, %v; want the one read's 1 twice", first, got, err)
		}
	})
}

// TestPanickingReadReleasesWaiters: a read that panics must not leave
// the callers waiting on it stuck, nor stop the next read.
func TestPanickingReadReleasesWaiters(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		var calls atomic.Int64
		v := New(time.Hour, func(ctx context.Context) (int, error) {
			if calls.Add(1) == 1 {
				<-gate
				panic("boom")
			}
			return 7, nil
		})
		go func() {
			defer func() { _ = recover() }()
			_, _ = v.Get(t.Context())
		}()
		synctest.Wait()
		waited := make(chan error)
		go func() {
			_, err := v.Get(t.Context())
			waited <- err
		}()
		synctest.Wait()
		close(gate)
		if err := <-waited; !errors.Is(err, errPanicked) {
			t.Fatalf("waiter got %v, want errPanicked", err)
		}
		if got, err := v.Get(t.Context()); err != nil || got != 7 {
			t.Fatalf("Get after the panic = %d, %v; want 7", got, err)
		}
	})
}

// TestForgetReadsAgain: after Forget the next Get reads again, and a read
// that began before Forget is neither joined by later callers nor kept.
func TestForgetReadsAgain(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		c := &counter{}
		v := New(5*time.Second, c.read)
		for _, want := range []int64{1, 1} {
			if got, err := v.Get(t.Context()); err != nil || got != want {
				t.Fatalf("Get = %d, %v; want %d", got, err, want)
			}
		}
		v.Forget()
		if got, err := v.Get(t.Context()); err != nil || got != 2 {
			t.Fatalf("Get after Forget = %d, %v; want a new read's 2", got, err)
		}

		c.gate = make(chan struct{})
		v.Forget()
		var before, after int64
		var wg sync.WaitGroup
		wg.Go(func() { before, _ = v.Get(t.Context()) })
		synctest.Wait() // read 3 in progress
		v.Forget()
		wg.Go(func() { after, _ = v.Get(t.Context()) })
		synctest.Wait() // read 4 in progress beside it
		close(c.gate)
		wg.Wait()
		if before != 3 || after != 4 {
			t.Fatalf("the caller before Forget got %d (want 3), the one after %d (want 4)", before, after)
		}
		c.gate = nil
		if got, err := v.Get(t.Context()); err != nil || got != 4 {
			t.Fatalf("Get = %d, %v; want the kept read 4, not the forgotten 3", got, err)
		}
	})
}
