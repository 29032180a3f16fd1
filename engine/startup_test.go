package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/internal/retry"
	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/migrations"
	"github.com/ledgerline/outbox/rails"
)

// poolFor opens a pool on url with one of its parts changed.
func poolFor(t *testing.T, rawURL string, change func(u *url.URL)) *pgxpool.Pool {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	change(u)
	pool, err := pgxpool.New(t.Context(), u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// TestStartRefusesWhatRetryingCannotFix: credentials the server refuses, a
// database that does not exist, a role without privileges, a schema that is
// not migrated or behind this build: Start returns a clear error at once and
// nothing runs (no claim is ever made).
func TestStartRefusesWhatRetryingCannotFix(t *testing.T) {
	t.Parallel()
	b := setup(t, rails.SandboxOptions{})
	dbURL := testdb.URL(t)
	admin, err := pgxpool.New(b.ctx, testdb.AdminURL(t)) // the test database's owner may not create roles
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	role := fmt.Sprintf("noaccess_%d", time.Now().UnixNano())
	if _, err := admin.Exec(b.ctx, "CREATE ROLE "+role+" LOGIN"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Exec(context.Background(), "DROP ROLE IF EXISTS "+role) })
	if err := migrations.MigrateWith(b.ctx, b.pool, migrations.Options{Schema: "behind", TargetVersion: 1}); err != nil {
		t.Fatal(err)
	}

	for _, tt := range []struct {
		name   string
		pool   *pgxpool.Pool
		schema string
		want   string
	}{
		{"unknown role", poolFor(t, dbURL, func(u *url.URL) { u.User = url.UserPassword("nobody_here", "wrong") }), "", "credentials"},
		{"no such database", poolFor(t, dbURL, func(u *url.URL) { u.Path = "/no_such_database" }), "", "does not exist"},
		{"no privilege", poolFor(t, dbURL, func(u *url.URL) { u.User = url.User(role) }), "", "privilege"},
		{"schema not migrated", b.pool, "never_migrated", "not migrated"},
		{"schema behind", b.pool, "behind", "version 1"},
	} {
		cfg := b.config("r-" + tt.name)
		cfg.Schema = tt.schema
		r, err := New(tt.pool, cfg)
		if err != nil {
			t.Fatal(err)
		}
		err = r.Start(b.ctx)
		if err == nil {
			r.Stop(b.ctx)
			t.Errorf("%s: Start succeeded", tt.name)
			continue
		}
		if !retry.Permanent(err) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: Start = %v; want a permanent error mentioning %q", tt.name, err, tt.want)
		}
		if st := r.Stats(); st.Claims != 0 {
			t.Errorf("%s: %d claims after a refused start", tt.name, st.Claims)
		}
		if r.lc.Running() || r.current.Load() != nil {
			t.Errorf("%s: running after a refused Start", tt.name)
		}
	}
	var schemaErr *migrations.SchemaError
	r, _ := New(b.pool, Config{Rails: b.rails, Schema: "behind"})
	if err := r.Start(b.ctx); !errors.As(err, &schemaErr) || schemaErr.Current != 1 || schemaErr.Latest != migrations.Latest() {
		t.Errorf("Start on a schema at version 1 = %v, want a *migrations.SchemaError", err)
	}
}

// TestStartWhileDatabaseUnreachable: an unreachable database is not a
// reason to refuse: the relayer starts, keeps trying (the schema check it
// could not make at start, before any claim), and stops cleanly.
func TestStartWhileDatabaseUnreachable(t *testing.T) {
	t.Parallel()
	b := setup(t, rails.SandboxOptions{})
	pool := poolFor(t, testdb.URL(t), func(u *url.URL) { u.Host = "127.0.0.1:1" })
	cfg := b.config("unreachable")
	logs := &recordingHandler{}
	cfg.Logger = slog.New(logs)
	r, err := New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(b.ctx); err != nil {
		t.Fatalf("Start with the database unreachable: %v", err)
	}
	waitFor(t, 10*time.Second, "a failed schema check", func() bool { return logs.count(slog.LevelWarn, "schema check failing") >= 1 })
	if n := r.Stats().Claims; n != 0 {
		t.Errorf("%d claims before the schema was checked", n)
	}
	if err := r.Stop(b.ctx); err != nil {
		t.Fatal(err)
	}
}

// recordingHandler keeps every log record.
type recordingHandler struct {
	mu      sync.Mutex
	records []slog.Record
}

func (h *recordingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordingHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	h.records = append(h.records, r)
	h.mu.Unlock()
	return nil
}
func (h *recordingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *recordingHandler) WithGroup(string) slog.Handler      { return h }

// count returns how many records at level or above start with prefix.
func (h *recordingHandler) count(level slog.Level, prefix string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, r := range h.records {
		if r.Level >= level && strings.HasPrefix(r.Message, prefix) {
			n++
		}
	}
	return n
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestClaimFailuresLoggedOncePerState: while every claim fails the same
// way, one warning is logged (not one per attempt), the attempts back off
// (bounded by the backoff schedule, however fast the machine), and the
// recovery is logged once.
func TestClaimFailuresLoggedOncePerState(t *testing.T) {
	t.Parallel()
	b := setup(t, rails.SandboxOptions{})
	cfg := b.config("failing")
	cfg.PollOnly = true
	logs := &recordingHandler{}
	cfg.Logger = slog.New(logs)
	r := b.start(t, cfg)
	waitFor(t, 10*time.Second, "a first claim", func() bool { return r.Stats().Claims >= 1 })

	if _, err := b.pool.Exec(b.ctx, `ALTER TABLE outbox.pending RENAME TO pending_gone`); err != nil {
		t.Fatal(err)
	}
	start, before := time.Now(), r.Stats().Claims
	waitFor(t, 30*time.Second, "six failed claims", func() bool { return r.Stats().Claims >= before+6 })
	elapsed, attempts := time.Since(start), r.Stats().Claims-before
	if _, err := b.pool.Exec(b.ctx, `ALTER TABLE outbox.pending_gone RENAME TO pending`); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the recovery line", func() bool { return logs.count(slog.LevelInfo, "claim recovered") == 1 })

	if n := logs.count(slog.LevelWarn, "claim"); n != 1 {
		t.Errorf("%d warnings about failing claims, want 1 (once per state)", n)
	}
	// Attempt k (k >= 1) waits 50ms * 2^(k-1) (capped at 5s) plus a poll
	// interval at most before the first failure shows: the number of
	// attempts in elapsed is at most the schedule's plus the one in flight.
	bound, waited := int64(2), time.Duration(0)
	for d := 50 * time.Millisecond; waited < elapsed; d = min(2*d, claimBackoffCap) {
		waited += d
		bound++
	}
	if attempts > bound {
		t.Errorf("%d claim attempts in %v while failing; the backoff schedule allows %d", attempts, elapsed, bound)
	}
}

// TestNotifyStormIsBoundedByDebounce: anyone who can connect can NOTIFY the
// relayers' channel. A storm of notifications turns into at most one claim
// per debounce window (plus polls and idle refreshes), not one claim per
// notification.
//
// The storm goes on until the relayer has received ten times as many
// notifications as the bound allows claims (30 s at most, or the test
// fails as proving nothing), so it is always a storm (a storm of 2 s was skipped when
// fewer came); and the window ends once every notification sent has
// arrived, rather than after a sleep. The debounce rule itself keeps the
// claims under the bound (notified claims start a window apart), so the
// claims' nearness to it (32 of 40 in a run here) is no risk: one claim per
// notification would be ten times it.
func TestNotifyStormIsBoundedByDebounce(t *testing.T) {
	t.Parallel()
	b := setup(t, rails.SandboxOptions{})
	cfg := b.config("storm")
	cfg.PollInterval = time.Second
	// A window long enough for any machine's storm to outnumber it
	// tenfold (the default, 2 ms, is only a few notifications long).
	cfg.Debounce = 100 * time.Millisecond
	r := b.start(t, cfg)
	waitFor(t, 10*time.Second, "the listener", func() bool { return r.current.Load().listening.Load() })

	conn, err := b.pool.Acquire(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	debounce := cfg.Debounce
	// One claim per debounce window, one per poll (the poll interval is
	// jittered down to 80%), two per idle refresh (goIdle claims twice),
	// and one in progress at each end.
	bound := func(window time.Duration) int64 {
		return int64(window/debounce) + int64(window/(cfg.PollInterval*8/10)) + 2*int64(window/DefaultIdleRefresh+1) + 2
	}
	claims0, notes0, start := r.Stats().Claims, r.Stats().Notifications, time.Now()
	// Bursts of notifications, each a transaction of its own with distinct
	// payloads (the relayer ignores them), so that none is folded into
	// another: every one arrives. With one NOTIFY a round trip, a machine
	// loaded enough could fall short of ten times the bound for ever.
	const burst = 20
	var sent int64
	for time.Since(start) < 2*time.Second || r.Stats().Notifications-notes0 < 10*bound(time.Since(start)) {
		if time.Since(start) > 30*time.Second {
			t.Fatalf("%d notifications sent in 30 s, %d received: not ten times the bound %d, the test proves nothing",
				sent, r.Stats().Notifications-notes0, bound(time.Since(start)))
		}
		if _, err := conn.Exec(b.ctx, "SELECT pg_notify('outbox_pending', g::text) FROM generate_series(1, $1::int) g", burst); err != nil {
			t.Fatal(err)
		}
		sent += burst
	}
	waitFor(t, time.Minute, "every notification sent", func() bool { return r.Stats().Notifications-notes0 >= sent })
	window := time.Since(start)
	st := r.Stats()
	claims, notes := st.Claims-claims0, st.Notifications-notes0
	t.Logf("%d NOTIFYs sent, %d received, %d claims in %v (bound %d)", sent, notes, claims, window.Round(time.Millisecond), bound(window))
	if claims > bound(window) {
		t.Fatalf("%d claims for %d notifications in %v: more than the debounce bound %d", claims, notes, window, bound(window))
	}
}
