package admin_test

import (
	"errors"
	"testing"
	"time"

	"github.com/ledgerline/outbox/admin"
	"github.com/ledgerline/outbox/internal/store"
)

// TestPauseChangedIsExported: a Go program embedding the admin server
// tells ResumeRailShown's refusal of a pause that changed with
// errors.Is(err, admin.ErrPauseChanged). The sentinel lived only in
// internal/store, which no program outside the module can import. It is
// the same value, so both match.
func TestPauseChangedIsExported(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	if _, err := b.srv.PauseRail(b.ctx, "sandbox", "oscar", admin.ActionPause, "maintenance"); err != nil {
		t.Fatal(err)
	}
	res, err := b.srv.ResumeRailShown(b.ctx, "sandbox", time.Now().Add(-time.Hour), "oscar", "over")
	if !errors.Is(err, admin.ErrPauseChanged) || !errors.Is(err, store.ErrPauseChanged) || res.Done || res.Error != admin.PauseChanged {
		t.Fatalf("resume of a pause not in force: %+v, %v; want admin.ErrPauseChanged", res, err)
	}
}
