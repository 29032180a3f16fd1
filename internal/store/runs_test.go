package store_test

import (
	"errors"
	"testing"
	"time"

	"github.com/ledgerline/outbox/internal/store"
)

// TestARefreshNeverMakesARegistration: a refresh (RunParams.Refresh)
// extends a registration that exists and never makes one. A run's stop
// removes its registration after its last refresh returned; a refresh it
// gave up on can still reach the server after that (its cancel request
// came before the statement did), and as an upsert it made the row again:
// the id looked shared with a run that had stopped, for a minute.
func TestARefreshNeverMakesARegistration(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	run := b.registerRun(t, "r1", time.Second)
	p := store.RunParams{RunID: run.RunID, RelayerID: "r1", Host: "test-host", PID: 1, ClaimsFor: time.Hour, Refresh: true}
	self, others, err := b.st.RegisterRun(b.ctx, b.pool, p)
	if err != nil || self.RunID != run.RunID || len(others) != 0 {
		t.Fatalf("refresh: %+v, %+v, %v", self, others, err)
	}
	if !self.ClaimsUntil.After(run.ClaimsUntil.Add(30*time.Minute)) || !self.SeenAt.After(run.SeenAt) {
		t.Errorf("refreshed %+v after %+v: want claims_until an hour on and seen_at later", self, run)
	}
	if err := b.st.EndRun(b.ctx, b.pool, run.RunID); err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.st.RegisterRun(b.ctx, b.pool, p); !errors.Is(err, store.ErrRunNotRegistered) {
		t.Fatalf("refresh after the run ended: %v, want ErrRunNotRegistered", err)
	}
	if runs, err := b.st.Runs(b.ctx, b.pool); err != nil || len(runs) != 0 {
		t.Fatalf("runs %+v, %v after a refresh of an ended run: want none", runs, err)
	}
}
