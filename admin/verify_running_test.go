package admin_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerline/outbox/admin"
)

// TestOneVerifyAtATime: an audit verify holds a connection of the admin
// address's pool for as long as it reads the archive, and without
// --admin-database-url that pool is the relayer's, whose claims and
// outcome writes need it. An auditor (a read-only credential) starting
// as many verifies as the pool has connections stopped every payment
// until they ended. While one verify runs, a second one, from the API or
// the console, is refused at once (409, VERIFY_RUNNING, naming who runs
// it) and takes no connection; the first one completes.
func TestOneVerifyAtATime(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	ctx := b.ctx
	b.enqueue(t, "p1", "k1")
	// A lock on a table verify reads holds the first verify, with its
	// connection, for as long as the test needs.
	locker, err := pgx.Connect(ctx, b.pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close(context.WithoutCancel(ctx))
	lock, err := locker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lock.Exec(ctx, "LOCK TABLE outbox.idempotency_keys IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	waiting := func() int {
		var n int
		// Within a transaction, pg_stat_activity is read once unless
		// its snapshot is cleared.
		if _, err := lock.Exec(ctx, "SELECT pg_stat_clear_snapshot()"); err != nil {
			t.Error(err)
		}
		if err := lock.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()`).Scan(&n); err != nil {
			t.Error(err)
		}
		return n
	}
	type answer struct {
		status int
		body   string
		err    error
	}
	verify := func() answer {
		req, err := http.NewRequestWithContext(ctx, "POST", b.url+"/api/v1/verify", nil)
		if err != nil {
			return answer{err: err}
		}
		req.Header.Set("Authorization", "Bearer "+auditorSecret)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return answer{err: err}
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return answer{status: resp.StatusCode, body: string(body), err: err}
	}
	first := make(chan answer, 1)
	go func() { first <- verify() }()
	waitFor(t, "the first verify to wait on the lock", func() bool { return waiting() == 1 })

	second := make(chan answer, 1)
	go func() { second <- verify() }()
	var got answer
	waitFor(t, "the second verify's answer, or it too holding a connection", func() bool {
		select {
		case got = <-second:
			return true
		default:
			return waiting() > 1
		}
	})
	if got.status == 0 && got.err == nil {
		t.Fatalf("a second verify took a second connection of the pool (%d sessions wait on the lock) instead of being refused", waiting())
	}
	var refusal struct {
		Code      string `json:"code"`
		Error     string `json:"error"`
		StartedBy string `json:"started_by"`
	}
	if got.err != nil || got.status != http.StatusConflict || json.Unmarshal([]byte(got.body), &refusal) != nil ||
		refusal.Code != admin.VerifyRunning || refusal.StartedBy != "audra" {
		t.Errorf("a second verify while one runs: %d %q %v", got.status, got.body, got.err)
	}
	page := consoleAt(t, b.url).post(t, "/console/verify", url.Values{})
	if !strings.Contains(page, "An audit verify is already running") || strings.Contains(page, "Every invariant holds.") ||
		!strings.Contains(page, "url=/console/") {
		t.Errorf("the console's verify while one runs:\n%s", page)
	}
	if n := waiting(); n != 1 {
		t.Errorf("%d sessions wait on the lock, want the first verify's only", n)
	}

	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if a := <-first; a.err != nil || a.status != http.StatusOK || !strings.Contains(a.body, `"ok":true`) {
		t.Errorf("the first verify: %d %q %v", a.status, a.body, a.err)
	}
	// Once it has ended, the next one runs.
	if a := verify(); a.err != nil || a.status != http.StatusOK {
		t.Errorf("a verify after the first ended: %d %q %v", a.status, a.body, a.err)
	}
	if page := consoleAt(t, b.url).post(t, "/console/verify", url.Values{}); !regexp.MustCompile(`Every invariant holds\.`).MatchString(page) {
		t.Errorf("the console's verify after the first ended:\n%s", page)
	}
}
