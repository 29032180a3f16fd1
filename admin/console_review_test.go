package admin_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/ledgerline/outbox/admin"
	"github.com/ledgerline/outbox/internal/store"
)

// shoot takes the page in ctx at 800 and 1280 px wide into dir (the
// test's artifact directory: go test -artifacts keeps it), and leaves it
// at 1280.
func shoot(t *testing.T, ctx context.Context, dir, name string) {
	t.Helper()
	for _, width := range []int64{800, 1280} {
		if err := do(ctx, chromedp.EmulateViewport(width, 900)); err != nil {
			t.Fatal(err)
		}
		png, err := run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%s-%d.png", name, width)), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestDeadRelayerStandsOutInBrowser: in a real Chromium, at 1280 and
// 800 px, the overview's row of a relayer killed with a claim in flight
// (its lease ended, no reaper yet) is red and says its claim waits for
// the reaper, while a live relayer's row is plain; the instructions
// list's badges say their states in words. Screenshots of the overview,
// the instructions and the dead letters go to the artifact directory.
func TestDeadRelayerStandsOutInBrowser(t *testing.T) {
	t.Parallel()
	bin := chromium(t)
	b := setup(t, admin.Config{})
	admin.SetOverviewMaxAge(b.srv, time.Nanosecond)
	shots := t.ArtifactDir()
	b.enqueue(t, "acme-payroll", "k1")
	b.record(t, b.claim(t, "relayer-7f3a", time.Hour), store.Failed, "RAIL_REJECTED", 0)
	b.enqueue(t, "globex", "k2")
	b.record(t, b.claim(t, "relayer-7f3a", time.Hour), store.Retryable, "RAIL_TIMEOUT", time.Hour)
	b.enqueue(t, "initech", "k3")
	b.enqueue(t, "initech", "k4") // queued behind k3
	b.enqueue(t, "umbrella", "k5")
	b.enqueue(t, "hooli", "k6")
	b.claim(t, "relayer-dead-01", 50*time.Millisecond) // initech's k3, killed
	b.claim(t, "relayer-live-02", time.Hour)           // umbrella's k5
	time.Sleep(150 * time.Millisecond)
	ctx := b.signedIn(t, bin, operatorSecret)
	for _, width := range []int64{1280, 800} {
		if err := do(ctx, chromedp.EmulateViewport(width, 900), chromedp.Navigate(b.url+"/console/"), waitVisible("table.relayers")); err != nil {
			t.Fatal(err)
		}
		rows, err := run(ctx, chromedp.Evaluate[map[string]string](`Object.fromEntries([...document.querySelectorAll("table.relayers tbody tr")].map(r =>
		  [r.cells[0].innerText, getComputedStyle(r.cells[2]).backgroundColor + " | " + r.innerText.replace(/\s+/g, " ")]))`))
		if err != nil {
			t.Fatal(err)
		}
		dead, live := rows["relayer-dead-01"], rows["relayer-live-02"]
		if !strings.HasPrefix(dead, "rgb(254, 243, 242) |") || !strings.Contains(dead, "waiting for the reaper") ||
			!strings.HasPrefix(live, "rgba(0, 0, 0, 0) |") || strings.Contains(live, "reaper") {
			t.Errorf("at %d px the relayers' rows: %q", width, rows)
		}
	}
	shoot(t, ctx, shots, "overview-dead-relayer")
	if err := do(ctx, chromedp.Navigate(b.url+"/console/instructions?state=pending"), waitVisible("table")); err != nil {
		t.Fatal(err)
	}
	badges, err := run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("td > span.badge[class*=st-]")].map(s => s.innerText + " / " + s.title)`))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(badges, ", "); got != "waiting to retry / state retry_wait, queued / state queued, due / state due" {
		t.Errorf("the pending instructions' badges: %s", got)
	}
	shoot(t, ctx, shots, "instructions-words")
	if err := do(ctx, chromedp.Navigate(b.url+"/console/instructions?state=in_flight"), waitVisible("table")); err != nil {
		t.Fatal(err)
	}
	shoot(t, ctx, shots, "instructions-in-flight")
	if err := do(ctx, chromedp.Navigate(b.url+"/console/dead-letters"), waitVisible("table.dead")); err != nil {
		t.Fatal(err)
	}
	shoot(t, ctx, shots, "dead-letters-order")
	if err := do(ctx, chromedp.Navigate(b.url+"/console/participant?id=globex"), waitVisible("section.card")); err != nil {
		t.Fatal(err)
	}
	shoot(t, ctx, shots, "participant-words")
	t.Logf("screenshots in %s", shots)
}

// TestStandbyConsoleInBrowser: in a real Chromium, an operator's console
// whose database is a streaming standby shows, on every page, the line
// that it is a read-only standby and where actions are taken, visible at
// 1280 and 800 px, and no replay, acknowledge, cancel or pause form.
// Screenshots of its pages go to the artifact directory.
func TestStandbyConsoleInBrowser(t *testing.T) {
	t.Parallel()
	bin := chromium(t)
	primary, b := setupOwnCluster(t)
	b.enqueue(t, "acme-payroll", "k1")
	b.record(t, b.claim(t, "r1", time.Hour), store.Failed, "RAIL_REJECTED", 0)
	b.enqueue(t, "globex", "k2")
	replica := startStandby(t, primary)
	waitFor(t, "the standby to replay the queue", func() bool {
		var n int
		_ = replica.QueryRow(b.ctx, `SELECT (SELECT count(*) FROM outbox.dead_letters) + (SELECT count(*) FROM outbox.pending)`).Scan(&n)
		return n == 2
	})
	toks, err := admin.ParseTokens(strings.NewReader("operator oscar " + operatorSecret + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := admin.New(admin.Config{Pool: replica, Tokens: toks})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	b.url = hs.URL
	shots := t.ArtifactDir()
	ctx := b.signedIn(t, bin, operatorSecret)
	for name, path := range map[string]string{"standby-overview": "/console/", "standby-dead-letters": "/console/dead-letters",
		"standby-instructions": "/console/instructions", "standby-rails": "/console/rails"} {
		for _, width := range []int64{1280, 800} {
			if err := do(ctx, chromedp.EmulateViewport(width, 900), chromedp.Navigate(b.url+path), waitVisible("p.standby")); err != nil {
				t.Fatalf("%s at %d px: %v", path, width, err)
			}
			got, err := run(ctx, chromedp.Evaluate[map[string]any](`(() => {
			  const line = document.querySelector("p.standby"), r = line.getBoundingClientRect();
			  return {text: line.innerText, inView: r.top >= 0 && r.bottom <= innerHeight && r.right <= innerWidth,
			    forms: document.querySelectorAll('form[action*="/dead-letters/"], form[action*="/instructions/"], form[action*="/rails/"], a[href="/console/rails"]').length};
			})()`))
			if err != nil {
				t.Fatal(err)
			}
			text, _ := got["text"].(string)
			if !strings.Contains(text, "read-only standby") || !strings.Contains(text, "primary") || got["inView"] != true || got["forms"] != float64(0) {
				t.Errorf("%s at %d px: %v", path, width, got)
			}
		}
		shoot(t, ctx, shots, name)
	}
	t.Logf("screenshots in %s", shots)
}
