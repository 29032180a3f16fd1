package admin_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/admin"
	"github.com/ledgerline/outbox/engine"
	"github.com/ledgerline/outbox/internal/pglocal"
	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/pending"
	"github.com/ledgerline/outbox/rails"
	"github.com/ledgerline/outbox/relay"
)

func TestMain(m *testing.M) { testdb.Main(m) }

const (
	auditorSecret  = "auditor-secret-0123456789"
	operatorSecret = "operator-secret-0123456789"
)

// bundle is one test's database, admin server and the tools to build
// states with the real producer and store.
type bundle struct {
	ctx      context.Context
	pool     *pgxpool.Pool
	st       *store.Store
	producer *pending.Producer
	srv      *admin.Server
	url      string
	logs     *bytes.Buffer
	logMu    *sync.Mutex
}

func setup(t *testing.T, cfg admin.Config) *bundle {
	t.Helper()
	pool := testdb.New(t)
	st, err := store.New("")
	if err != nil {
		t.Fatal(err)
	}
	producer, err := pending.NewProducer(pending.Config{})
	if err != nil {
		t.Fatal(err)
	}
	toks, err := admin.ParseTokens(strings.NewReader("# who may do what\nauditor audra " + auditorSecret + "\noperator oscar " + operatorSecret + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	var mu sync.Mutex
	cfg.Pool, cfg.Tokens = pool, toks
	cfg.Logger = slog.New(slog.NewTextHandler(lockedWriter{&logs, &mu}, nil))
	srv, err := admin.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	return &bundle{ctx: t.Context(), pool: pool, st: st, producer: producer, srv: srv, url: hs.URL, logs: &logs, logMu: &mu}
}

type lockedWriter struct {
	b  *bytes.Buffer
	mu *sync.Mutex
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// call makes one request with secret ("" for none) and decodes the JSON
// answer into out (when not nil); it returns the status.
func (b *bundle) call(t *testing.T, method, path, secret string, body any, out any) int {
	t.Helper()
	var rd io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(data)
	}
	resp, data := sendAPI(t, b.ctx, method, b.url+path, secret, rd)
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			t.Fatalf("%s %s: %d %q: %v", method, path, resp.StatusCode, data, err)
		}
	}
	return resp.StatusCode
}

func (b *bundle) enqueue(t *testing.T, participant, key string) uuid.UUID {
	t.Helper()
	r, err := b.producer.Enqueue(b.ctx, b.pool, pending.Instruction{
		InstructionID: "ins-" + key, ParticipantID: participant, IdempotencyKey: key,
		RailType: "sandbox", AmountMinor: 100, Currency: "USD", Destination: "acct-1",
	})
	if err != nil {
		t.Fatal(err)
	}
	return r.OutboxID
}

// claim claims the participant's head for relayer with lease.
func (b *bundle) claim(t *testing.T, relayer string, lease time.Duration) store.Claimed {
	t.Helper()
	c, err := b.st.Claim(b.ctx, b.pool, store.ClaimParams{RelayerID: relayer, Limit: 1, Leases: map[string]time.Duration{"sandbox": lease}})
	if err != nil || len(c) != 1 {
		t.Fatalf("claim: %v %v", c, err)
	}
	return c[0]
}

// record records an outcome of c.
func (b *bundle) record(t *testing.T, c store.Claimed, state store.State, code string, retry time.Duration) {
	t.Helper()
	id, err := uuid.NewV7()
	if err != nil {
		t.Fatal(err)
	}
	o := store.Outcome{Identity: c.Identity, AttemptID: id, ClaimAttemptID: c.AttemptID, AttemptNo: c.AttemptNo,
		RelayerID: "r1", ClaimedAt: c.ClaimedAt, State: state, ErrorCode: code, RetryDelay: retry, CountAttempt: true}
	if state == store.Dispatched {
		o.RailReference = "ref"
	}
	if _, _, err := b.st.Record(b.ctx, b.pool, []store.Outcome{o}, store.HandoffParams{}); err != nil {
		t.Fatal(err)
	}
}

// TestCredentials: no credential and a wrong one get 401, an auditor's
// replay 403; refusals are logged without the credential.
func TestCredentials(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	id := uuid.Must(uuid.NewV7())
	if code := b.call(t, "GET", "/api/v1/overview", "", nil, nil); code != http.StatusUnauthorized {
		t.Errorf("no credential: %d", code)
	}
	if code := b.call(t, "GET", "/api/v1/overview", "wrong-secret-0123456789", nil, nil); code != http.StatusUnauthorized {
		t.Errorf("wrong credential: %d", code)
	}
	if code := b.call(t, "POST", "/api/v1/dead-letters/"+id.String()+"/replay", auditorSecret, map[string]string{"reason": "x"}, nil); code != http.StatusForbidden {
		t.Errorf("auditor replay: %d", code)
	}
	if code := b.call(t, "GET", "/api/v1/overview", auditorSecret, nil, nil); code != http.StatusOK {
		t.Errorf("auditor overview: %d", code)
	}
	if code := b.call(t, "POST", "/api/v1/dead-letters/"+id.String()+"/replay", operatorSecret, map[string]string{"reason": "x"}, nil); code != http.StatusNotFound {
		t.Errorf("operator replay of no dead letter: %d", code)
	}
	if code := b.call(t, "POST", "/api/v1/dead-letters/"+id.String()+"/replay", operatorSecret, map[string]string{}, nil); code != http.StatusBadRequest {
		t.Errorf("operator replay without a reason: %d", code)
	}
	b.logMu.Lock()
	logs := b.logs.String()
	b.logMu.Unlock()
	if strings.Count(logs, "refused request") != 3 {
		t.Errorf("want 3 refusals logged:\n%s", logs)
	}
	for _, secret := range []string{"wrong-secret", auditorSecret, operatorSecret} {
		if strings.Contains(logs, secret) {
			t.Errorf("a credential was logged:\n%s", logs)
		}
	}
}

// TestReplayEndToEnd: a dead letter is listed, replayed by an operator
// with a reason, dispatched by a relayer, and its trail shows who replayed
// it and why.
func TestReplayEndToEnd(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	id := b.enqueue(t, "p1", "k1")
	b.record(t, b.claim(t, "r1", time.Hour), store.Failed, "RAIL_REJECTED", 0)

	var dls admin.Page[store.DeadLetter]
	if code := b.call(t, "GET", "/api/v1/dead-letters", auditorSecret, nil, &dls); code != 200 || len(dls.Items) != 1 || dls.Items[0].OutboxID != id {
		t.Fatalf("dead letters: %d %+v", code, dls)
	}
	var res admin.ActionResult
	if code := b.call(t, "POST", "/api/v1/dead-letters/"+id.String()+"/replay", operatorSecret,
		map[string]string{"reason": "beneficiary bank fixed the account"}, &res); code != 200 || !res.Done || res.By != "oscar" {
		t.Fatalf("replay: %d %+v", code, res)
	}
	set, err := rails.NewSet(rails.Options{Type: "sandbox", Profile: payment.Generic{}, Transport: rails.NewSandbox(rails.SandboxOptions{})})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := relay.New(b.pool, relay.Config{Relayer: engine.Config{Rails: set, PollInterval: 50 * time.Millisecond}, NoReaper: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	defer svc.Stop(context.Background())
	var trail struct{ Attempts []store.Attempt }
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		b.call(t, "GET", "/api/v1/trail/"+id.String(), auditorSecret, nil, &trail)
		if n := len(trail.Attempts); n > 0 && trail.Attempts[n-1].State == store.Dispatched {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not dispatched after the replay: %+v", trail.Attempts)
		}
	}
	var states []string
	var replayed *store.Attempt
	for i, a := range trail.Attempts {
		states = append(states, string(a.State))
		if a.State == store.Replayed {
			replayed = &trail.Attempts[i]
		}
	}
	if got := strings.Join(states, " "); got != "DISPATCHING FAILED REPLAYED DISPATCHING DISPATCHED" {
		t.Fatalf("trail %s", got)
	}
	if replayed.RelayerID == nil || *replayed.RelayerID != "oscar" || replayed.ErrorMessage == nil || !strings.Contains(*replayed.ErrorMessage, "beneficiary bank fixed the account") {
		t.Fatalf("the REPLAYED row does not say who and why: %+v", replayed)
	}
	if code := b.call(t, "GET", "/api/v1/dead-letters", auditorSecret, nil, &dls); code != 200 || len(dls.Items) != 0 {
		t.Fatalf("dead letters after the replay: %+v", dls)
	}
}

// TestActRefusesUnknownActions: an action Act or PauseRail does not know
// (a misspelling, another letter case, none) is refused before anything
// is read or written: it must not fall through to acknowledging the dead
// letter, or to pausing the rail.
func TestActRefusesUnknownActions(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	id := b.enqueue(t, "p1", "k1")
	b.record(t, b.claim(t, "r1", time.Hour), store.Failed, "RAIL_REJECTED", 0)
	for _, action := range []string{"Replay", "ack", "", "acknowledge "} {
		res, err := b.srv.Act(b.ctx, id, "oscar", action, "typo")
		if !errors.Is(err, admin.ErrUnknownAction) || res.Done {
			t.Errorf("Act(%q): %+v, %v; want ErrUnknownAction and nothing done", action, res, err)
		}
	}
	dl, err := b.st.DeadLetter(b.ctx, b.pool, id)
	if err != nil || dl == nil || dl.AcknowledgedAt != nil {
		t.Fatalf("the dead letter after unknown actions: %+v, %v; want it open", dl, err)
	}
	if res, err := b.srv.Act(b.ctx, id, "oscar", admin.ActionAcknowledge, "refunded by hand"); err != nil || !res.Done {
		t.Fatalf("acknowledge: %+v, %v", res, err)
	}
	// The same for a rail: a misspelled resume must not pause it.
	for _, action := range []string{"Resume", "stop", ""} {
		res, err := b.srv.PauseRail(b.ctx, "sandbox", "oscar", action, "typo")
		if !errors.Is(err, admin.ErrUnknownAction) || res.Done {
			t.Errorf("PauseRail(%q): %+v, %v; want ErrUnknownAction and nothing done", action, res, err)
		}
	}
	var paused int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox.rail_pauses`).Scan(&paused); err != nil || paused != 0 {
		t.Fatalf("%d rails paused after unknown actions (%v), want none", paused, err)
	}
}

// TestPaginationIsStableUnderInserts pages through pending instructions
// while new ones are enqueued: every instruction that was there at the
// start is seen exactly once, in order.
func TestPaginationIsStableUnderInserts(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	want := map[uuid.UUID]bool{}
	for i := range 25 {
		want[b.enqueue(t, fmt.Sprintf("p%d", i), fmt.Sprintf("k%d", i))] = true
	}
	seen := map[uuid.UUID]int{}
	var last time.Time
	next, pages := "", 0
	for {
		var p admin.Page[store.Queued]
		if code := b.call(t, "GET", "/api/v1/instructions?state=pending&limit=7&after="+next, auditorSecret, nil, &p); code != 200 {
			t.Fatalf("page %d: %d", pages, code)
		}
		pages++
		for _, q := range p.Items {
			seen[q.OutboxID]++
			if q.EnqueuedAt.Before(last) {
				t.Fatalf("out of order at %s", q.OutboxID)
			}
			last = q.EnqueuedAt
		}
		// Concurrent producers: new instructions land while we page.
		b.enqueue(t, "late", fmt.Sprintf("late-%d", pages))
		if p.Next == "" || pages > 20 {
			break
		}
		next = p.Next
	}
	for id := range want {
		if seen[id] != 1 {
			t.Errorf("instruction %s seen %d times", id, seen[id])
		}
	}
	for id, n := range seen {
		if n != 1 {
			t.Errorf("instruction %s seen %d times", id, n)
		}
	}
	if pages < 4 {
		t.Errorf("only %d pages of 7 for 25+ instructions", pages)
	}
	if code := b.call(t, "GET", "/api/v1/instructions?after=garbage", auditorSecret, nil, nil); code != http.StatusBadRequest {
		t.Errorf("malformed cursor: %d", code)
	}
}

// TestParticipantView: the participant view explains each blocked state.
func TestParticipantView(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	view := func(p string) store.ParticipantView {
		t.Helper()
		var v store.ParticipantView
		if code := b.call(t, "GET", "/api/v1/participants/"+p, auditorSecret, nil, &v); code != 200 {
			t.Fatalf("participant %s: %d", p, code)
		}
		return v
	}
	if v := view("nobody"); v.State != "clear" || v.Head != nil {
		t.Fatalf("unknown participant: %+v", v)
	}
	b.enqueue(t, "p1", "k1")
	b.enqueue(t, "p1", "k2")
	if v := view("p1"); v.State != "due" || v.Head.SequenceID != 1 || v.Queued != 2 || !strings.Contains(v.Reason, "waiting for a relayer") {
		t.Fatalf("due: %+v", v)
	}
	c := b.claim(t, "relayer-a", time.Hour)
	if v := view("p1"); v.State != "in_flight" || v.Head.RelayerID != "relayer-a" || !strings.Contains(v.Reason, "in flight on relayer relayer-a since") {
		t.Fatalf("in flight: %+v", v)
	}
	b.record(t, c, store.Retryable, "RAIL_UNAVAILABLE", time.Hour)
	if v := view("p1"); v.State != "retry_wait" || v.LastError != "RAIL_UNAVAILABLE" || !strings.Contains(v.Reason, "waits for its next attempt until") {
		t.Fatalf("waiting for retry: %+v", v)
	}
	b.enqueue(t, "p2", "k3")
	b.claim(t, "relayer-b", 10*time.Millisecond)
	time.Sleep(50 * time.Millisecond)
	if v := view("p2"); v.State != "stuck" || !strings.Contains(v.Reason, "presumed dead") {
		t.Fatalf("stuck: %+v", v)
	}
	var page admin.Page[store.Queued]
	if code := b.call(t, "GET", "/api/v1/instructions?state=in_flight&participant=p2", auditorSecret, nil, &page); code != 200 ||
		len(page.Items) != 1 || page.Items[0].State != "stuck" {
		t.Fatalf("in flight for p2: %d %+v", code, page)
	}
	c2 := b.enqueue(t, "p3", "k4")
	b.record(t, b.claim(t, "relayer-c", time.Hour), store.Dispatched, "", 0)
	if v := view("p3"); v.State != "clear" || v.Allocated != 1 {
		t.Fatalf("clear after dispatch of %s: %+v", c2, v)
	}
}

// TestReadiness: ready on a migrated database, degraded when the oldest
// due instruction is older than the threshold, not ready once stopping.
func TestReadiness(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{DegradedAfter: 20 * time.Millisecond})
	var rd admin.Readiness
	if code := b.call(t, "GET", "/readyz", "", nil, &rd); code != 200 || rd.Status != "ready" {
		t.Fatalf("readyz: %d %+v", code, rd)
	}
	b.enqueue(t, "p1", "k1")
	time.Sleep(50 * time.Millisecond)
	if code := b.call(t, "GET", "/readyz", "", nil, &rd); code != 200 || rd.Status != "degraded" || len(rd.Reasons) != 1 {
		t.Fatalf("readyz with a late queue: %d %+v", code, rd)
	}
	b.srv.SetStopping()
	if code := b.call(t, "GET", "/readyz", "", nil, &rd); code != http.StatusServiceUnavailable || rd.Status != "not_ready" {
		t.Fatalf("readyz while stopping: %d %+v", code, rd)
	}
	var h map[string]string
	if code := b.call(t, "GET", "/healthz", "", nil, &h); code != 200 || h["status"] != "alive" {
		t.Fatalf("healthz: %d %v", code, h)
	}
}

// TestReadinessWithholdsDetailsWithoutACredential: /readyz needs no
// credential, so a failed check's cause is generic unless the request
// carries a valid one; a pgx connect error names the database's user,
// host and port. The status codes stay those the load balancers read, and
// the withheld detail is logged.
func TestReadinessWithholdsDetailsWithoutACredential(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(t.Context(), "postgres://leaky_user@127.0.0.1:1/ledger_db?sslmode=disable&connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	toks, err := admin.ParseTokens(strings.NewReader("auditor audra " + auditorSecret + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	var mu sync.Mutex
	srv, err := admin.New(admin.Config{Pool: pool, Tokens: toks, Logger: slog.New(slog.NewTextHandler(lockedWriter{&logs, &mu}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	b := &bundle{ctx: t.Context(), url: hs.URL}
	leaks := []string{"leaky_user", "ledger_db", "127.0.0.1:1"}
	for _, secret := range []string{"", "wrong-secret-0123456789"} {
		var rd admin.Readiness
		if code := b.call(t, "GET", "/readyz", secret, nil, &rd); code != http.StatusServiceUnavailable || rd.Status != "not_ready" ||
			len(rd.Checks) < 2 || rd.Checks[0] != (admin.Check{Name: "database", Cause: "database unreachable"}) || rd.Checks[1].OK {
			t.Fatalf("readyz with the credential %q: %d %+v", secret, code, rd)
		}
		for _, c := range rd.Checks {
			for _, leak := range leaks {
				if strings.Contains(c.Cause, leak) {
					t.Errorf("readyz with the credential %q names %q: %+v", secret, leak, rd)
				}
			}
		}
	}
	var rd admin.Readiness
	if code := b.call(t, "GET", "/readyz", auditorSecret, nil, &rd); code != http.StatusServiceUnavailable || rd.Status != "not_ready" ||
		!strings.Contains(rd.Checks[0].Cause, "leaky_user") {
		t.Fatalf("readyz with an auditor's credential: %d %+v, want the connect error", code, rd)
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(logs.String(), "leaky_user") {
		t.Errorf("the withheld detail was not logged:\n%s", logs.String())
	}
}

// consoleClient is a console session of the auditor's, over plain HTTP.
type consoleClient struct {
	base   string
	client *http.Client
}

// consoleAt signs in to the console at base as the auditor.
func consoleAt(t *testing.T, base string) *consoleClient {
	t.Helper()
	return consoleAs(t, base, auditorSecret)
}

// consoleAs is consoleAt for the credential secret.
func consoleAs(t *testing.T, base, secret string) *consoleClient {
	t.Helper()
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	c := &consoleClient{base: base, client: &http.Client{Jar: jar}}
	resp, err := c.client.PostForm(base+"/console/signin", url.Values{"token": {secret}})
	c.read(t, "sign in", resp, err)
	return c
}

func (c *consoleClient) get(t *testing.T, path string) string {
	t.Helper()
	resp, err := c.client.Get(c.base + path)
	return c.read(t, "GET "+path, resp, err)
}

// post submits a form to path with the session's CSRF token (read from the
// overview).
func (c *consoleClient) post(t *testing.T, path string, form url.Values) string {
	t.Helper()
	m := regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`).FindStringSubmatch(c.get(t, "/console/"))
	if m == nil {
		t.Fatal("no CSRF token on the overview")
	}
	form.Set("csrf", m[1])
	resp, err := c.client.PostForm(c.base+path, form)
	return c.read(t, "POST "+path, resp, err)
}

func (c *consoleClient) read(t *testing.T, what string, resp *http.Response, err error) string {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("%s: %s\n%s", what, resp.Status, body)
	}
	return string(body)
}

// TestVerifyRunsOnTheAuditPool: with Config.AuditPool a real streaming
// standby, the API's and the console's audit verify run there and say so;
// without it they run on the primary, and the console warns that the
// snapshot held back vacuum.
func TestVerifyRunsOnTheAuditPool(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	primary, pool := testdb.OwnCluster(t)
	replica := startStandby(t, primary)
	toks, err := admin.ParseTokens(strings.NewReader("auditor audra " + auditorSecret + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, audit := range []*pgxpool.Pool{replica, nil} {
		srv, err := admin.New(admin.Config{Pool: pool, AuditPool: audit, Tokens: toks})
		if err != nil {
			t.Fatal(err)
		}
		hs := httptest.NewServer(srv.Handler())
		b := &bundle{ctx: ctx, url: hs.URL}
		var rep struct {
			OK      bool    `json:"ok"`
			Standby bool    `json:"standby"`
			Seconds float64 `json:"seconds"`
		}
		onStandby := audit != nil
		if code := b.call(t, "POST", "/api/v1/verify", auditorSecret, nil, &rep); code != 200 || !rep.OK || rep.Standby != onStandby || rep.Seconds <= 0 {
			t.Errorf("verify with the audit pool %v: %d %+v", onStandby, code, rep)
		}
		page := consoleAt(t, hs.URL).post(t, "/console/verify", url.Values{})
		warned := strings.Contains(page, `<p class="warning">Ran on the primary`)
		if !strings.Contains(page, "Every invariant holds.") || warned == onStandby ||
			strings.Contains(page, "Ran on a standby") != onStandby {
			t.Errorf("the console's verify with the audit pool %v:\n%s", onStandby, page)
		}
		hs.Close()
	}
}

// TestReadinessDegradedByAHeldVacuumHorizon: a session that keeps a
// transaction open longer than the threshold makes /readyz degraded,
// naming the session and its application; ready again once it ends.
func TestReadinessDegradedByAHeldVacuumHorizon(t *testing.T) {
	t.Parallel()
	// The threshold leaves the first probe, made while the transaction is
	// younger than it, two seconds: 200 ms failed once on a loaded machine.
	const threshold = 2 * time.Second
	b := setup(t, admin.Config{HorizonDegradedAfter: threshold})
	cfg, err := pgx.ParseConfig(b.pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["application_name"] = "nightly-report"
	holder, err := pgx.ConnectConfig(b.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(context.Background())
	if _, err := holder.Exec(b.ctx, `BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1`); err != nil {
		t.Fatal(err)
	}
	var rd admin.Readiness
	if code := b.call(t, "GET", "/readyz", "", nil, &rd); code != 200 || rd.Status != "ready" {
		t.Fatalf("readyz with a transaction younger than the threshold: %d %+v", code, rd)
	}
	time.Sleep(threshold + 100*time.Millisecond)
	want := fmt.Sprintf("session %d (nightly-report, %s, idle in transaction) has held back vacuum", holder.PgConn().PID(), cfg.User)
	// Without a credential the reason is generic: the probe is open to
	// anyone who reaches the address, and the holder's role and
	// application are the database's business.
	if code := b.call(t, "GET", "/readyz", "", nil, &rd); code != 200 || rd.Status != "degraded" ||
		!slices.Equal(rd.Reasons, []string{"a transaction or replication slot holds back vacuum"}) {
		t.Fatalf("readyz without a credential, with a transaction older than the threshold: %d %+v", code, rd)
	}
	if code := b.call(t, "GET", "/readyz", auditorSecret, nil, &rd); code != 200 || rd.Status != "degraded" || len(rd.Reasons) != 1 ||
		!strings.HasPrefix(rd.Reasons[0], want) {
		t.Fatalf("readyz with a transaction older than the threshold: %d %+v, want a reason starting %q", code, rd, want)
	}
	// The overview warns with the same words, in the API and on the
	// console's page.
	var ov admin.Overview
	if code := b.call(t, "GET", "/api/v1/overview", auditorSecret, nil, &ov); code != 200 || len(ov.Warnings) != 1 ||
		!strings.HasPrefix(ov.Warnings[0], want) || ov.Queue.VacuumHorizon == nil || ov.Queue.VacuumHorizon.Application != "nightly-report" {
		t.Fatalf("overview: %d %+v", code, ov)
	}
	if page := consoleAt(t, b.url).get(t, "/console/"); !strings.Contains(page, `<p class="warning">`+want) {
		t.Fatalf("the console's overview lacks the warning %q:\n%s", want, page)
	}
	if _, err := holder.Exec(b.ctx, `COMMIT`); err != nil {
		t.Fatal(err)
	}
	if code := b.call(t, "GET", "/readyz", "", nil, &rd); code != 200 || rd.Status != "ready" {
		t.Fatalf("readyz after the commit: %d %+v", code, rd)
	}
}

// TestOutcomeUnknownDeadLetter: an instruction whose last attempt timed out
// after the request was sent (the sandbox pays, then never answers) is a
// dead letter marked outcome unknown, and its replay says it reuses the
// idempotency key; a rejected one is not marked.
func TestOutcomeUnknownDeadLetter(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	set, err := rails.NewSet(rails.Options{Type: "sandbox", Profile: payment.Generic{}, Timeout: 100 * time.Millisecond,
		Transport: rails.NewSandbox(rails.SandboxOptions{TimeoutRate: 1})})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := relay.New(b.pool, relay.Config{Relayer: engine.Config{Rails: set, PollInterval: 50 * time.Millisecond, MaxAttempts: 1}, NoReaper: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	timedOut := b.enqueue(t, "p1", "k-timeout")
	var dls admin.Page[store.DeadLetter]
	for deadline := time.Now().Add(20 * time.Second); len(dls.Items) == 0; time.Sleep(50 * time.Millisecond) {
		b.call(t, "GET", "/api/v1/dead-letters", auditorSecret, nil, &dls)
		if time.Now().After(deadline) {
			t.Fatal("no dead letter")
		}
	}
	if err := svc.Stop(b.ctx); err != nil {
		t.Fatal(err)
	}
	rejected := b.enqueue(t, "p2", "k-rejected")
	b.record(t, b.claim(t, "r1", time.Hour), store.Failed, "RAIL_REJECTED", 0)
	b.call(t, "GET", "/api/v1/dead-letters", auditorSecret, nil, &dls)
	marked := map[uuid.UUID]bool{}
	for _, dl := range dls.Items {
		marked[dl.OutboxID] = dl.OutcomeUnknown
	}
	if len(marked) != 2 || !marked[timedOut] || marked[rejected] {
		t.Fatalf("outcome unknown: %v (timed out %s, rejected %s)", marked, timedOut, rejected)
	}
	var res admin.ActionResult
	if code := b.call(t, "POST", "/api/v1/dead-letters/"+timedOut.String()+"/replay", operatorSecret,
		map[string]string{"reason": "asked the rail: not paid"}, &res); code != 200 || !res.OutcomeUnknown || !strings.Contains(res.Note, "idempotency key") {
		t.Fatalf("replay of an outcome-unknown dead letter: %d %+v", code, res)
	}
	res = admin.ActionResult{}
	if code := b.call(t, "POST", "/api/v1/dead-letters/"+rejected.String()+"/replay", operatorSecret,
		map[string]string{"reason": "account fixed"}, &res); code != 200 || res.OutcomeUnknown || res.Note != "" {
		t.Fatalf("replay of a rejected dead letter: %d %+v", code, res)
	}
}

// TestOverviewReadsAreShared: the overview's figures cost a pass over the
// queue and over the archive's last minutes, and every open console
// refreshes it. Callers within its max age share one read; past it, the
// next caller reads again.
func TestOverviewReadsAreShared(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	admin.SetOverviewMaxAge(b.srv, time.Hour)
	pendingNow := func() int64 {
		t.Helper()
		var ov admin.Overview
		if code := b.call(t, "GET", "/api/v1/overview", auditorSecret, nil, &ov); code != http.StatusOK {
			t.Fatalf("overview: %d", code)
		}
		return ov.Queue.Pending
	}
	b.enqueue(t, "p1", "k1")
	if n := pendingNow(); n != 1 {
		t.Fatalf("first overview: %d pending, want 1", n)
	}
	b.enqueue(t, "p1", "k2")
	if n := pendingNow(); n != 1 {
		t.Fatalf("overview within its max age: %d pending, want the shared read's 1", n)
	}
	admin.SetOverviewMaxAge(b.srv, time.Nanosecond)
	if n := pendingNow(); n != 2 {
		t.Fatalf("overview past its max age: %d pending, want 2", n)
	}
}

// startStandby starts a streaming standby of primary and returns a pool
// of it; both end with the test.
func startStandby(t *testing.T, primary *pglocal.Cluster) *pgxpool.Pool {
	t.Helper()
	starting, cancel := testdb.Starting(t.Context())
	defer cancel()
	standby, err := primary.StartReplica(starting, pglocal.Options{TCP: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = standby.Stop(context.Background()) })
	replica, err := pgxpool.New(t.Context(), standby.ConnString("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(replica.Close)
	return replica
}

// TestReadinessLogsAHeldHorizonOnce: /readyz logs what it withholds once
// per change of it, and a transaction holding back vacuum is one change
// however long it lasts. Its reason carries its age, which grows between
// probes: each probe (every few seconds, from every prober) logged a line
// for as long as the horizon was held, hours for a forgotten session,
// days for an inactive replication slot.
func TestReadinessLogsAHeldHorizonOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{HorizonDegradedAfter: 200 * time.Millisecond})
	holder, err := pgx.Connect(b.ctx, b.pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(context.Background())
	if _, err := holder.Exec(b.ctx, `BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1`); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	var reasons []string
	for range 4 {
		var rd admin.Readiness
		if code := b.call(t, "GET", "/readyz", auditorSecret, nil, &rd); code != 200 || rd.Status != "degraded" {
			t.Fatalf("readyz with a transaction older than the threshold: %d %+v", code, rd)
		}
		b.call(t, "GET", "/readyz", "", nil, nil) // a probe: without a credential, what it withholds is logged
		reasons = append(reasons, rd.Reasons...)
		time.Sleep(1100 * time.Millisecond) // the reason's age moves on by a second
	}
	if reasons[0] == reasons[len(reasons)-1] {
		t.Fatalf("the reason did not change over the probes (%q): the test shows nothing", reasons)
	}
	b.logMu.Lock()
	logged := strings.Count(b.logs.String(), `msg="admin: readiness"`)
	b.logMu.Unlock()
	if logged != 1 {
		t.Fatalf("%d readiness lines logged for one held horizon over 4 probes, want 1:\n%s", logged, b.logs.String())
	}
}
