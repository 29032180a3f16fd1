package admin_test

import (
	"fmt"
	"maps"
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

// TestOverviewShowsADeadRelayersExpiredLeases: a relayer killed with its
// claims in flight holds no live lease, and its claims wait for the reaper
// once their leases end: the relayers table counted only live leases, so
// it showed that relayer with 0 in flight (or not at all, once its last
// archive write left the window), hiding exactly the rows an operator
// needs to see. Each relayer now shows its live and its expired leases,
// and one with expired leases is marked bad.
func TestOverviewShowsADeadRelayersExpiredLeases(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	admin.SetOverviewMaxAge(b.srv, time.Nanosecond) // each read fresh
	b.enqueue(t, "p1", "k1")
	b.enqueue(t, "p2", "k2")
	b.claim(t, "r-dead", 50*time.Millisecond)
	b.claim(t, "r-live", time.Hour)
	time.Sleep(150 * time.Millisecond) // r-dead's lease ends; no reaper runs
	var ov struct {
		Relayers []struct {
			RelayerID     string     `json:"relayer_id"`
			InFlight      int64      `json:"in_flight"`
			ExpiredLeases int64      `json:"expired_leases"`
			ExpiredSince  *time.Time `json:"expired_since"`
		} `json:"relayers"`
	}
	if code := b.call(t, "GET", "/api/v1/overview", auditorSecret, nil, &ov); code != http.StatusOK {
		t.Fatalf("overview: %d", code)
	}
	got := map[string]string{}
	for _, r := range ov.Relayers {
		got[r.RelayerID] = fmt.Sprintf("%d live, %d expired, since set %v", r.InFlight, r.ExpiredLeases, r.ExpiredSince != nil)
	}
	want := map[string]string{"r-dead": "0 live, 1 expired, since set true", "r-live": "1 live, 0 expired, since set false"}
	if !maps.Equal(got, want) {
		t.Fatalf("relayers %v, want %v", got, want)
	}
	page := consoleAt(t, b.url).get(t, "/console/")
	dead := regexp.MustCompile(`<tr class="bad"><td class="id">r-dead</td>.*<td class="num">0</td><td class="num">1</td><td><span class="badge expired"[^>]*>waiting for the reaper</span> <span class="nowrap">since \d{4}-`)
	live := regexp.MustCompile(`<tr><td class="id">r-live</td>.*<td class="num">1</td><td class="num">0</td><td><span class="nowrap">live until \d{4}-`)
	if !dead.MatchString(page) || !live.MatchString(page) {
		t.Fatalf("the relayers table does not mark r-dead's expired lease (or marks r-live):\n%s", page)
	}
}
