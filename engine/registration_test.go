package engine

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/ledgerline/outbox/rails"
)

// newLogged makes a relayer of id on b's pool that logs to logs and
// refreshes its registration every refresh.
func (b *testBundle) newLogged(t *testing.T, id string, logs *lockedBuffer, refresh time.Duration) *Relayer {
	t.Helper()
	cfg := b.config(id)
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	r, err := New(b.pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.testHooks.runRefresh = refresh
	return r
}

// startAndCleanUp starts r and stops it when the test ends.
func (b *testBundle) startAndCleanUp(t *testing.T, r *Relayer) {
	t.Helper()
	if err := r.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = r.Stop(ctx)
	})
}

// runsOf counts the registered runs of relayer id.
func (b *testBundle) runsOf(t *testing.T, id string) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox.relayer_runs WHERE relayer_id = $1`, id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestTwoRelayersUnderOneIDAreDetected: two relayers started under one
// relayer id each find the other at a refresh of its registration: an
// ERROR line naming the other run, Stats.IDConflicts, and Health.SharedID
// (the readiness probe's degraded reason). Once one stops, the other's
// next refresh finds nobody.
func TestTwoRelayersUnderOneIDAreDetected(t *testing.T) {
	t.Parallel()
	b := setup(t, rails.SandboxOptions{})
	var logsA, logsB lockedBuffer
	a := b.newLogged(t, "shared", &logsA, 20*time.Millisecond)
	c := b.newLogged(t, "shared", &logsB, 20*time.Millisecond)
	b.startAndCleanUp(t, a)
	b.startAndCleanUp(t, c)
	idA, idC := a.current.Load().reg.id.String(), c.current.Load().reg.id.String()
	for deadline := time.Now().Add(30 * time.Second); a.Stats().IDConflicts == 0 || c.Stats().IDConflicts == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("not detected: conflicts %d and %d", a.Stats().IDConflicts, c.Stats().IDConflicts)
		}
	}
	for _, x := range []struct {
		name        string
		r           *Relayer
		logs        *lockedBuffer
		self, other string
	}{{"first", a, &logsA, idA, idC}, {"second", c, &logsB, idC, idA}} {
		if h := x.r.Health(); !strings.Contains(h.SharedID, x.other) {
			t.Errorf("%s: Health.SharedID %q, want the other run %s named", x.name, h.SharedID, x.other)
		}
		found := false
		for _, line := range strings.Split(x.logs.String(), "\n") {
			if strings.Contains(line, "level=ERROR") && strings.Contains(line, "another relayer is running under this relayer id") &&
				strings.Contains(line, "run_id="+x.self) && strings.Contains(line, "other_run_id="+x.other) && strings.Contains(line, "other_pid=") {
				found = true
			}
		}
		if !found {
			t.Errorf("%s: no ERROR line naming both runs; log:\n%s", x.name, x.logs.String())
		}
	}
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	if err := c.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); a.Health().SharedID != ""; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("still shared after the other stopped: %q", a.Health().SharedID)
		}
	}
}

// TestAGracefulStopFreesTheRelayerID: a relayer stopped gracefully removes
// its registration, so one started at once under the same id finds no
// other run (no WARN, no ERROR, nothing shared), and is the id's only
// registration.
func TestAGracefulStopFreesTheRelayerID(t *testing.T) {
	t.Parallel()
	b := setup(t, rails.SandboxOptions{})
	var logsA, logsB lockedBuffer
	a := b.newLogged(t, "fixed", &logsA, 20*time.Millisecond)
	b.startAndCleanUp(t, a)
	b.enqueue(t, 20, 4)
	b.waitDrained(t, 30*time.Second)
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	if err := a.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if n := b.runsOf(t, "fixed"); n != 0 {
		t.Fatalf("%d registrations of the id after a graceful stop, want 0", n)
	}
	again := b.newLogged(t, "fixed", &logsB, 20*time.Millisecond)
	b.startAndCleanUp(t, again)
	refreshed := again.current.Load().reg.refreshes.Load() + 3
	b.enqueue(t, 20, 4)
	b.waitDrained(t, 30*time.Second)
	for deadline := time.Now().Add(30 * time.Second); again.current.Load().reg.refreshes.Load() < refreshed; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the registration is not refreshed")
		}
	}
	if s := logsB.String(); strings.Contains(s, "level=WARN") || strings.Contains(s, "level=ERROR") {
		t.Errorf("the restart logged a warning or an error:\n%s", s)
	}
	if h, st := again.Health(), again.Stats(); h.SharedID != "" || st.IDConflicts != 0 {
		t.Errorf("after a graceful stop and a restart: shared %q, conflicts %d; want none", h.SharedID, st.IDConflicts)
	}
	if n := b.runsOf(t, "fixed"); n != 1 {
		t.Errorf("%d registrations of the id, want the restart's alone", n)
	}
}

// TestRegistrationIsNotRefreshedPerClaim: a relayer's claims send no
// registration statement: with the refresh timer far off, a drain of
// many claims leaves the one registration made at start as it was.
func TestRegistrationIsNotRefreshedPerClaim(t *testing.T) {
	t.Parallel()
	b := setup(t, rails.SandboxOptions{})
	var logs lockedBuffer
	r := b.newLogged(t, "claims", &logs, time.Hour)
	r.cfg.BatchSize = 1
	b.startAndCleanUp(t, r)
	b.enqueue(t, 40, 40)
	b.waitDrained(t, 60*time.Second)
	statsOnceDispatched(t, r, 40)
	// Claims go on at the poll (100 ms), finding nothing.
	st := r.Stats()
	for deadline := time.Now().Add(60 * time.Second); st.Claims < 60; st = r.Stats() {
		if time.Now().After(deadline) {
			t.Fatalf("%d claims, want 60", st.Claims)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := r.current.Load().reg.refreshes.Load(); n != 1 {
		t.Errorf("%d registration statements over %d claims, want 1 (at start)", n, st.Claims)
	}
	var refreshed bool
	if err := b.pool.QueryRow(b.ctx, `SELECT seen_at <> started_at FROM outbox.relayer_runs WHERE relayer_id = 'claims'`).Scan(&refreshed); err != nil || refreshed {
		t.Errorf("the registration was refreshed (%v, %v), want it as made at start", refreshed, err)
	}
}

// TestARemovedRegistrationIsMadeAgain: a run's refresh never makes its
// registration (store.RunParams.Refresh), so a row removed while the run
// goes on (the reaper's pass removes one that could not refresh for over
// an hour) is made again by the next refresh, with a WARN line, and the
// run keeps its id and start.
func TestARemovedRegistrationIsMadeAgain(t *testing.T) {
	t.Parallel()
	b := setup(t, rails.SandboxOptions{})
	var logs lockedBuffer
	r := b.newLogged(t, "removed", &logs, 20*time.Millisecond)
	b.startAndCleanUp(t, r)
	id := r.current.Load().reg.id
	if _, err := b.pool.Exec(b.ctx, `DELETE FROM outbox.relayer_runs WHERE run_id = $1`, id); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(logs.String(), "registering it again"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no WARN about the removed registration; log:\n%s", logs.String())
		}
	}
	var n int
	for deadline := time.Now().Add(30 * time.Second); n != 1; time.Sleep(10 * time.Millisecond) {
		if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox.relayer_runs WHERE run_id = $1 AND relayer_id = 'removed'`, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d registrations of the run after its row was removed, want it made again", n)
		}
	}
}
