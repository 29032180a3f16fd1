package admin_test

import (
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"

	"github.com/ledgerline/outbox/admin"
	"github.com/ledgerline/outbox/internal/store"
)

// consolePostRaw submits a console form as c's session (its CSRF token
// read first, so that arm, which arms the proxy's cut, sees only the
// form's own statements) and returns the answer's status and body.
func consolePostRaw(t *testing.T, c *consoleClient, path string, form url.Values, arm func()) (int, string) {
	t.Helper()
	m := regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`).FindStringSubmatch(c.get(t, "/console/"))
	if m == nil {
		t.Fatal("no CSRF token on the overview")
	}
	form.Set("csrf", m[1])
	arm()
	resp, err := c.client.PostForm(c.base+path, form)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// TestConsoleActionLostCommitReply: the console's replay, cancel and
// resume whose database connection breaks once they were sent. Settled
// not done, the page says that nothing was done; unsettled, the answer
// says that it may have been done and to look before acting again. Both
// were the console's bare "internal error (logged)", read as a failure:
// an operator who clicked resume again ended a pause someone had made
// meanwhile, as the commands and the API already said.
func TestConsoleActionLostCommitReply(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	notDone, unknown := b.enqueue(t, "p1", "k1"), b.enqueue(t, "p2", "k2")
	toCancel := b.enqueue(t, "p3", "k3")
	b.record(t, b.claim(t, "r1", time.Hour), store.Failed, "RAIL_REJECTED", 0)
	b.record(t, b.claim(t, "r1", time.Hour), store.Failed, "RAIL_REJECTED", 0)
	if ok, err := b.st.PauseRail(b.ctx, b.pool, "sandbox", "alice", "rail down"); err != nil || !ok {
		t.Fatalf("pause: %v %v", ok, err)
	}
	pauses, err := b.st.RailPauses(b.ctx, b.pool)
	if err != nil || len(pauses) != 1 {
		t.Fatalf("pauses: %+v %v", pauses, err)
	}
	// The resume form carries the pause it shows.
	paused := strconv.FormatInt(pauses[0].PausedAt.UnixMicro(), 10)
	proxy, base := proxiedServer(t, b)
	op := consoleAs(t, base, operatorSecret)
	failedAt := func(id uuid.UUID) string {
		t.Helper()
		var at time.Time
		if err := b.pool.QueryRow(b.ctx, `SELECT failed_at FROM outbox.dead_letters WHERE outbox_id = $1`, id).Scan(&at); err != nil {
			t.Fatal(err)
		}
		return strconv.FormatInt(at.UnixMicro(), 10)
	}
	count := func(q string, args ...any) (n int) {
		t.Helper()
		if err := b.pool.QueryRow(b.ctx, q, args...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	replays := func(id uuid.UUID) int {
		return count(`SELECT count(*) FROM outbox.attempts WHERE outbox_id = $1 AND state = 'REPLAYED'`, id)
	}

	// The replay's statement reaches the server, its answer is lost and
	// the connection closed before the commit: the server rolls it back.
	code, page := consolePostRaw(t, op, "/console/dead-letters/"+notDone.String()+"/replay",
		url.Values{"reason": {"rail back"}, "failed": {failedAt(notDone)}}, func() { proxy.CutReplyAfter([]byte("replay_dead_letter")) })
	if n := replays(notDone); n != 0 || code != http.StatusOK || !strings.Contains(page, "Nothing was done") {
		t.Fatalf("a console replay settled not done (%d REPLAYED rows) answered %d:\n%s", n, code, page)
	}

	// The commit's answer is lost and the database refuses connections
	// for a while: nobody can tell.
	code, page = consolePostRaw(t, op, "/console/dead-letters/"+unknown.String()+"/replay",
		url.Values{"reason": {"rail back"}, "failed": {failedAt(unknown)}}, func() {
			proxy.RefuseAfterCut(2 * time.Second)
			proxy.CutReplyAfter([]byte("commit"))
		})
	if n := replays(unknown); n != 1 || code != http.StatusInternalServerError || !strings.Contains(page, "may have been done") || !strings.Contains(page, "trail") {
		t.Fatalf("a console replay whose commit's answer was lost, the database out of reach (%d REPLAYED rows), answered %d:\n%s", n, code, page)
	}
	time.Sleep(2 * time.Second) // the refusals end

	code, page = consolePostRaw(t, op, "/console/instructions/"+toCancel.String()+"/cancel",
		url.Values{"reason": {"recalled"}}, func() {
			proxy.RefuseAfterCut(2 * time.Second)
			proxy.CutReplyAfter([]byte("commit"))
		})
	if n := count(`SELECT count(*) FROM outbox.attempts WHERE outbox_id = $1 AND state = 'CANCELLED'`, toCancel); n != 1 ||
		code != http.StatusInternalServerError || !strings.Contains(page, "may have been done") || !strings.Contains(page, "trail") {
		t.Fatalf("a console cancel whose commit's answer was lost, the database out of reach (%d CANCELLED rows), answered %d:\n%s", n, code, page)
	}
	time.Sleep(2 * time.Second)

	code, page = consolePostRaw(t, op, "/console/rails/resume", url.Values{"rail": {"sandbox"}, "reason": {"rail back"}, "paused": {paused}}, func() {
		proxy.RefuseAfterCut(2 * time.Second)
		proxy.CutReplyAfter([]byte("commit"))
	})
	if n := count(`SELECT count(*) FROM outbox.rail_pause_events WHERE rail_type = 'sandbox' AND action = 'RESUMED'`); n != 1 ||
		code != http.StatusInternalServerError || !strings.Contains(page, "may have been done") || !strings.Contains(page, "pauses") {
		t.Fatalf("a console resume whose commit's answer was lost, the database out of reach (%d RESUMED events), answered %d:\n%s", n, code, page)
	}
}
