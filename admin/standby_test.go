package admin_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/ledgerline/outbox/admin"
	"github.com/ledgerline/outbox/internal/pglocal"
	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/pending"
)

// TestConsoleOnAStandby: a console whose database is a streaming standby
// (read-only) showed its replay, acknowledge, cancel and pause forms,
// which failed with the database's read-only error after the operator
// had filled them (500, "internal error"). It now says instead of the
// forms that it reads a standby and where actions are taken; its form
// posts and the API's actions are refused before anything is tried (the
// API with 503 and the code READ_ONLY_STANDBY, Server.Act with
// ErrReadOnlyStandby). With Config.PrimaryConsole its line links to the
// primary's console.
func TestConsoleOnAStandby(t *testing.T) {
	t.Parallel()
	primary, b := setupOwnCluster(t)
	dead := b.enqueue(t, "p1", "k1")
	b.record(t, b.claim(t, "r1", time.Hour), store.Failed, "RAIL_REJECTED", 0)
	queued := b.enqueue(t, "p2", "k2")
	replica := startStandby(t, primary)
	waitFor(t, "the standby to replay the dead letter and the pending instruction", func() bool {
		var n int
		_ = replica.QueryRow(b.ctx, `SELECT (SELECT count(*) FROM outbox.dead_letters) + (SELECT count(*) FROM outbox.pending)`).Scan(&n)
		return n == 2
	})
	toks, err := admin.ParseTokens(strings.NewReader("auditor audra " + auditorSecret + "\noperator oscar " + operatorSecret + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := admin.New(admin.Config{Pool: replica, Tokens: toks})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	b.srv, b.url = srv, hs.URL

	// The API refuses every action before trying it.
	reason := map[string]string{"reason": "account fixed"}
	for _, path := range []string{"/api/v1/dead-letters/" + dead.String() + "/replay", "/api/v1/dead-letters/" + dead.String() + "/acknowledge",
		"/api/v1/instructions/" + queued.String() + "/cancel", "/api/v1/rails/sandbox/pause", "/api/v1/rails/sandbox/resume"} {
		var res struct{ Error, Code string }
		if code := b.call(t, "POST", path, operatorSecret, reason, &res); code != http.StatusServiceUnavailable ||
			res.Code != admin.ReadOnlyStandby || !strings.Contains(res.Error, "standby") {
			t.Errorf("POST %s on a standby: %d %+v, want 503 with the code %s", path, code, res, admin.ReadOnlyStandby)
		}
	}
	if _, err := srv.Act(b.ctx, dead, "oscar", admin.ActionReplay, "account fixed"); !errors.Is(err, admin.ErrReadOnlyStandby) {
		t.Errorf("Act on a standby: %v, want ErrReadOnlyStandby", err)
	}
	if _, err := srv.PauseRail(b.ctx, "sandbox", "oscar", admin.ActionPause, "maintenance"); !errors.Is(err, admin.ErrReadOnlyStandby) {
		t.Errorf("PauseRail on a standby: %v, want ErrReadOnlyStandby", err)
	}

	// The console shows the operator no forms, and says why.
	op := consoleAs(t, b.url, operatorSecret)
	const line = `<p class="standby" role="status">`
	for _, path := range []string{"/console/", "/console/dead-letters", "/console/instructions", "/console/rails"} {
		page := op.get(t, path)
		if !strings.Contains(page, line) || !strings.Contains(page, "read-only standby") {
			t.Errorf("%s on a standby does not say it is a read-only standby:\n%s", path, page)
		}
		// Once: the overview's own older hint said it again.
		if n := strings.Count(page, "last replayed transaction"); n != 1 {
			t.Errorf("%s on a standby says %d times that it reads as of the standby's last replayed transaction, want once", path, n)
		}
		for _, form := range []string{`action="/console/dead-letters/`, `action="/console/instructions/`, `action="/console/rails/`, `href="/console/rails"`} {
			if strings.Contains(page, form) {
				t.Errorf("%s on a standby shows an operator's form or its link (%s):\n%s", path, form, page)
			}
		}
	}
	// Verify runs on the standby too: the overview must not warn that it
	// holds back vacuum on the primary.
	if page := op.get(t, "/console/"); strings.Contains(page, "here on the primary") {
		t.Errorf("the overview on a standby says verify runs on the primary:\n%s", page)
	}
	// A form posted anyway (a page shown before a failover) is refused
	// with the same words, before anything is tried.
	for path, form := range map[string]url.Values{
		"/console/dead-letters/" + dead.String() + "/replay":   {"reason": {"account fixed"}, "failed": {"1"}},
		"/console/instructions/" + queued.String() + "/cancel": {"reason": {"duplicate"}},
		"/console/rails/pause":                                 {"rail": {"sandbox"}, "reason": {"maintenance"}},
	} {
		if page := op.post(t, path, form); !strings.Contains(page, `<p class="error" role="alert">Nothing was done: this console reads a read-only standby`) {
			t.Errorf("POST %s on a standby:\n%s", path, page)
		}
	}
	var n int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox.attempts WHERE state IN ('REPLAYED', 'ACKNOWLEDGED', 'CANCELLED')`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("operator actions archived on the primary: %d %v", n, err)
	}

	// With the primary's console configured, the line links to it.
	const primaryConsole = "https://outbox-admin.example/console/"
	if page := op.get(t, "/console/"); strings.Contains(page, primaryConsole) {
		t.Fatalf("a link to a primary's console nobody configured:\n%s", page)
	}
	linked, err := admin.New(admin.Config{Pool: replica, Tokens: toks, PrimaryConsole: primaryConsole})
	if err != nil {
		t.Fatal(err)
	}
	hsLinked := httptest.NewServer(linked.Handler())
	t.Cleanup(hsLinked.Close)
	page := consoleAs(t, hsLinked.URL, operatorSecret).get(t, "/console/dead-letters")
	if !strings.Contains(page, `Take those actions on <a href="`+primaryConsole+`">the primary's console</a>.`) {
		t.Errorf("the standby's line does not link to the primary's console:\n%s", page)
	}
	for _, bad := range []string{"outbox-admin.example/console/", "javascript:alert(1)", "ftp://outbox-admin.example/"} {
		if _, err := admin.New(admin.Config{Pool: replica, Tokens: toks, PrimaryConsole: bad}); !errors.Is(err, admin.ErrInvalidConfig) {
			t.Errorf("PrimaryConsole %q: %v, want ErrInvalidConfig", bad, err)
		}
	}
}

// setupOwnCluster is a bundle (no server) on a cluster of the test's own,
// returned with it, so that a streaming standby can follow it
// (startStandby).
func setupOwnCluster(t *testing.T) (*pglocal.Cluster, *bundle) {
	t.Helper()
	primary, pool := testdb.OwnCluster(t)
	st, err := store.New("")
	if err != nil {
		t.Fatal(err)
	}
	producer, err := pending.NewProducer(pending.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return primary, &bundle{ctx: t.Context(), pool: pool, st: st, producer: producer}
}
