package relay_test

import (
	"context"
	"fmt"
	"io"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ledgerline/outbox/attempts"
	"github.com/ledgerline/outbox/engine"
	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/pending"
	"github.com/ledgerline/outbox/rails"
	"github.com/ledgerline/outbox/relay"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// TestMetricsReflectTheQueue drains a few instructions (one rejected by the
// rail) through an in-process service with its own registry and checks the
// scrape: outcome
// counters, error codes, latency samples, queue gauges and breaker state.
func TestMetricsReflectTheQueue(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := testdb.New(t)
	sbx := rails.NewSandbox(rails.SandboxOptions{})
	set, err := rails.NewSet(rails.Options{Type: "sandbox", Profile: payment.Generic{}, Transport: sbx})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	svc, err := relay.New(pool, relay.Config{
		Relayer: engine.Config{Rails: set, PollInterval: 100 * time.Millisecond},
		Metrics: reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	r := svc.Relayer()
	producer, _ := pending.NewProducer(pending.Config{})
	for i := range 5 {
		in := pending.Instruction{InstructionID: fmt.Sprint("m", i), ParticipantID: fmt.Sprint("p", i), IdempotencyKey: fmt.Sprint("k", i),
			RailType: "sandbox", AmountMinor: 100, Currency: "USD", Destination: "acct-1"}
		if _, err := producer.Enqueue(ctx, pool, in); err != nil {
			t.Fatal(err)
		}
	}
	// The rail rejects k0 terminally: reject its key before the relayer runs.
	sbx.Pay(payment.Instruction{IdempotencyKey: "k0"}, true)
	started := time.Now()
	if err := svc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = svc.Stop(sctx)
	}()
	deadline := time.Now().Add(30 * time.Second)
	for r.Stats().Dispatched+r.Stats().Dead < 5 {
		if time.Now().After(deadline) {
			t.Fatalf("not drained: %+v", r.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}

	body := scrapeOnce(t, reg)
	for _, want := range []string{
		`outbox_attempts_total{state="DISPATCHED"} 4`,
		`outbox_attempts_total{state="FAILED"} 1`,
		`outbox_attempt_errors_total{error_code="RAIL_REJECTED",rail="sandbox"} 1`,
		`outbox_dispatch_latency_seconds_count 4`,
		`outbox_dlq_depth 1`,
		`outbox_pending_depth 0`,
		`outbox_inflight 0`,
		`outbox_snapshot_up 1`,
		`outbox_rail_breaker_state{rail="sandbox"} 0`,
		`outbox_rail_overruns_total{rail="sandbox"} 0`,
		`outbox_reaper_requeues_total 0`,
		`outbox_archive_months_ready 4`,
		`outbox_archive_default_partition_rows 0`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("scrape lacks %q", want)
		}
	}
	// The outcome writes' time: some, and no more than the writes could
	// have taken since the start (one writer at a time, the default two
	// side by side at most).
	writes, writeSeconds := scraped(t, body, "outbox_outcome_writes_total"), scraped(t, body, "outbox_outcome_write_seconds_total")
	if writes < 1 || writeSeconds <= 0 || writeSeconds > 2*time.Since(started).Seconds() {
		t.Errorf("%v outcome writes took %v s in all, %v after the start", writes, writeSeconds, time.Since(started))
	}
	if t.Failed() {
		t.Logf("scrape:\n%s", body)
	}
}

// TestRailCallHistogramCountsEveryCall guards outbox_rail_call_seconds
// against dropping fast calls: latency is kept in whole milliseconds and
// only values above 0 were observed, so every call under 1 ms (all of the
// in-process sandbox's) was missing, its _count was not the number of rail
// calls and its quantiles leaned towards the slow ones.
func TestRailCallHistogramCountsEveryCall(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := testdb.New(t)
	sbx := rails.NewSandbox(rails.SandboxOptions{}) // answers at once
	set, err := rails.NewSet(rails.Options{Type: "sandbox", Profile: payment.Generic{}, Transport: sbx})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	svc, err := relay.New(pool, relay.Config{Relayer: engine.Config{Rails: set, PollInterval: 100 * time.Millisecond}, Metrics: reg})
	if err != nil {
		t.Fatal(err)
	}
	producer, _ := pending.NewProducer(pending.Config{})
	const n = 5
	for i := range n {
		in := pending.Instruction{InstructionID: fmt.Sprint("m", i), ParticipantID: fmt.Sprint("p", i), IdempotencyKey: fmt.Sprint("k", i),
			RailType: "sandbox", AmountMinor: 100, Currency: "USD", Destination: "acct-1"}
		if _, err := producer.Enqueue(ctx, pool, in); err != nil {
			t.Fatal(err)
		}
	}
	if err := svc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = svc.Stop(sctx)
	}()
	deadline := time.Now().Add(30 * time.Second)
	for svc.Relayer().Stats().Dispatched < n {
		if time.Now().After(deadline) {
			t.Fatalf("not drained: %+v", svc.Relayer().Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
	body := scrapeOnce(t, reg)
	if calls := sbx.Stats().Calls; calls != n {
		t.Fatalf("the rail was called %d times, want %d", calls, n)
	}
	if want := fmt.Sprintf(`outbox_rail_call_seconds_count{rail="sandbox"} %d`, n); !strings.Contains(string(body), want) {
		t.Errorf("the rail was called %d times; scrape lacks %q:\n%s", n, want, body)
	}
}

// scrapeOnce serves reg as /metrics does and returns one scrape.
func scrapeOnce(t *testing.T, reg *prometheus.Registry) []byte {
	t.Helper()
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return body
}

// scraped is the value of an unlabelled metric in a scrape.
func scraped(t *testing.T, body []byte, name string) float64 {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + name + ` (\S+)$`).FindSubmatch(body)
	if m == nil {
		t.Errorf("scrape lacks %s", name)
		return 0
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Errorf("%s: %v", name, err)
	}
	return v
}

// TestScrapesShareQueueGauges: the queue gauges count the whole queue, so
// the scrapes within QueueGaugesMaxAge, concurrent or not, share one read:
// what was enqueued after it shows only once the read is older than that.
func TestScrapesShareQueueGauges(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := testdb.New(t)
	set, err := rails.NewSet(rails.Options{Type: "sandbox", Profile: payment.Generic{}, Transport: rails.NewSandbox(rails.SandboxOptions{})})
	if err != nil {
		t.Fatal(err)
	}
	scrape := func(maxAge time.Duration) func() string {
		reg := prometheus.NewRegistry()
		// Not started: nothing leaves the queue.
		if _, err := relay.New(pool, relay.Config{Relayer: engine.Config{Rails: set}, Metrics: reg, QueueGaugesMaxAge: maxAge}); err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		t.Cleanup(srv.Close)
		return func() string {
			resp, err := srv.Client().Get(srv.URL)
			if err != nil {
				t.Error(err)
				return ""
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			return string(body)
		}
	}
	producer, _ := pending.NewProducer(pending.Config{})
	enqueue := func(from, to int) {
		for i := from; i < to; i++ {
			in := pending.Instruction{InstructionID: fmt.Sprint("m", i), ParticipantID: fmt.Sprint("p", i), IdempotencyKey: fmt.Sprint("k", i),
				RailType: "sandbox", AmountMinor: 100, Currency: "USD", Destination: "acct-1"}
			if _, err := producer.Enqueue(ctx, pool, in); err != nil {
				t.Fatal(err)
			}
		}
	}
	kept, fresh := scrape(time.Hour), scrape(time.Nanosecond)
	enqueue(0, 3)
	for _, first := range []func() string{kept, fresh} {
		if body := first(); !strings.Contains(body, "outbox_pending_depth 3\n") {
			t.Fatalf("first scrape:\n%s", body)
		}
	}
	enqueue(3, 5)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if body := kept(); !strings.Contains(body, "outbox_pending_depth 3\n") {
				t.Errorf("a scrape within the gauges' max age read the queue again:\n%s", body)
			}
		})
	}
	wg.Wait()
	if body := fresh(); !strings.Contains(body, "outbox_pending_depth 5\n") {
		t.Fatalf("a scrape past the gauges' max age:\n%s", body)
	}
}

// TestMetricsShowAHeldVacuumHorizon: a session that keeps a transaction
// open shows in the scrape as the horizon's age, in seconds and in
// transaction ids; both are 0 once it ends. The service connects as the
// administrative role, which tells the autovacuum workers that may visit
// the database (holding nothing back) from sessions.
func TestMetricsShowAHeldVacuumHorizon(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, err := pgxpool.New(ctx, testdb.AsAdmin(t, testdb.URL(t)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	scrape := snapshotScraper(t, pool)
	gauges := func() (age, xids float64) {
		t.Helper()
		body := scrape()
		for _, line := range strings.Split(body, "\n") {
			if v, ok := strings.CutPrefix(line, "outbox_vacuum_horizon_age_seconds "); ok {
				fmt.Sscan(v, &age)
			}
			if v, ok := strings.CutPrefix(line, "outbox_vacuum_horizon_xid_age "); ok {
				fmt.Sscan(v, &xids)
			}
		}
		if !strings.Contains(body, "outbox_vacuum_horizon_age_seconds ") || !strings.Contains(body, "outbox_vacuum_horizon_xid_age ") {
			t.Fatalf("the scrape lacks the vacuum horizon:\n%s", body)
		}
		return age, xids
	}
	if age, xids := gauges(); age != 0 || xids != 0 {
		t.Fatalf("nothing holds the horizon, yet the gauges say %v s, %v transaction ids", age, xids)
	}

	holder, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release()
	if _, err := holder.Exec(ctx, `BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1`); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := pool.Exec(ctx, `SELECT txid_current()`); err != nil {
			t.Fatal(err)
		}
	}
	if age, xids := gauges(); age <= 0 || xids < 3 {
		t.Errorf("a transaction holds the horizon, yet the gauges say %v s, %v transaction ids", age, xids)
	}
	if _, err := holder.Exec(ctx, `COMMIT`); err != nil {
		t.Fatal(err)
	}
	if age, xids := gauges(); age != 0 || xids != 0 {
		t.Errorf("after the commit the gauges say %v s, %v transaction ids", age, xids)
	}
}

// TestMetricsShowPausedRails: a series per pause in force, labelled with
// its rail type and growing with its age; gone once resumed.
func TestMetricsShowPausedRails(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := testdb.New(t)
	scrape := snapshotScraper(t, pool)
	paused := func() map[string]float64 {
		t.Helper()
		got := map[string]float64{}
		for _, line := range strings.Split(scrape(), "\n") {
			if rest, ok := strings.CutPrefix(line, `outbox_rail_paused_seconds{rail_type="`); ok {
				rail, v, _ := strings.Cut(rest, `"} `)
				var age float64
				fmt.Sscan(v, &age)
				got[rail] = age
			}
		}
		return got
	}
	if got := paused(); len(got) != 0 {
		t.Fatalf("nothing is paused, yet: %v", got)
	}
	archive, err := attempts.New("")
	if err != nil {
		t.Fatal(err)
	}
	for _, rail := range []string{"sandbox", attempts.AllRails} {
		if _, err := archive.PauseRail(ctx, pool, rail, "olga", "maintenance"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `UPDATE outbox.rail_pauses SET paused_at = now() - interval '90 minutes' WHERE rail_type = 'sandbox'`); err != nil {
		t.Fatal(err)
	}
	got := paused()
	if len(got) != 2 || got["sandbox"] < 5400 || got["sandbox"] > 5500 || got["*"] < 0 || got["*"] > 100 {
		t.Fatalf("paused rails: %v, want sandbox at about 5400 s and * at about 0", got)
	}
	if _, err := archive.ResumeRail(ctx, pool, "sandbox", "olga", "over"); err != nil {
		t.Fatal(err)
	}
	if got := paused(); len(got) != 1 || got["*"] > 100 {
		t.Fatalf("after the sandbox rail's resume: %v, want * alone", got)
	}
}

// snapshotScraper starts a relay service (not running: its collectors only)
// on pool with a sandbox rail and queue gauges read at every scrape, and
// returns a function that scrapes its metrics.
func snapshotScraper(t *testing.T, pool *pgxpool.Pool) func() string {
	t.Helper()
	set, err := rails.NewSet(rails.Options{Type: "sandbox", Profile: payment.Generic{}, Transport: rails.NewSandbox(rails.SandboxOptions{})})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	if _, err := relay.New(pool, relay.Config{Relayer: engine.Config{Rails: set}, Metrics: reg, QueueGaugesMaxAge: time.Nanosecond}); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(srv.Close)
	return func() string {
		t.Helper()
		resp, err := srv.Client().Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return string(body)
	}
}
