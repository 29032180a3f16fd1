package admin_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerline/outbox/admin"
)

// TestProbesShareTheirDatabaseReads: /readyz needs no credential and
// reads the database on the admin address's pool, which without
// --admin-database-url is the relayer's, whose claims and outcome writes
// need its connections. Each probe took a connection of its own for its
// reads, so that anyone who reaches the address could, with probes side
// by side, hold every connection of the pool (each up to the probe's
// 3 s) and stop the payments. Probes that come while one reads share its
// reads: however many there are, they hold one connection.
func TestProbesShareTheirDatabaseReads(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	ctx := b.ctx
	// A lock on the table the queue's check reads holds a probe's reads,
	// with their connection, until its 3 s are up.
	locker, err := pgx.Connect(ctx, b.pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close(context.WithoutCancel(ctx))
	lock, err := locker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lock.Exec(ctx, "LOCK TABLE outbox.pending IN ACCESS EXCLUSIVE MODE"); err != nil {
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
	const probes = 3 // fewer than the pool's connections (4)
	answers := make(chan int, probes)
	for range probes {
		go func() {
			resp, err := http.Get(b.url + "/readyz")
			if err != nil {
				answers <- 0
				return
			}
			resp.Body.Close()
			answers <- resp.StatusCode
		}()
	}
	answered, most := 0, 0
	waitFor(t, "every probe's answer, or more than one probe holding a connection", func() bool {
		for {
			select {
			case code := <-answers:
				answered++
				if code != http.StatusOK {
					t.Errorf("a probe answered %d", code)
				}
				continue
			default:
			}
			break
		}
		most = max(most, waiting())
		return answered == probes || most > 1
	})
	if most > 1 {
		t.Fatalf("%d probes side by side held %d connections of the pool", probes, most)
	}
}

// TestReadinessLogsAnUnknownCredential: /readyz answers a valid
// credential with detail, so it tells a valid secret from another, and a
// probe sends none: an unknown one is logged as a refused request (without
// it), as the API's and the sign-in's are. It was answered in silence,
// which let anyone who reaches the address try secrets unseen.
func TestReadinessLogsAnUnknownCredential(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	const guess = "guessed-secret-0123456789"
	var rd admin.Readiness
	if code := b.call(t, "GET", "/readyz", guess, nil, &rd); code != http.StatusOK || rd.Status != "ready" {
		t.Fatalf("readyz with an unknown credential: %d %+v", code, rd)
	}
	if code := b.call(t, "GET", "/readyz", "", nil, &rd); code != http.StatusOK {
		t.Fatalf("readyz without a credential: %d", code)
	}
	b.logMu.Lock()
	logs := b.logs.String()
	b.logMu.Unlock()
	if strings.Count(logs, "refused request") != 1 || !strings.Contains(logs, "path=/readyz") ||
		!strings.Contains(logs, `reason="unknown credential"`) || strings.Contains(logs, guess) {
		t.Errorf("want one refusal of the unknown credential logged, without it:\n%s", logs)
	}
}

// TestRequestsTakeABoundedPartOfThePool: the API's and the console's
// requests read on the admin address's pool, without
// --admin-database-url the relayer's, and each held a connection of its
// own: an auditor (a read-only credential) sending requests side by side
// could hold every connection and stop the claims and outcome writes.
// At most Config.MaxConcurrentRequests are served at once; one that
// finds them all busy waits for a while, then is answered 503 (code
// BUSY, Retry-After) without touching the database.
func TestRequestsTakeABoundedPartOfThePool(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{MaxConcurrentRequests: 2})
	ctx := b.ctx
	locker, err := pgx.Connect(ctx, b.pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close(context.WithoutCancel(ctx))
	lock, err := locker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lock.Exec(ctx, "LOCK TABLE outbox.pending IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	waiting := func() int {
		var n int
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
		status     int
		retryAfter string
		body       string
	}
	const requests = 4 // the pool's connections
	answers := make(chan answer, requests)
	for range requests {
		go func() {
			req, err := http.NewRequestWithContext(ctx, "GET", b.url+"/api/v1/instructions", nil)
			if err != nil {
				answers <- answer{}
				return
			}
			req.Header.Set("Authorization", "Bearer "+auditorSecret)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				answers <- answer{}
				return
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			answers <- answer{resp.StatusCode, resp.Header.Get("Retry-After"), string(body)}
		}()
	}
	var busy []answer
	most := 0
	waitFor(t, "the requests beyond the bound answered, or more than it holding connections", func() bool {
		select {
		case a := <-answers:
			busy = append(busy, a)
		default:
		}
		most = max(most, waiting())
		return len(busy) == requests-2 || most > 2
	})
	if most > 2 {
		t.Fatalf("%d requests side by side held %d connections of the pool, past the bound of 2", requests, most)
	}
	for _, a := range busy {
		if a.status != http.StatusServiceUnavailable || a.retryAfter == "" || !strings.Contains(a.body, `"code":"BUSY"`) {
			t.Errorf("a request past the bound: %+v", a)
		}
	}
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if a := <-answers; a.status != http.StatusOK {
			t.Errorf("a request within the bound: %+v", a)
		}
	}
	// The console's pages are bounded alike, and served again once the
	// requests have ended.
	if page := consoleAt(t, b.url).get(t, "/console/instructions"); !strings.Contains(page, "Nothing here.") {
		t.Errorf("the console after the requests ended:\n%s", page)
	}
}

// stuckWriter is the answer to a client that reads nothing of it (the
// admin address has no write timeout): its first write blocks until
// unstuck is closed; writing is closed when it begins.
type stuckWriter struct {
	header  http.Header
	writing chan struct{}
	once    sync.Once
	unstuck chan struct{}
}

func (w *stuckWriter) Header() http.Header { return w.header }
func (w *stuckWriter) WriteHeader(int)     {}
func (w *stuckWriter) Write(p []byte) (int, error) {
	w.once.Do(func() { close(w.writing) })
	<-w.unstuck
	return len(p), nil
}

// TestASlowReaderHoldsNoRequestSlot: a request holds one of
// Config.MaxConcurrentRequests for the connection its reads take, not
// while its answer is written. Held until the answer was written, an
// auditor's requests whose answers nobody read (a client that stopped
// reading, a window kept shut) held every slot for as long as their
// connections lasted, with no database connection behind them, and every
// operator's request, a rail's pause in an incident among them, was
// answered 503 BUSY.
func TestASlowReaderHoldsNoRequestSlot(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	h := b.srv.Handler()
	unstuck := make(chan struct{})
	var wg sync.WaitGroup
	t.Cleanup(func() { close(unstuck); wg.Wait() })
	for range admin.DefaultMaxConcurrentRequests {
		w := &stuckWriter{header: http.Header{}, writing: make(chan struct{}), unstuck: unstuck}
		req := httptest.NewRequestWithContext(b.ctx, "GET", "/api/v1/instructions", nil)
		req.Header.Set("Authorization", "Bearer "+auditorSecret)
		wg.Go(func() { h.ServeHTTP(w, req) })
		select {
		case <-w.writing:
		case <-time.After(30 * time.Second):
			t.Fatal("a request's answer never began")
		}
	}
	var res admin.PauseResult
	if code := b.call(t, "POST", "/api/v1/rails/sandbox/pause", operatorSecret, map[string]string{"reason": "rail down"}, &res); code != http.StatusOK || !res.Done {
		t.Fatalf("an operator's pause while %d answers were being written to clients that read none: %d %+v", admin.DefaultMaxConcurrentRequests, code, res)
	}
}

// TestASlowReaderHoldsNoVerify: an audit verify is "running" while it
// reads, not while its report is written. Held until the report was
// written, a verify whose report nobody read refused every verify after
// it (409 VERIFY_RUNNING, naming a verify that had ended) for as long as
// its connection lasted.
func TestASlowReaderHoldsNoVerify(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	unstuck := make(chan struct{})
	var wg sync.WaitGroup
	t.Cleanup(func() { close(unstuck); wg.Wait() })
	w := &stuckWriter{header: http.Header{}, writing: make(chan struct{}), unstuck: unstuck}
	req := httptest.NewRequestWithContext(b.ctx, "POST", "/api/v1/verify", nil)
	req.Header.Set("Authorization", "Bearer "+auditorSecret)
	wg.Go(func() { b.srv.Handler().ServeHTTP(w, req) })
	select {
	case <-w.writing:
	case <-time.After(time.Minute):
		t.Fatal("the verify's report never began")
	}
	var rep map[string]any
	if code := b.call(t, "POST", "/api/v1/verify", auditorSecret, nil, &rep); code != http.StatusOK || rep["ok"] != true {
		t.Fatalf("a verify while the report of one that ended was being written to a client that read none: %d %v", code, rep)
	}
}
