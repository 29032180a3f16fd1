package reaper

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
)

// recordedLogs keeps every record a logger is given, at every level.
type recordedLogs struct {
	mu      sync.Mutex
	records []slog.Record
}

func (h *recordedLogs) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordedLogs) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.records = append(h.records, r.Clone())
	return nil
}
func (h *recordedLogs) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *recordedLogs) WithGroup(string) slog.Handler      { return h }

// lines returns the records of message msg at level.
func (h *recordedLogs) lines(level slog.Level, msg string) []slog.Record {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []slog.Record
	for _, r := range h.records {
		if r.Level == level && r.Message == msg {
			out = append(out, r)
		}
	}
	return out
}

// attr returns the value of r's attribute key ("" when absent).
func attr(r slog.Record, key string) string {
	v := ""
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			v = a.Value.String()
			return false
		}
		return true
	})
	return v
}

// TestPassLogsItsRequeuesInSummary: a pass that requeues the claims of
// relayers that died logs one line for the pass (how many, how many per
// dead relayer, a few outbox ids for example) above debug, and a line
// per requeued instruction at debug only. It logged an INFO line per
// instruction: a relayer dying with thousands of claims logged thousands
// of lines at once, every one in the archive already.
func TestPassLogsItsRequeuesInSummary(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i := range 15 {
		b.enqueue(t, fmt.Sprintf("p%02d", i), fmt.Sprintf("k%02d", i))
	}
	dead := b.claim(t, "dead-1", 12, deadLease)
	dead = append(dead, b.claim(t, "dead-2", 10, deadLease)...)
	if len(dead) != 15 {
		t.Fatalf("claimed %d, want 15", len(dead))
	}
	b.waitExpired(t, dead)
	logs := &recordedLogs{}
	// Batches of 4: the summary is the pass's, not a batch's.
	r := b.newReaper(t, Config{ReaperID: "reaper-1", BatchSize: 4, Logger: slog.New(logs)})
	requeued, err := r.RunOnce(b.ctx)
	if err != nil || len(requeued) != 15 {
		t.Fatalf("requeued %d (%v), want 15", len(requeued), err)
	}
	if n := len(logs.lines(slog.LevelDebug, "requeued zombie instruction")); n != 15 {
		t.Errorf("%d debug lines of a requeued instruction, want 15", n)
	}
	above := 0
	logs.mu.Lock()
	for _, rec := range logs.records {
		if rec.Level > slog.LevelDebug {
			above++
		}
	}
	logs.mu.Unlock()
	summary := logs.lines(slog.LevelWarn, "requeued zombie instructions")
	if above != 1 || len(summary) != 1 {
		t.Fatalf("%d lines above debug, %d summaries; want the summary alone", above, len(summary))
	}
	s := summary[0]
	if attr(s, "count") != "15" || attr(s, "by_dead_relayer") != "dead-1=12 dead-2=3" {
		t.Errorf("summary count %q by_dead_relayer %q, want 15 and dead-1=12 dead-2=3", attr(s, "count"), attr(s, "by_dead_relayer"))
	}
	if ex := attr(s, "examples"); len(ex) == 0 || len(ex) > 5*37 {
		t.Errorf("summary examples %q, want up to 5 outbox ids", ex)
	}
}
