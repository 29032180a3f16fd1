package admin_test

import (
	"html"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ledgerline/outbox/admin"
)

// TestIdleSessionEnds: a console session left unused for
// SessionIdleTimeout is ended in the process (its cookie opens the
// sign-in page), while one in use goes on, each page keeping it open
// for another SessionIdleTimeout, up to its 12 h. Without it, a console
// left signed in on an unattended machine stayed an operator's for the
// rest of its 12 h.
func TestIdleSessionEnds(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	clock := admin.UseClock(b.srv)
	signedIn := func(c *consoleClient) bool {
		return strings.Contains(c.get(t, "/console/participant"), "Sign out")
	}
	used, idle := consoleAs(t, b.url, operatorSecret), consoleAs(t, b.url, auditorSecret)
	step := admin.SessionIdleTimeout - time.Minute
	clock.Advance(step)
	if !signedIn(used) {
		t.Fatal("a session used within its idle timeout ended")
	}
	clock.Advance(2 * time.Minute)
	if signedIn(idle) {
		t.Errorf("a session unused for %s still opens pages", step+2*time.Minute)
	}
	if !signedIn(used) {
		t.Fatal("a session used a minute ago ended")
	}
	for elapsed := step + 2*time.Minute; elapsed+step < 12*time.Hour; elapsed += step {
		clock.Advance(step)
		if !signedIn(used) {
			t.Fatalf("a session in use ended after %s", elapsed+step)
		}
	}
	clock.Advance(step)
	if signedIn(used) {
		t.Error("a session in use outlived its 12 h")
	}
}

// TestAutoRefreshIsNotUse: the overview refreshes itself every 5 s, as a
// watched participant's page does; those refreshes are not use, so that
// a console left open on them, unattended, still ends after
// SessionIdleTimeout. Counted as use, the idle timeout never came for
// the page a console is most often left on.
func TestAutoRefreshIsNotUse(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	clock := admin.UseClock(b.srv)
	c := consoleAs(t, b.url, operatorSecret)
	page := c.get(t, "/console/")
	m := regexp.MustCompile(`http-equiv="refresh" content="5; url=([^"]+)"`).FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("the overview does not say where it refreshes to:\n%s", page)
	}
	refresh := html.UnescapeString(m[1])
	for elapsed := time.Duration(0); elapsed < admin.SessionIdleTimeout; elapsed += 5 * time.Minute {
		clock.Advance(5 * time.Minute)
		c.get(t, refresh)
	}
	if strings.Contains(c.get(t, "/console/participant"), "Sign out") {
		t.Errorf("a console left on its overview (refreshing to %s) for %s is still signed in", refresh, admin.SessionIdleTimeout)
	}
}
