package retry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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

	want := []time.Duration{10, 20, 40, 40, 40, 40}
	for i := range want {
		if delays[i] != want[i]*time.Millisecond {
			t.Fatalf("delays = %v, want %v ms", delays, want)
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
