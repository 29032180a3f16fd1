package admin_test

import (
	"net/http"
	"regexp"
	"testing"
	"time"

	"github.com/ledgerline/outbox/admin"
	"github.com/ledgerline/outbox/internal/store"
)

// TestOverviewRelayersAreRelayers: the overview's relayers are the
// processes that claimed or recorded work; an operator who replayed,
// acknowledged or cancelled something (archive rows under the operator's
// name) is not one. Listed as a relayer seen seconds ago, an operator
// hides that no relayer is running.
func TestOverviewRelayersAreRelayers(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	dead := b.enqueue(t, "p1", "k1")
	b.record(t, b.claim(t, "r1", time.Hour), store.Failed, "RAIL_REJECTED", 0)
	queued := b.enqueue(t, "p2", "k2")
	reason := map[string]string{"reason": "refunded by hand"}
	if code := b.call(t, "POST", "/api/v1/dead-letters/"+dead.String()+"/acknowledge", operatorSecret, reason, nil); code != http.StatusOK {
		t.Fatalf("acknowledge: %d", code)
	}
	if code := b.call(t, "POST", "/api/v1/instructions/"+queued.String()+"/cancel", operatorSecret, reason, nil); code != http.StatusOK {
		t.Fatalf("cancel: %d", code)
	}
	var ov admin.Overview
	if code := b.call(t, "GET", "/api/v1/overview", auditorSecret, nil, &ov); code != http.StatusOK {
		t.Fatalf("overview: %d", code)
	}
	var ids []string
	for _, r := range ov.Relayers {
		ids = append(ids, r.RelayerID)
	}
	if len(ids) != 1 || ids[0] != "r1" {
		t.Fatalf("relayers %v, want only r1 (not the operator oscar)", ids)
	}
}

// oldestDueTile finds the overview's oldest due tile and its class.
var oldestDueTile = regexp.MustCompile(`<div class="tile ?(\w*)"><span class="n">[0-9.]+ s</span><span class="l">oldest due</span>`)

// TestOverviewOldestDueTileUsesTheThreshold: the overview shows the oldest
// due age as bad from the age /readyz calls degraded (Config.DegradedAfter),
// not from a fixed minute, so the page and the probe agree.
func TestOverviewOldestDueTileUsesTheThreshold(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		after time.Duration
		bad   bool
	}{{20 * time.Millisecond, true}, {0, false}} {
		b := setup(t, admin.Config{DegradedAfter: tc.after})
		b.enqueue(t, "p1", "k1")
		time.Sleep(100 * time.Millisecond)
		page := consoleAt(t, b.url).get(t, "/console/")
		// The tile's class, whatever its figure: past 0.1 s on a loaded
		// machine it read 0.2 and the test failed.
		m := oldestDueTile.FindStringSubmatch(page)
		if m == nil {
			t.Fatalf("no oldest due tile:\n%s", page)
		}
		if bad := m[1] == "bad"; bad != tc.bad {
			t.Errorf("DegradedAfter %s: the oldest due tile is bad: %v, want %v\n%s", tc.after, bad, tc.bad, page)
		}
	}
}
