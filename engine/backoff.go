package engine

import (
	"math"
	"math/rand/v2"
	"time"
)

// Backoff is capped exponential backoff with full jitter: the n-th retry
// waits a uniformly random time in [0, min(Cap, Base·2^(n-1))]. Full jitter
// spreads a burst of failures (a rail outage) so the retries do not arrive
// as a new burst.
type Backoff struct {
	Base time.Duration
	Cap  time.Duration
}

// Bound is the largest delay of the n-th retry (n >= 1).
func (b Backoff) Bound(n int) time.Duration {
	if n < 1 {
		n = 1
	}
	d := b.Base
	for i := 1; i < n; i++ {
		if d >= b.Cap/2 {
			return b.Cap
		}
		d *= 2
	}
	return min(d, b.Cap)
}

// Delay draws the delay of the n-th retry from rnd.
func (b Backoff) Delay(n int, rnd *rand.Rand) time.Duration {
	bound := b.Bound(n)
	switch {
	case bound <= 0:
		return 0
	case bound == math.MaxInt64:
		// bound+1 would wrap (Int64N panics on it); Int64 draws from
		// [0, MaxInt64] already.
		return time.Duration(rnd.Int64())
	}
	return time.Duration(rnd.Int64N(int64(bound) + 1))
}
