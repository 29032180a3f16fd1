package admin_test

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/admin"
	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/internal/testdb"
)

// TestAPIReplayLostCommitReply: the database connection of an API replay
// breaks after its transaction was sent. Where the commit's answer was
// lost and the database answers again, the server settles it there: 200,
// done. Where it cannot be reached again to tell, the answer is 500 with
// "error": "COMMIT_UNKNOWN" and a note to read the trail first: it used
// to be the bare "internal error (logged)" of a failure, which a client
// retries, and by then the replayed instruction may have failed again
// and been replayed a second time.
func TestAPIReplayLostCommitReply(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	settled, unsettled := b.enqueue(t, "p1", "k1"), b.enqueue(t, "p2", "k2")
	b.record(t, b.claim(t, "r1", time.Hour), store.Failed, "RAIL_REJECTED", 0)
	b.record(t, b.claim(t, "r1", time.Hour), store.Failed, "RAIL_REJECTED", 0)

	proxy, base := proxiedServer(t, b)

	replays := func(id string) (n int) {
		t.Helper()
		if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox.attempts WHERE outbox_id = $1 AND state = 'REPLAYED'`, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	var res admin.ActionResult
	proxy.CutReplyAfter([]byte("commit"))
	code, err := postJSON(b.ctx, base+"/api/v1/dead-letters/"+settled.String()+"/replay", operatorSecret, map[string]string{"reason": "rail back"}, &res)
	if n := replays(settled.String()); err != nil || n != 1 || code != http.StatusOK || !res.Done {
		t.Fatalf("a replay whose commit's answer was lost, done (%d REPLAYED rows), answered %d %+v %v", n, code, res, err)
	}

	res = admin.ActionResult{}
	proxy.RefuseAfterCut(3 * time.Second)
	proxy.CutReplyAfter([]byte("commit"))
	code, err = postJSON(b.ctx, base+"/api/v1/dead-letters/"+unsettled.String()+"/replay", operatorSecret, map[string]string{"reason": "rail back"}, &res)
	if n := replays(unsettled.String()); err != nil || n != 1 || code != http.StatusInternalServerError || res.Done ||
		res.Error != admin.CommitUnknown || !strings.Contains(res.Note, "trail") {
		t.Fatalf("a replay whose commit's answer was lost, with the database out of reach (%d REPLAYED rows), answered %d %+v %v", n, code, res, err)
	}
}

// proxiedServer starts a second admin server of b's database whose pool
// goes through a HoldingProxy, and returns the proxy and the server's URL.
func proxiedServer(t *testing.T, b *bundle) (*testdb.HoldingProxy, string) {
	t.Helper()
	cfg := b.pool.Config().ConnConfig
	proxy := testdb.StartHoldingProxy(t, net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
	pcfg := b.pool.Config().Copy()
	host, port, err := net.SplitHostPort(proxy.Addr())
	if err != nil {
		t.Fatal(err)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.ConnConfig.Host, pcfg.ConnConfig.Port = host, uint16(p)
	proxied, err := pgxpool.NewWithConfig(b.ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxied.Close)
	toks, err := admin.ParseTokens(strings.NewReader("operator oscar " + operatorSecret + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := admin.New(admin.Config{Pool: proxied, Tokens: toks, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	return proxy, hs.URL

}

// TestAPICancelLostCommitReply: as TestAPIReplayLostCommitReply, for a
// cancel: settled done where the database answers again (200), and 500
// with "error": "COMMIT_UNKNOWN" where it cannot tell (it was the bare
// internal error of a failure).
func TestAPICancelLostCommitReply(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	settled, unsettled := b.enqueue(t, "p1", "k1"), b.enqueue(t, "p2", "k2")
	proxy, base := proxiedServer(t, b)
	cancelled := func(id string) (n int) {
		t.Helper()
		if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox.attempts WHERE outbox_id = $1 AND state = 'CANCELLED'`, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	var res admin.ActionResult
	proxy.CutReplyAfter([]byte("commit"))
	code, err := postJSON(b.ctx, base+"/api/v1/instructions/"+settled.String()+"/cancel", operatorSecret, map[string]string{"reason": "recalled"}, &res)
	if n := cancelled(settled.String()); err != nil || n != 1 || code != http.StatusOK || !res.Done {
		t.Fatalf("a cancel whose commit's answer was lost, done (%d CANCELLED rows), answered %d %+v %v", n, code, res, err)
	}
	res = admin.ActionResult{}
	proxy.RefuseAfterCut(3 * time.Second)
	proxy.CutReplyAfter([]byte("commit"))
	code, err = postJSON(b.ctx, base+"/api/v1/instructions/"+unsettled.String()+"/cancel", operatorSecret, map[string]string{"reason": "recalled"}, &res)
	if n := cancelled(unsettled.String()); err != nil || n != 1 || code != http.StatusInternalServerError || res.Done ||
		res.Error != admin.CommitUnknown || !strings.Contains(res.Note, "trail") {
		t.Fatalf("a cancel whose commit's answer was lost, with the database out of reach (%d CANCELLED rows), answered %d %+v %v", n, code, res, err)
	}
}

// TestAPIResumeLostCommitReply: as TestAPIReplayLostCommitReply, for a
// rail's resume: settled done where the database answers again (200), and
// 500 with "error": "COMMIT_UNKNOWN" where it cannot tell. It was the bare
// internal error of a failure, which a client retries: a second resume,
// which ends a pause someone made meanwhile.
func TestAPIResumeLostCommitReply(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	proxy, base := proxiedServer(t, b)
	resumes := func() (n int) {
		t.Helper()
		if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox.rail_pause_events WHERE rail_type = 'sandbox' AND action = 'RESUMED'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// The answer to the resume's statement is lost: whether that reply
	// was the commit's or not, the answer says what the database did.
	if ok, err := b.st.PauseRail(b.ctx, b.pool, "sandbox", "alice", "rail down"); err != nil || !ok {
		t.Fatalf("pause: %v %v", ok, err)
	}
	proxy.CutReplyAfter([]byte("resume_rail"))
	var first struct {
		Done  bool   `json:"done"`
		Error string `json:"error"`
	}
	code, err := postJSON(b.ctx, base+"/api/v1/rails/sandbox/resume", operatorSecret, map[string]string{"reason": "rail back"}, &first)
	if n := resumes(); err != nil || first.Done != (n == 1) || !first.Done && (code != http.StatusServiceUnavailable || first.Error != admin.NotDone) ||
		first.Done && code != http.StatusOK {
		t.Fatalf("a resume whose answer was lost (%d RESUMED events) answered %d %+v %v", n, code, first, err)
	}
	if !first.Done {
		if ok, err := b.st.ResumeRail(b.ctx, b.pool, "sandbox", "alice", "rail back"); err != nil || !ok {
			t.Fatalf("resume: %v %v", ok, err)
		}
	}
	for i, unreachable := range []bool{false, true} {
		if ok, err := b.st.PauseRail(b.ctx, b.pool, "sandbox", "alice", "rail down"); err != nil || !ok {
			t.Fatalf("pause: %v %v", ok, err)
		}
		if unreachable {
			proxy.RefuseAfterCut(3 * time.Second)
		}
		proxy.CutReplyAfter([]byte("commit"))
		var res struct {
			Done  bool   `json:"done"`
			Error string `json:"error"`
		}
		code, err := postJSON(b.ctx, base+"/api/v1/rails/sandbox/resume", operatorSecret, map[string]string{"reason": "rail back"}, &res)
		n := resumes()
		switch {
		case err != nil || n != i+2:
			t.Fatalf("a resume whose commit's answer was lost: %d RESUMED events, want %d (%v)", n, i+2, err)
		case !unreachable && (code != http.StatusOK || !res.Done):
			t.Fatalf("a resume whose commit's answer was lost, done, answered %d %+v", code, res)
		case unreachable && (code != http.StatusInternalServerError || res.Done || res.Error != admin.CommitUnknown):
			t.Fatalf("a resume whose commit's answer was lost, with the database out of reach, answered %d %+v", code, res)
		}
	}
}
