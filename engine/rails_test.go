package engine

import (
	"bytes"
	"context"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/pending"
	"github.com/ledgerline/outbox/rails"
)

// TestBreakerOpensBurnsNothingAndRecovers: a rail that fails repeatedly
// opens its breaker; while open, its instructions stay pending and no
// attempt is burned; after the open period a probe succeeds, the breaker
// closes, and everything drains.
//
// The check of the open state is made within one open period, known from
// the breaker's own changes rather than from the clock: while the rail is
// down, each open period ends in a probe that fails and opens the breaker
// again, and a check that an open period did not span whole (a slow
// machine) is made again in the next one. The check lasts 1.5 s, longer
// than the 1 s an instruction that met the open breaker waits
// (CIRCUIT_OPEN): a relayer that claimed the open rail's instructions
// would claim some of them again within it, whatever the timing.
func TestBreakerOpensBurnsNothingAndRecovers(t *testing.T) {
	t.Parallel()
	b := setup(t, rails.SandboxOptions{})
	var (
		changes sync.Map
		// opened counts the breaker's openings, left its leavings of the
		// open state: an open period is unbroken from one sample to
		// another if both are unchanged, and it was open at the first.
		opened, left atomic.Int64
	)
	set, err := rails.NewSet(rails.Options{Type: "sandbox", Profile: payment.Generic{}, Transport: b.sandbox, Timeout: time.Second,
		Breaker: rails.BreakerOptions{ConsecutiveFailures: 3, OpenFor: 4 * time.Second},
		OnBreakerChange: func(_ string, from, to rails.BreakerState) {
			changes.Store(from.String()+"->"+to.String(), true)
			if to == rails.BreakerOpen {
				opened.Add(1)
			}
			if from == rails.BreakerOpen {
				left.Add(1)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	b.sandbox.SetDown(rails.ErrUnavailable)
	b.enqueue(t, 200, 20)
	cfg := b.config("breaker")
	cfg.Rails = set
	cfg.MaxAttempts = 100 // the retry budget is not what ends this test
	b.start(t, cfg)

	sample := func() (inflight, claims, burned int64) {
		if err := b.pool.QueryRow(b.ctx, `SELECT (SELECT count(*) FROM outbox.inflight),
			(SELECT count(*) FROM outbox.attempts WHERE state = 'DISPATCHING'),
			(SELECT coalesce(sum(attempt_count), 0) FROM outbox.pending)`).Scan(&inflight, &claims, &burned); err != nil {
			t.Fatal(err)
		}
		return inflight, claims, burned
	}
	// period is the open period in force ((openings, leavings) as the
	// breaker reported them), and whether the breaker is open in it.
	type period struct{ opened, left int64 }
	current := func() (period, bool) {
		p := period{opened.Load(), left.Load()}
		return p, set.State("sandbox") == rails.BreakerOpen && p.opened > p.left && p == period{opened.Load(), left.Load()}
	}
	checked := false
	for deadline := time.Now().Add(time.Minute); !checked; {
		if time.Now().After(deadline) {
			t.Fatal("no open period of the breaker (4 s) was long enough for a check of 1.6 s within a minute")
		}
		p, open := current()
		if !open {
			time.Sleep(5 * time.Millisecond)
			continue
		}
		// Outcomes of the calls that were in flight when it opened land
		// first (and of a claim that was under way as it opened, or of
		// the probe that failed): the baseline is taken once nothing is
		// in flight in two samples 50 ms apart, each in one snapshot.
		f1, c1, b1 := sample()
		time.Sleep(50 * time.Millisecond)
		f2, c2, b2 := sample()
		// While open: nothing is claimed, so no attempt row appears and
		// no attempt count grows.
		time.Sleep(1500 * time.Millisecond)
		_, c3, b3 := sample()
		if q, open := current(); !open || q != p || f1 != 0 || f2 != 0 || c1 != c2 || b1 != b2 {
			continue // not one open period, or not settled at its start: the next one
		}
		if c3 != c2 || b3 != b2 {
			t.Fatalf("while open: claims %d -> %d, attempt counts %d -> %d; want no change", c2, c3, b2, b3)
		}
		checked = true
	}
	// Each open period ends in one probe call (while the rail is down).
	if calls := b.sandbox.Stats().Calls; calls > 3+64+left.Load() {
		t.Fatalf("rail called %d times over %d open periods; an open breaker should stop the calls", calls, opened.Load())
	}
	b.sandbox.SetDown(nil)
	b.waitDrained(t, 2*time.Minute)
	rep := b.verify(t, true)
	if rep.Dispatched != 200 || rep.DeadLetters != 0 {
		t.Fatalf("report %+v: want everything dispatched after recovery", rep)
	}
	for _, c := range []string{"closed->open", "open->half-open", "half-open->closed"} {
		if _, ok := changes.Load(c); !ok {
			t.Errorf("breaker never went %s", c)
		}
	}
}

// TestTimeoutRetriesWithSameKey: the rail pays but answers too late; the
// relayer records RAIL_TIMEOUT, retries with the same idempotency key, and
// the rail recognises it: one payment, zero effective duplicates.
func TestTimeoutRetriesWithSameKey(t *testing.T) {
	t.Parallel()
	b := setup(t, rails.SandboxOptions{Seed: 9, TimeoutRate: 0.5})
	set, err := rails.NewSet(rails.Options{Type: "sandbox", Profile: payment.Generic{}, Transport: b.sandbox,
		Timeout: 150 * time.Millisecond, Breaker: rails.BreakerOptions{Disabled: true}})
	if err != nil {
		t.Fatal(err)
	}
	cfg := b.config("timeouts")
	cfg.Rails = set
	b.enqueue(t, 60, 6)
	b.start(t, cfg)
	b.waitDrained(t, 2*time.Minute)
	rep := b.verify(t, true)
	timeouts := countCode(t, b, string(rails.CodeRailTimeout))
	st := b.sandbox.Stats()
	if timeouts == 0 || st.Timeouts == 0 {
		t.Fatalf("no timeouts happened (archive %d, sandbox %+v): the test proves nothing", timeouts, st)
	}
	if rep.Dispatched != 60 || st.Payments != 60 || st.EffectiveDuplicates != 0 || st.Replays < timeouts {
		t.Fatalf("report %+v, sandbox %+v, %d timeouts: want 60 payments, every timed-out call replayed, no duplicates", rep, st, timeouts)
	}
	// Every retry after a timeout carried the same key: the rail answered
	// DUPLICATE for exactly those.
	var dupAnswers int64
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox.attempts WHERE rail_code = $1`, rails.SandboxDuplicate).Scan(&dupAnswers); err != nil {
		t.Fatal(err)
	}
	if dupAnswers == 0 {
		t.Fatal("no retry was recognised by its idempotency key")
	}
}

func countCode(t *testing.T, b *testBundle, code string) int64 {
	t.Helper()
	var n int64
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox.attempts WHERE error_code = $1`, code).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestWebhookRailEndToEnd dispatches through the webhook transport to a
// TLS server that verifies signatures and answers 429 with Retry-After,
// then 422, then 200. Retry-After is honoured; the secret appears in no log
// line and no attempt row.
func TestWebhookRailEndToEnd(t *testing.T) {
	t.Parallel()
	b := setup(t, rails.SandboxOptions{})
	const secret = "whsec-do-not-leak-7f3a9c"
	var calls sync.Map // idempotency key -> *atomic.Int32
	var badSignatures atomic.Int32
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if err := rails.VerifySignature([]byte(secret), r.Header, body, time.Now(), 5*time.Minute); err != nil {
			badSignatures.Add(1)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		key := r.Header.Get(rails.HeaderIdempotencyKey)
		n, _ := calls.LoadOrStore(key, new(atomic.Int32))
		switch call := n.(*atomic.Int32).Add(1); {
		case strings.Contains(key, "reject"):
			w.WriteHeader(http.StatusUnprocessableEntity)
			fmt.Fprint(w, `{"message":"account closed"}`)
		case call == 1:
			w.Header().Set("Retry-After", "2")
			w.WriteHeader(http.StatusTooManyRequests)
		default:
			fmt.Fprintf(w, `{"reference":"psp-%s"}`, key)
		}
	}))
	t.Cleanup(srv.Close)
	pool := x509Pool(t, srv)
	hook, err := rails.NewWebhook(rails.WebhookOptions{URL: srv.URL, Secret: []byte(secret), RootCAs: pool})
	if err != nil {
		t.Fatal(err)
	}
	set, err := rails.NewSet(rails.Options{Type: "psp", Profile: payment.Generic{}, Transport: hook, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	var logMu sync.Mutex
	cfg := b.config("webhook")
	cfg.Rails = set
	cfg.BackoffBase, cfg.BackoffCap = time.Millisecond, 2*time.Millisecond
	cfg.Logger = slog.New(slog.NewJSONHandler(lockedWriter{&logMu, &logs}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	producer, err := pending.NewProducer(pending.Config{Rails: set.Catalog()}) // knows the psp rail type
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"pay-1", "pay-2", "reject-1"} {
		in := instruction("p-"+key, 1)
		in.RailType, in.IdempotencyKey = "psp", key
		if _, err := producer.Enqueue(b.ctx, b.pool, in); err != nil {
			t.Fatal(err)
		}
	}
	b.start(t, cfg)
	b.waitDrained(t, time.Minute)
	rep := b.verify(t, true)
	if rep.Dispatched != 2 || rep.DeadLetters != 1 || badSignatures.Load() != 0 {
		t.Fatalf("report %+v, bad signatures %d", rep, badSignatures.Load())
	}
	// Retry-After: 2 s was honoured even though the backoff says 2 ms.
	rows, err := b.pool.Query(b.ctx, `SELECT extract(epoch FROM next_attempt_at - completed_at)
		FROM outbox.attempts WHERE state = 'RETRYABLE'`)
	if err != nil {
		t.Fatal(err)
	}
	waits, err := pgx.CollectRows(rows, pgx.RowTo[float64])
	if err != nil {
		t.Fatal(err)
	}
	if len(waits) != 2 {
		t.Fatalf("%d retries, want one per paid instruction", len(waits))
	}
	for _, w := range waits {
		if w < 1.99 {
			t.Errorf("retry scheduled after %.3fs, want at least the 2 s Retry-After", w)
		}
	}
	var archived string
	if err := b.pool.QueryRow(b.ctx, `SELECT string_agg(concat_ws('|', rail_reference, rail_code, error_code, error_message, payload::text), '\n')
		FROM outbox.attempts`).Scan(&archived); err != nil {
		t.Fatal(err)
	}
	logMu.Lock()
	defer logMu.Unlock()
	if strings.Contains(archived, secret) || strings.Contains(logs.String(), secret) {
		t.Fatal("the webhook secret leaked into the archive or the logs")
	}
	if !strings.Contains(archived, "HTTP_422") || !strings.Contains(archived, "psp-pay-1") {
		t.Fatalf("archive lacks the rail's answers:\n%s", archived)
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// x509Pool trusts the test server's certificate, so TLS verification stays
// on.
func x509Pool(t *testing.T, srv *httptest.Server) *x509.CertPool {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AddCert(srv.Certificate())
	return pool
}

// TestWebhookServerErrorDeadLetterOutcome guards the dead letters that
// operators replay blindly: a webhook answer that may come after the
// receiver acted (500; a gateway's 502 or 504 after its upstream got the
// payment) must leave a dead letter marked outcome unknown, while 503, a
// refusal before any processing, must not (docs/operations.md, "After a
// rail outage").
func TestWebhookServerErrorDeadLetterOutcome(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		status  int
		code    rails.ErrorCode
		unknown bool
	}{
		{http.StatusInternalServerError, rails.CodeRailUpstreamError, true},
		{http.StatusBadGateway, rails.CodeRailUpstreamError, true},
		{http.StatusGatewayTimeout, rails.CodeRailUpstreamError, true},
		{http.StatusServiceUnavailable, rails.CodeRailUnavailable, false},
	} {
		t.Run(strconv.Itoa(tt.status), func(t *testing.T) {
			t.Parallel()
			b := setup(t, rails.SandboxOptions{})
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(tt.status) }))
			t.Cleanup(srv.Close)
			hook, err := rails.NewWebhook(rails.WebhookOptions{URL: srv.URL, Secret: []byte("0123456789abcdef0123456789abcdef")})
			if err != nil {
				t.Fatal(err)
			}
			set, err := rails.NewSet(rails.Options{Type: "sandbox", Profile: payment.Generic{}, Transport: hook,
				Timeout: 5 * time.Second, Breaker: rails.BreakerOptions{Disabled: true}})
			if err != nil {
				t.Fatal(err)
			}
			cfg := b.config("upstream-error")
			cfg.Rails, cfg.MaxAttempts = set, 1 // the first answer makes the dead letter
			r, err := New(nil, cfg)
			if err != nil {
				t.Fatal(err)
			}
			var recs []Recorded
			if err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
				if _, err := b.producer.Enqueue(b.ctx, tx, instruction("p1", 1)); err != nil {
					return err
				}
				recs, err = r.RelayOnce(b.ctx, tx)
				return err
			}); err != nil {
				t.Fatal(err)
			}
			if len(recs) != 1 || recs[0].Result() != ResultDead {
				t.Fatalf("recorded %+v, want one dead letter", recs)
			}
			rec := recs[0]
			if rec.RailCode != "HTTP_"+strconv.Itoa(tt.status) || !strings.Contains(rec.ErrorMessage, string(tt.code)) {
				t.Errorf("rail code %q, message %q: want HTTP_%d classified %s", rec.RailCode, rec.ErrorMessage, tt.status, tt.code)
			}
			if rec.OutcomeUnknown != tt.unknown {
				t.Errorf("HTTP %d dead-lettered with outcome_unknown=%t, want %t", tt.status, rec.OutcomeUnknown, tt.unknown)
			}
		})
	}
}

// TestRetryAfterOfAGoTransportIsCapped: a Go transport's answer asks for
// a retry in 1000 hours, and another's for a negative delay. The first
// waits at most rails.MaxRetryAfter (an hour), as a webhook's Retry-After
// does; the second waits the backoff. Before, a Go transport's delay was
// taken whole: one answer parked the instruction, and with ordering its
// participant's every later instruction, for six weeks.
func TestRetryAfterOfAGoTransportIsCapped(t *testing.T) {
	t.Parallel()
	b := setup(t, rails.SandboxOptions{})
	b.useTransport(t, funcTransport(func(_ context.Context, ins payment.Instruction) (rails.Result, error) {
		after := 1000 * time.Hour
		if strings.HasSuffix(ins.ParticipantID, "negative") {
			after = -time.Hour
		}
		return rails.Result{Code: rails.SandboxRateLimited, RetryAfter: after}, nil
	}), 5*time.Second)
	cfg := b.config("retry-after")
	r, err := New(nil, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var waits []float64
	if err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		for _, p := range []string{"p-huge", "p-negative"} {
			if _, err := b.producer.Enqueue(b.ctx, tx, instruction(p, 1)); err != nil {
				return err
			}
		}
		if _, err := r.RelayOnce(b.ctx, tx); err != nil {
			return err
		}
		rows, err := tx.Query(b.ctx, `SELECT extract(epoch FROM next_attempt_at - completed_at)::float8
			FROM outbox.attempts WHERE state = 'RETRYABLE' ORDER BY participant_id`)
		if err != nil {
			return err
		}
		waits, err = pgx.CollectRows(rows, pgx.RowTo[float64])
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if len(waits) != 2 {
		t.Fatalf("%d retries recorded, want 2", len(waits))
	}
	if huge := waits[0]; huge < rails.MaxRetryAfter.Seconds()-1 || huge > rails.MaxRetryAfter.Seconds()+1 {
		t.Errorf("a 1000 h Retry-After made the retry wait %.0f s, want %.0f s", huge, rails.MaxRetryAfter.Seconds())
	}
	if negative := waits[1]; negative < 0 || negative > cfg.BackoffCap.Seconds()+1 {
		t.Errorf("a negative Retry-After made the retry wait %.3f s, want the backoff (at most %s)", negative, cfg.BackoffCap)
	}
}
