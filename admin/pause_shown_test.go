package admin_test

import (
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ledgerline/outbox/admin"
)

// pausedAt is the time of the pause of rail in force, as the API's
// overview shows it (nil: none).
func (b *bundle) pausedAt(t *testing.T, rail string) *time.Time {
	t.Helper()
	var ov admin.Overview
	if code := b.call(t, "GET", "/api/v1/overview", auditorSecret, nil, &ov); code != 200 {
		t.Fatalf("overview: %d", code)
	}
	for _, p := range ov.Queue.PausedRails {
		if p.RailType == rail {
			return &p.PausedAt
		}
	}
	return nil
}

// TestResumeActsOnlyOnThePauseShown: a resume from the API that names the
// pause it was shown (paused_at, as the overview gives it), or from the
// console's form (which carries it), ends that pause only: when another
// operator has resumed it and paused the rail again meanwhile, it is
// refused with PAUSE_CHANGED (409) and the new pause stays. By name alone,
// a resume from a stale view ended a pause someone had just made, for a
// reason the resumer never saw, and payments went to a rail under
// maintenance.
func TestResumeActsOnlyOnThePauseShown(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	pause := func(why string) time.Time {
		t.Helper()
		var res admin.PauseResult
		if code := b.call(t, "POST", "/api/v1/rails/sandbox/pause", operatorSecret, map[string]string{"reason": why}, &res); code != 200 || !res.Done {
			t.Fatalf("pause: %d %+v", code, res)
		}
		return *b.pausedAt(t, "sandbox")
	}
	resume := func(shown time.Time) (int, map[string]any) {
		t.Helper()
		var body map[string]any
		code := b.call(t, "POST", "/api/v1/rails/sandbox/resume", operatorSecret,
			map[string]any{"reason": "maintenance over", "paused_at": shown}, &body)
		return code, body
	}

	first := pause("bank maintenance")
	operator := consoleAs(t, b.url, operatorSecret)
	stale := operator.get(t, "/console/rails") // the console's view of the first pause
	m := regexp.MustCompile(`name="paused" value="([0-9]+)"`).FindStringSubmatch(stale)
	if m == nil {
		t.Fatalf("the resume form does not carry the pause it shows:\n%s", stale)
	}
	// Another operator resumes it by name (the CLI) and pauses again.
	if _, err := b.st.ResumeRail(b.ctx, b.pool, "sandbox", "olga", "window moved"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Millisecond) // paused_at is the transaction's start, in microseconds
	second := pause("rail paying twice")
	if second.Equal(first) {
		t.Fatal("two pauses at one time")
	}

	if code, body := resume(first); code != http.StatusConflict || body["code"] != admin.PauseChanged || body["done"] != false {
		t.Errorf("an API resume of a pause that was replaced: %d %v; want 409 %s", code, body, admin.PauseChanged)
	}
	page := operator.post(t, "/console/rails/resume", url.Values{"rail": {"sandbox"}, "reason": {"maintenance over"}, "paused": {m[1]}})
	if !strings.Contains(page, "changed since") {
		t.Errorf("the console's resume of a pause that was replaced does not say so:\n%s", page)
	}
	page = operator.post(t, "/console/rails/resume", url.Values{"rail": {"sandbox"}, "reason": {"maintenance over"}})
	if !strings.Contains(page, "reload the page") {
		t.Errorf("a console resume form without its pause was not refused:\n%s", page)
	}
	if now := b.pausedAt(t, "sandbox"); now == nil || !now.Equal(second) {
		t.Fatalf("the second pause after stale resumes: %v, want %v in force", now, second)
	}
	pauses, err := b.st.RailPauses(b.ctx, b.pool)
	if err != nil || len(pauses) != 1 || pauses[0].Reason != "rail paying twice" {
		t.Fatalf("pauses: %+v %v", pauses, err)
	}

	if code, body := resume(second); code != http.StatusOK || body["done"] != true {
		t.Fatalf("an API resume of the pause shown: %d %v", code, body)
	}
	if code, body := resume(second); code != http.StatusNotFound || body["code"] != admin.NotPaused {
		t.Errorf("a resume of a rail no longer paused: %d %v; want 404 %s", code, body, admin.NotPaused)
	}
	// By name, as before, when the pause is not named.
	pause("again")
	var res admin.PauseResult
	if code := b.call(t, "POST", "/api/v1/rails/sandbox/resume", operatorSecret, map[string]string{"reason": "by name"}, &res); code != 200 || !res.Done {
		t.Errorf("a resume by name: %d %+v", code, res)
	}
}
