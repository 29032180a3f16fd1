package admin_test

import (
	"strings"
	"testing"
	"time"

	"github.com/ledgerline/outbox/admin"
	"github.com/ledgerline/outbox/rails"
)

// TestOverviewCountsIdleRelayers: a relayer with nothing to claim writes
// nothing to the archive and holds no lease, so the overview's relayers
// table, which lists those, said "No relayer seen." of a fleet that was
// up and waiting: the page now says how many relayers are registered idle.
func TestOverviewCountsIdleRelayers(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	admin.SetOverviewMaxAge(b.srv, time.Nanosecond) // each read fresh
	stop := b.relayWith(t, rails.SandboxOptions{})
	defer stop()
	waitFor(t, "the relayer to register idle", func() bool {
		var ov admin.Overview
		b.call(t, "GET", "/api/v1/overview", auditorSecret, nil, &ov)
		return ov.Queue.IdleRelayers == 1
	})
	page := consoleAt(t, b.url).get(t, "/console/")
	if !strings.Contains(page, "1 relayer registered idle") {
		t.Fatalf("the overview does not count the idle relayer:\n%s", page)
	}
}
