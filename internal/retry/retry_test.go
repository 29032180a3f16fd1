package retry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

type records struct {
	mu   sync.Mutex
	msgs []string
}

func (h *records) Enabled(context.Context, slog.Level) bool { return true }
func (h *records) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.msgs = append(h.msgs, r.Level.String()+" "+r.Message)
	return nil
}
func (h *records) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *records) WithGroup(string) slog.Handler      { return h }

func TestLoopLogsOncePerState(t *testing.T) {
	t.Parallel()
	h := &records{}
	l := &Loop{Log: slog.New(h), What: "claim", Min: 10 * time.Millisecond, Max: 40 * time.Millisecond}
	down := &pgconn.PgError{Code: "57P01"}
	var delays []time.Duration
	for range 5 {
		delays = append(delays, l.Failed(down))
	}
	delays = append(delays, l.Failed(&pgconn.PgError{Code: "28P01"}))
	l.Succeeded()
	l.Succeeded()

	// The backoff, each wait drawn between its half and itself.
	want := []time.Duration{10, 20, 40, 40, 40, 40}
	for i := range want {
		if w := want[i] * time.Millisecond; delays[i] < w/2 || delays[i] > w {
			t.Fatalf("delays = %v, want each within [half, all] of %v ms", delays, want)
		}
	}
	var warnOrInfo []string
	for _, m := range h.msgs {
		if m[:5] != "DEBUG" {
			warnOrInfo = append(warnOrInfo, m)
		}
	}
	wantLogs := []string{
		"WARN claim failing; retrying with backoff, logged again when this changes",
		"WARN claim still failing, differently now",
		"INFO claim recovered",
	}
	if fmt.Sprint(warnOrInfo) != fmt.Sprint(wantLogs) {
		t.Fatalf("logged %q, want %q", warnOrInfo, wantLogs)
	}
	if l.Failing() {
		t.Fatal("still failing after Succeeded")
	}
}

type selfPermanent struct{ p bool }

func (e selfPermanent) Error() string   { return "x" }
func (e selfPermanent) Permanent() bool { return e.p }

func TestPermanent(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		err  error
		want bool
	}{
		{&pgconn.PgError{Code: "28P01"}, true},
		{&pgconn.PgError{Code: "28000"}, true},
		{&pgconn.PgError{Code: "3D000"}, true},
		{&pgconn.PgError{Code: "42501"}, true},
		{fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: "28P01"}), true},
		{selfPermanent{true}, true},
		{fmt.Errorf("wrapped: %w", selfPermanent{false}), false},
		{&pgconn.PgError{Code: "57P01"}, false},
		{&pgconn.PgError{Code: "55P03"}, false},
		{errors.New("connection refused"), false},
		{context.DeadlineExceeded, false},
	} {
		if got := Permanent(tt.err); got != tt.want {
			t.Errorf("Permanent(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}

// Every relayer of a fleet loses the database in the same instant (a
// restart, a failover), and each of its loops (claims, outcome writes,
// the listener) backs off from then on. With the same delays they retried
// in lockstep for as long as it was down, every relayer's connects and
// statements arriving together, and the first retry after it came back
// was the whole fleet's at once. Jittered, loops that started failing
// together retry apart.
func TestLoopsFailingTogetherRetryApart(t *testing.T) {
	t.Parallel()
	const loops, failures = 10, 8
	const lo, hi = 50 * time.Millisecond, 5 * time.Second
	down := &pgconn.PgError{Code: "57P01"}
	last := make([]time.Duration, loops)
	for i := range loops {
		l := &Loop{Log: slog.New(slog.DiscardHandler), What: "claim", Min: lo, Max: hi}
		for range failures {
			last[i] = l.Failed(down)
		}
	}
	shortest, longest := hi, time.Duration(0)
	for _, d := range last {
		if d < hi/2 || d > hi {
			t.Errorf("a capped retry waits %s, want between %s and %s", d, hi/2, hi)
		}
		shortest, longest = min(shortest, d), max(longest, d)
	}
	// Ten draws over half the cap span a fifth of it but for a chance of
	// about 4e-6.
	if longest-shortest < hi/10 {
		t.Errorf("ten loops that failed together wait %s to %s before their next retry: in lockstep", shortest, longest)
	}
}

// TestLoopBackoffSaturates: the doubling stops at Max however long the
// delays. Past half of time.Duration's range (a delay of about 146 years,
// an interval flag given in hours with a slip of the finger) 2*delay
// wrapped to a negative wait: the loop retried at once, again and again,
// more often the longer it was asked to wait.
func TestLoopBackoffSaturates(t *testing.T) {
	t.Parallel()
	const long = time.Duration(math.MaxInt64/2 + 1)
	l := &Loop{Log: slog.New(slog.DiscardHandler), What: "reaper pass", Min: long, Max: math.MaxInt64}
	down := &pgconn.PgError{Code: "57P01"}
	for i := range 4 {
		if d := l.Failed(down); d < long/2 {
			t.Fatalf("failure %d: waits %v, want at least %v", i+1, d, long/2)
		}
	}
}
