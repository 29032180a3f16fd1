package main

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ledgerline/outbox/attempts"
	"github.com/ledgerline/outbox/engine"
	"github.com/ledgerline/outbox/rails"
	"github.com/ledgerline/outbox/reaper"
)

// metrics exposes a relayer (and its reaper) to Prometheus. Counters come
// from the relayer's own counts, queue gauges from a snapshot of the hot
// tables taken at scrape time, latencies from the relayer's outcome hook.
type metrics struct {
	registry *prometheus.Registry
	latency  prometheus.Histogram
	railTime *prometheus.HistogramVec
	errors   *prometheus.CounterVec
}

func newMetrics(pool *pgxpool.Pool, archive *attempts.Archive, set *rails.Set) *metrics {
	m := &metrics{
		registry: prometheus.NewRegistry(),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "outbox_dispatch_latency_seconds", Help: "Enqueue to DISPATCHED, per instruction.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 16),
		}),
		railTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "outbox_rail_call_seconds", Help: "Duration of rail calls, by rail.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}, []string{"rail"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_attempt_errors_total", Help: "Failed attempts by rail and error code of the taxonomy.",
		}, []string{"rail", "error_code"}),
	}
	m.registry.MustRegister(m.latency, m.railTime, m.errors,
		snapshotCollector{pool: pool, archive: archive},
		breakerCollector{set: set})
	return m
}

// observe is the relayer's OnRecorded hook.
func (m *metrics) observe(recs []engine.Recorded) {
	for _, r := range recs {
		if r.LatencyMS > 0 {
			m.railTime.WithLabelValues(r.RailType).Observe(float64(r.LatencyMS) / 1000)
		}
		if r.Late {
			continue
		}
		if r.State == attempts.Dispatched {
			m.latency.Observe(r.RecordedAt.Sub(r.EnqueuedAt).Seconds())
		} else if r.ErrorCode != "" {
			m.errors.WithLabelValues(r.RailType, r.ErrorCode).Inc()
		}
	}
}

// registerRelayer exports the relayer's counters.
func (m *metrics) registerRelayer(r *engine.Relayer) {
	counter := func(name, help string, f func(engine.Stats) int64) {
		m.registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help},
			func() float64 { return float64(f(r.Stats())) }))
	}
	counter("outbox_claim_batches_total", "Claims that returned work.", func(s engine.Stats) int64 { return s.ClaimBatches })
	counter("outbox_claimed_total", "Instructions claimed.", func(s engine.Stats) int64 { return s.Claimed })
	counter("outbox_notify_wakeups_total", "Wakeups by NOTIFY.", func(s engine.Stats) int64 { return s.Notifications })
	counter("outbox_poll_wakeups_total", "Wakeups by the fallback poll.", func(s engine.Stats) int64 { return s.Polls })
	counter("outbox_late_outcomes_total", "Outcomes recorded after the lease was reaped.", func(s engine.Stats) int64 { return s.Late })
	states := prometheus.NewDesc("outbox_attempts_total", "Attempt outcomes recorded by this relayer, by state.", []string{"state"}, nil)
	m.registry.MustRegister(funcCollector{desc: states, collect: func(ch chan<- prometheus.Metric) {
		s := r.Stats()
		for state, v := range map[string]int64{"DISPATCHED": s.Dispatched, "RETRYABLE": s.Retried, "FAILED": s.Dead, "RELEASED": s.Released} {
			ch <- prometheus.MustNewConstMetric(states, prometheus.CounterValue, float64(v), state)
		}
	}})
}

// registerReaper exports the reaper's requeue count.
func (m *metrics) registerReaper(rp *reaper.Reaper) {
	m.registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "outbox_reaper_requeues_total", Help: "Zombie instructions requeued by this process's reaper.",
	}, func() float64 { return float64(rp.Stats().Requeued) }))
}

// serve serves /metrics until ctx ends.
func (m *metrics) serve(ctx context.Context, addr string, log *slog.Logger) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	log.Info("serving metrics", "addr", ln.Addr().String())
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server", "err", err)
		}
	}()
	return nil
}

// snapshotCollector reads the queue gauges at scrape time.
type snapshotCollector struct {
	pool    *pgxpool.Pool
	archive *attempts.Archive
}

var (
	descPending = prometheus.NewDesc("outbox_pending_depth", "Instructions waiting in pending (due or not).", nil, nil)
	descDue     = prometheus.NewDesc("outbox_due_depth", "Pending instructions due now.", nil, nil)
	descOldest  = prometheus.NewDesc("outbox_oldest_pending_age_seconds", "Age of the oldest due instruction.", nil, nil)
	descFlight  = prometheus.NewDesc("outbox_inflight", "Instructions in flight.", nil, nil)
	descStuck   = prometheus.NewDesc("outbox_stuck_dispatching_count", "In-flight instructions past their lease (a relayer died).", nil, nil)
	descDLQ     = prometheus.NewDesc("outbox_dlq_depth", "Dead letters not yet acknowledged.", nil, nil)
	descUp      = prometheus.NewDesc("outbox_snapshot_up", "1 if the queue snapshot could be read at this scrape.", nil, nil)
)

func (snapshotCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPending, descDue, descOldest, descFlight, descStuck, descDLQ, descUp} {
		ch <- d
	}
}

func (c snapshotCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	s, err := c.archive.Snapshot(ctx, c.pool)
	if err != nil {
		ch <- prometheus.MustNewConstMetric(descUp, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(descUp, prometheus.GaugeValue, 1)
	for d, v := range map[*prometheus.Desc]float64{descPending: float64(s.Pending), descDue: float64(s.Due),
		descOldest: s.OldestPendingSecs, descFlight: float64(s.InFlight), descStuck: float64(s.Stuck), descDLQ: float64(s.DeadLetters)} {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v)
	}
}

// breakerCollector exports each rail's circuit breaker state.
type breakerCollector struct{ set *rails.Set }

var descBreaker = prometheus.NewDesc("outbox_rail_breaker_state", "Circuit breaker state per rail: 0 closed, 1 half-open, 2 open.", []string{"rail"}, nil)

func (breakerCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descBreaker }

func (c breakerCollector) Collect(ch chan<- prometheus.Metric) {
	for _, t := range c.set.Types() {
		ch <- prometheus.MustNewConstMetric(descBreaker, prometheus.GaugeValue, float64(c.set.State(t)), t)
	}
}

// funcCollector adapts a function to a collector of one metric family.
type funcCollector struct {
	desc    *prometheus.Desc
	collect func(chan<- prometheus.Metric)
}

func (f funcCollector) Describe(ch chan<- *prometheus.Desc) { ch <- f.desc }
func (f funcCollector) Collect(ch chan<- prometheus.Metric) { f.collect(ch) }
