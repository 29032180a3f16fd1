// Package sharedread shares one read among the callers that want it at
// about the same time. Queue-wide figures (the queue snapshot, the rails'
// recent activity) cost the database a pass over the queue or a stretch
// of the archive, and every metrics scrape and every open console page
// asks for them: during a backlog, which is when they cost most, more
// people look. Behind a [Value], a process reads them at most once per
// MaxAge however many callers there are.
package sharedread

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Value is a read whose result is shared: callers that ask while a read
// is in progress wait for it, and callers that ask within MaxAge of a
// successful read's start get its result. A failed read is not kept: the
// next caller reads again. The zero Value is not usable; create one with
// [New].
type Value[T any] struct {
	read   func(context.Context) (T, error)
	maxAge time.Duration

	mu       sync.Mutex
	val      T
	at       time.Time // when the kept read started; zero: none kept
	inFlight *call[T]
	gen      uint64 // Forget's count: a read begun before a Forget is not kept
}

// call is a read in progress.
type call[T any] struct {
	done chan struct{} // closed when val and err are set
	val  T
	err  error
	gen  uint64
}

// New returns a Value that reads with read and keeps a result for maxAge.
func New[T any](maxAge time.Duration, read func(context.Context) (T, error)) *Value[T] {
	return &Value[T]{read: read, maxAge: maxAge}
}

// Get returns the kept result if its read started less than MaxAge ago;
// otherwise it waits for the read in progress or starts one, on ctx. A
// caller whose ctx ends while it waits for another caller's read returns
// ctx's error; the read goes on for the others.
func (v *Value[T]) Get(ctx context.Context) (T, error) {
	v.mu.Lock()
	if !v.at.IsZero() && time.Since(v.at) < v.maxAge {
		val := v.val
		v.mu.Unlock()
		return val, nil
	}
	if c := v.inFlight; c != nil && c.gen == v.gen {
		v.mu.Unlock()
		select {
		case <-c.done:
			return c.val, c.err
		case <-ctx.Done():
			var zero T
			return zero, ctx.Err()
		}
	}
	c := &call[T]{done: make(chan struct{}), gen: v.gen}
	v.inFlight = c
	start := time.Now()
	v.mu.Unlock()

	// Deferred, so that waiters are released even if read panics.
	defer func() {
		v.mu.Lock()
		if v.inFlight == c {
			v.inFlight = nil
		}
		if c.err == nil && c.gen == v.gen {
			v.val, v.at = c.val, start
		}
		v.mu.Unlock()
		close(c.done)
	}()
	c.err = errPanicked
	c.val, c.err = v.read(ctx)
	return c.val, c.err
}

// errPanicked is what waiters get from a read that panicked.
var errPanicked = errors.New("sharedread: the read panicked")

// Forget drops the kept result, after a change the caller made itself (an
// operator's action that the next page must show): the next Get reads
// again, and a read in progress, begun before the change, is neither kept
// nor given to callers that ask after Forget.
func (v *Value[T]) Forget() {
	v.mu.Lock()
	v.gen++
	v.at = time.Time{}
	v.mu.Unlock()
}
