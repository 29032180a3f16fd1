package engine

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/rails"
)

// TestRetryLogEndedWindows: ended hands back, and forgets, the windows
// whose minute is over that hold retries not logged (at Stop, all of
// them), but never the window of the retry being logged, which its own
// line sums up.
func TestRetryLogEndedWindows(t *testing.T) {
	t.Parallel()
	var l retryLog
	at := time.Unix(1_000_000, 0)
	limited, down := retryLogKey{"ach", "RAIL_RATE_LIMITED"}, retryLogKey{"ach", "RAIL_UNAVAILABLE"}
	l.take(limited, at)
	l.take(limited, at.Add(time.Second))
	l.take(limited, at.Add(2*time.Second))
	l.take(down, at.Add(30*time.Second))
	l.take(down, at.Add(31*time.Second))
	if got := l.ended(at.Add(59*time.Second), false, nil); len(got) != 0 {
		t.Fatalf("within the minute: %v", got)
	}
	if got := l.ended(at.Add(retryLogEvery), false, &limited); len(got) != 0 {
		t.Fatalf("the window of the retry being logged was handed back: %v", got)
	}
	got := l.ended(at.Add(retryLogEvery), false, nil)
	if len(got) != 1 || got[0].key != limited || got[0].hidden != 2 || !got[0].since.Equal(at) {
		t.Fatalf("ended %v, want limited's 2 since %v", got, at)
	}
	if log, hidden := l.take(limited, at.Add(retryLogEvery+time.Second)); !log || hidden != 0 {
		t.Fatalf("the next retry of an ended window: log %v hidden %d, want a line of its own", log, hidden)
	}
	got = l.ended(at.Add(40*time.Second), true, nil)
	if len(got) != 1 || got[0].key != down || got[0].hidden != 1 {
		t.Fatalf("at Stop: %v, want down's 1", got)
	}
	if got := l.ended(at.Add(time.Hour), true, nil); len(got) != 0 {
		t.Fatalf("handed back twice: %v", got)
	}
}

// retryLines sums what a relayer's log says of its retries: the lines
// logged at Warn for one, and the retries its lines say were not logged.
func retryLines(h *recordingHandler) (warned int, notLogged int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range h.records {
		if r.Message == "attempt failed: will retry" && r.Level >= slog.LevelWarn {
			warned++
		}
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "retries_not_logged" {
				notLogged += a.Value.Int64()
			}
			return true
		})
	}
	return warned, notLogged
}

// refusingFirst is a rail that refuses its first n calls as rate limited
// (retryable, the breaker stays closed), then accepts.
func refusingFirst(n int64) rails.Transport {
	var calls atomic.Int64
	return funcTransport(func(context.Context, payment.Instruction) (rails.Result, error) {
		if calls.Add(1) <= n {
			return rails.Result{Code: rails.SandboxRateLimited, Message: "slow down"}, nil
		}
		return rails.Result{Code: rails.SandboxAccepted}, nil
	})
}

// TestRetriesNotLoggedAreLoggedAtStop: the retries of a rail's and code's
// last minute that were not logged at Warn are said at Stop when no retry
// came after them. The count was logged only on the next retry of the
// same rail and code, after the minute: never, if none came.
func TestRetriesNotLoggedAreLoggedAtStop(t *testing.T) {
	t.Parallel()
	const refusals = 5
	b := setup(t, rails.SandboxOptions{})
	b.useTransport(t, refusingFirst(refusals), 2*time.Second)
	cfg := b.config("retry-log-stop")
	logs := &recordingHandler{}
	cfg.Logger = slog.New(logs)
	r := b.start(t, cfg)
	b.enqueue(t, 1, 1)
	b.waitDispatched(t, 1, 60*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := r.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if warned, notLogged := retryLines(logs); int64(warned)+notLogged != refusals {
		t.Fatalf("%d retries logged at Warn and %d said not logged, want %d in all", warned, notLogged, refusals)
	}
}

// TestRetriesNotLoggedAreLoggedWhenTheirMinuteEnds: a window's count is
// logged once its minute is over, by the relayer's periodic tick, with no
// retry after it and no Stop. The relayer's clock of the retry log is the
// test's: the retries fall in one window, which ends when the test says.
func TestRetriesNotLoggedAreLoggedWhenTheirMinuteEnds(t *testing.T) {
	t.Parallel()
	const refusals = 5
	b := setup(t, rails.SandboxOptions{})
	b.useTransport(t, refusingFirst(refusals), 2*time.Second)
	cfg := b.config("retry-log-tick")
	logs := &recordingHandler{}
	cfg.Logger = slog.New(logs)
	r := b.newRelayer(t, cfg)
	var mu sync.Mutex
	now := time.Now()
	r.testHooks.retryLogNow = func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return now
	}
	r.testHooks.retryLogTick = 10 * time.Millisecond
	if err := r.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	b.enqueue(t, 1, 1)
	b.waitDispatched(t, 1, 60*time.Second)
	if warned, notLogged := retryLines(logs); warned != 1 || notLogged != 0 {
		t.Fatalf("within the window: %d lines at Warn, %d said not logged; want the first line only", warned, notLogged)
	}
	mu.Lock()
	now = now.Add(retryLogEvery)
	mu.Unlock()
	waitFor(t, 30*time.Second, "the window's retries not logged said", func() bool {
		_, notLogged := retryLines(logs)
		return notLogged == refusals-1
	})
	if n := logs.count(slog.LevelWarn, "attempts retried: not logged"); n != 1 {
		t.Fatalf("%d summary lines, want 1", n)
	}
}
