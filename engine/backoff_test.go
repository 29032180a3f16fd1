package engine

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

func TestBackoffBoundGrowsAndCaps(t *testing.T) {
	t.Parallel()
	b := Backoff{Base: time.Second, Cap: 5 * time.Minute}
	want := []time.Duration{1, 2, 4, 8, 16, 32, 64, 128, 256}
	for i, w := range want {
		if got := b.Bound(i + 1); got != w*time.Second {
			t.Errorf("Bound(%d) = %v, want %v", i+1, got, w*time.Second)
		}
	}
	for _, n := range []int{10, 11, 30, 64, 1000} {
		if got := b.Bound(n); got != 5*time.Minute {
			t.Errorf("Bound(%d) = %v, want the cap", n, got)
		}
	}
}

func TestBackoffDelayWithinBoundAndSeeded(t *testing.T) {
	t.Parallel()
	b := Backoff{Base: time.Second, Cap: 5 * time.Minute}
	r1 := rand.New(rand.NewPCG(1, 2))
	r2 := rand.New(rand.NewPCG(1, 2))
	means := make([]float64, 12)
	for n := 1; n <= 12; n++ {
		var sum time.Duration
		for range 2000 {
			d := b.Delay(n, r1)
			if d2 := b.Delay(n, r2); d2 != d {
				t.Fatalf("same seed gave %v and %v", d, d2)
			}
			if d < 0 || d > b.Bound(n) {
				t.Fatalf("attempt %d: delay %v outside [0, %v]", n, d, b.Bound(n))
			}
			sum += d
		}
		means[n-1] = float64(sum) / 2000
	}
	// Full jitter: the mean is about half the bound, so it doubles per
	// attempt until the cap, then stays put.
	for n := 2; n <= 9; n++ {
		if ratio := means[n-1] / means[n-2]; ratio < 1.7 || ratio > 2.3 {
			t.Errorf("mean delay of attempt %d is %.2fx attempt %d's, want about 2x", n, ratio, n-1)
		}
	}
	if ratio := means[11] / means[10]; ratio < 0.9 || ratio > 1.1 {
		t.Errorf("capped attempts' mean delays differ by %.2fx", ratio)
	}
}

// TestBackoffDelayOfTheLongestCap: a cap of the longest Duration (a Go
// program's "no cap", time.Duration(math.MaxInt64)) draws delays within
// it. The draw asked rand for Int64N(bound+1), which wraps to a negative
// for that bound and panics: the first retry past the cap took the whole
// relayer down, from a dispatch goroutine, with every instruction it held
// left in flight for the reaper, which handed them to relayers that died
// the same way.
func TestBackoffDelayOfTheLongestCap(t *testing.T) {
	t.Parallel()
	b := Backoff{Base: time.Second, Cap: math.MaxInt64}
	rnd := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{1, 34, 64, 100} {
		d := b.Delay(n, rnd)
		if d < 0 || d > b.Bound(n) {
			t.Errorf("attempt %d: delay %v outside [0, %v]", n, d, b.Bound(n))
		}
	}
	if b.Bound(100) != math.MaxInt64 {
		t.Errorf("Bound(100) = %v, want the cap", b.Bound(100))
	}
}

// TestBackoffBoundIsTheCapForABaseAboveIt: Bound is min(Cap,
// Base·2^(n-1)) also for the first retry, whose base alone may exceed
// the cap (a Backoff built by hand; the relayer's configuration refuses
// one). The first retry's bound was the base.
func TestBackoffBoundIsTheCapForABaseAboveIt(t *testing.T) {
	t.Parallel()
	b := Backoff{Base: 10 * time.Second, Cap: 5 * time.Second}
	for _, n := range []int{0, 1, 2, 30} {
		if got := b.Bound(n); got != b.Cap {
			t.Errorf("Bound(%d) = %v, want the cap %v", n, got, b.Cap)
		}
	}
}

// TestBackoffDelayReachesItsBound: the delay is drawn from [0, bound],
// the bound included. With a bound of 1ns a draw is 0 or 1ns, and 64
// draws of a fixed seed include both; a draw from [0, bound) gave 0
// every time.
func TestBackoffDelayReachesItsBound(t *testing.T) {
	t.Parallel()
	b := Backoff{Base: time.Nanosecond, Cap: time.Nanosecond}
	rnd := rand.New(rand.NewPCG(1, 2))
	seen := map[time.Duration]bool{}
	for range 64 {
		seen[b.Delay(1, rnd)] = true
	}
	if len(seen) != 2 || !seen[0] || !seen[time.Nanosecond] {
		t.Fatalf("delays drawn %v, want 0 and 1ns", seen)
	}
}
