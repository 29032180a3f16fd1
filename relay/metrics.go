package relay

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ledgerline/outbox/attempts"
	"github.com/ledgerline/outbox/engine"
	"github.com/ledgerline/outbox/internal/sharedread"
	"github.com/ledgerline/outbox/rails"
	"github.com/ledgerline/outbox/reaper"
)

// Metrics are the service's Prometheus collectors. Counters come from the
// relayer's and reaper's own counts; queue gauges from a snapshot of the
// hot tables (never the archive) taken at scrape time, at most once per
// Config.QueueGaugesMaxAge however many scrapers there are; latencies and
// error codes from the relayer's outcome hook. The metric names:
//
//	outbox_pending_depth, outbox_due_depth, outbox_oldest_pending_age_seconds,
//	outbox_inflight, outbox_stuck_dispatching_count, outbox_dlq_depth,
//	outbox_snapshot_up                         queue gauges (scrape time)
//	outbox_rail_paused_seconds{rail_type}      how long each pause in force has lasted
//	outbox_attempts_total{state}               outcomes recorded by this relayer
//	outbox_attempt_errors_total{rail,error_code} failed attempts (not claims a stopping relayer released)
//	outbox_dispatch_latency_seconds            enqueue -> DISPATCHED
//	outbox_rail_call_seconds{rail}             rail call duration, every call (in whole milliseconds)
//	outbox_rail_breaker_state{rail}            0 closed, 1 half-open, 2 open
//	outbox_rail_overruns_total{rail}           calls whose transport ignored its deadline (rails.Set.Overruns)
//	outbox_rail_secret_rotations_total{rail}, outbox_rail_secret_refusals_total{rail},
//	outbox_rail_secret_refused{rail}           a secret file's rotations, reloads that refused it, and
//	                                           1 while the file holds a refused secret (rails.Set.SecretStatus)
//	outbox_outcome_writes_total, outbox_outcome_write_seconds_total
//	                                           outcome transactions, and the time they took
//	outbox_claim_batches_total, outbox_claimed_total, outbox_handoffs_total, outbox_notify_wakeups_total,
//	outbox_poll_wakeups_total, outbox_hot_poll_wakeups_total, outbox_late_outcomes_total
//	outbox_absorbed_outcomes_total             late outcomes of a claim that had one already, not archived
//	outbox_relayer_id_conflicts_total          registration refreshes that found another process under this relayer id
//	outbox_reaper_requeues_total               (with a reaper)
//	outbox_reaper_poison_total                 poison instructions dead-lettered (with a reaper)
type Metrics struct {
	latency  prometheus.Histogram
	railTime *prometheus.HistogramVec
	errors   *prometheus.CounterVec
	all      []prometheus.Collector
}

func newMetrics(pool *pgxpool.Pool, r *engine.Relayer, rp *reaper.Reaper, svc Config) (*Metrics, error) {
	cfg := svc.Relayer
	archive, err := attempts.New(cfg.Schema)
	if err != nil {
		return nil, err
	}
	m := &Metrics{
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
	m.all = []prometheus.Collector{m.latency, m.railTime, m.errors,
		newSnapshotCollector(pool, archive, svc.QueueGaugesMaxAge),
		breakerCollector{set: cfg.Rails}}
	// A transport that ignores its context is not bounded by the rail's
	// timeout (see rails.Transport): this is how an operator learns of it.
	overruns := prometheus.NewDesc("outbox_rail_overruns_total",
		fmt.Sprintf("Rail calls whose transport returned more than %s after the call's deadline (it does not honour its context, so the rail's timeout does not bound it), by rail.", rails.OverrunGrace),
		[]string{"rail"}, nil)
	m.all = append(m.all, funcCollector{desc: overruns, collect: func(ch chan<- prometheus.Metric) {
		for _, t := range cfg.Rails.Types() {
			ch <- prometheus.MustNewConstMetric(overruns, prometheus.CounterValue, float64(cfg.Rails.Overruns(t)), t)
		}
	}})
	// A secret file rotated into one the checks refuse leaves the rail
	// signing with the older secret: the receiver may soon refuse it.
	secretFamilies := []struct {
		desc  *prometheus.Desc
		kind  prometheus.ValueType
		value func(rails.SecretStatus) float64
	}{
		{prometheus.NewDesc("outbox_rail_secret_rotations_total", "Webhook secrets adopted from a changed secret file since start, by rail.", []string{"rail"}, nil),
			prometheus.CounterValue, func(s rails.SecretStatus) float64 { return float64(s.Rotations) }},
		{prometheus.NewDesc("outbox_rail_secret_refusals_total", "Reloads of a webhook secret file that refused its secret (the secret in force kept), by rail.", []string{"rail"}, nil),
			prometheus.CounterValue, func(s rails.SecretStatus) float64 { return float64(s.Failures) }},
		{prometheus.NewDesc("outbox_rail_secret_refused", "1 while a rail's webhook secret file holds a secret the checks refuse (requests are signed with the older secret in force), else 0.", []string{"rail"}, nil),
			prometheus.GaugeValue, func(s rails.SecretStatus) float64 {
				if s.Err != nil {
					return 1
				}
				return 0
			}},
	}
	for _, f := range secretFamilies {
		m.all = append(m.all, funcCollector{desc: f.desc, collect: func(ch chan<- prometheus.Metric) {
			for _, t := range cfg.Rails.Types() {
				if st, ok := cfg.Rails.SecretStatus(t); ok {
					ch <- prometheus.MustNewConstMetric(f.desc, f.kind, f.value(st), t)
				}
			}
		}})
	}
	counter := func(name, help string, f func(engine.Stats) int64) {
		m.all = append(m.all, prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help},
			func() float64 { return float64(f(r.Stats())) }))
	}
	counter("outbox_claim_batches_total", "Claims that returned work.", func(s engine.Stats) int64 { return s.ClaimBatches })
	counter("outbox_claimed_total", "Instructions claimed.", func(s engine.Stats) int64 { return s.Claimed })
	counter("outbox_handoffs_total", "Instructions claimed by a transaction that recorded outcomes (hand-offs: the freed participants' next instructions, then refills of the freed slots).", func(s engine.Stats) int64 { return s.Handoffs })
	counter("outbox_outcome_writes_total", "Outcome transactions committed (outcomes recorded per write: outbox_attempts_total / this).", func(s engine.Stats) int64 { return s.OutcomeWrites })
	m.all = append(m.all, prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "outbox_outcome_write_seconds_total",
		Help: "Time the committed outcome transactions took, each from sending its statements to its commit (the mean write: this / outbox_outcome_writes_total).",
	}, func() float64 { return r.Stats().OutcomeWriteTime.Seconds() }))
	counter("outbox_notify_wakeups_total", "Wakeups by NOTIFY.", func(s engine.Stats) int64 { return s.Notifications })
	counter("outbox_poll_wakeups_total", "Wakeups by the fallback poll.", func(s engine.Stats) int64 { return s.Polls })
	counter("outbox_hot_poll_wakeups_total", "Wakeups by a hot poll (shortly after a claim found work).", func(s engine.Stats) int64 { return s.HotPolls })
	counter("outbox_late_outcomes_total", "Outcomes recorded after the lease was reaped.", func(s engine.Stats) int64 { return s.Late })
	counter("outbox_relayer_id_conflicts_total", "Refreshes of this relayer's run registration that found another process running under its relayer id (which must name one running relayer).", func(s engine.Stats) int64 { return s.IDConflicts })
	counter("outbox_absorbed_outcomes_total", "Late outcomes not archived because their claim had an outcome already (a second outcome of one claim: two processes under one relayer id?).", func(s engine.Stats) int64 { return s.Absorbed })
	states := prometheus.NewDesc("outbox_attempts_total", "Attempt outcomes recorded by this relayer, by state.", []string{"state"}, nil)
	m.all = append(m.all, funcCollector{desc: states, collect: func(ch chan<- prometheus.Metric) {
		s := r.Stats()
		for state, v := range map[string]int64{"DISPATCHED": s.Dispatched, "RETRYABLE": s.Retried, "FAILED": s.Dead, "RELEASED": s.Released} {
			ch <- prometheus.MustNewConstMetric(states, prometheus.CounterValue, float64(v), state)
		}
	}})
	if rp != nil {
		m.all = append(m.all, prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "outbox_reaper_requeues_total", Help: "Zombie instructions requeued by this process's reaper.",
		}, func() float64 { return float64(rp.Stats().Requeued) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "outbox_reaper_poison_total",
				Help: "Poison instructions (their relayer died on them more often than the zombie limit) dead-lettered by this process's reaper, outcome unknown.",
			}, func() float64 { return float64(rp.Stats().DeadLettered) }))
	}
	return m, nil
}

func (m *Metrics) collectors() []prometheus.Collector { return m.all }

// observe is the relayer's OnRecorded hook.
func (m *Metrics) observe(recs []engine.Recorded) {
	for _, r := range recs {
		// Every call counts, those under a millisecond (LatencyMS 0)
		// included: otherwise _count is not the number of calls and the
		// quantiles lean towards the slow ones.
		if r.RailCalled() {
			m.railTime.WithLabelValues(r.RailType).Observe(float64(r.LatencyMS) / 1000)
		}
		switch r.Result() {
		case engine.ResultDispatched:
			m.latency.Observe(r.RecordedAt.Sub(r.EnqueuedAt).Seconds())
		case engine.ResultLate, engine.ResultReleased:
			// A released claim was handed back unsent by a stopping
			// relayer: no failed attempt (outbox_attempts_total counts it
			// as RELEASED), and counting it would make every rolling
			// restart look like a burst of rail errors.
		default:
			if r.ErrorCode != "" {
				m.errors.WithLabelValues(r.RailType, r.ErrorCode).Inc()
			}
		}
	}
}

// DefaultQueueGaugesMaxAge is Config.QueueGaugesMaxAge's default.
const DefaultQueueGaugesMaxAge = 5 * time.Second

// snapshotCollector reads the queue gauges at scrape time.
type snapshotCollector struct {
	snapshot *sharedread.Value[attempts.Snapshot]
}

func newSnapshotCollector(pool *pgxpool.Pool, archive *attempts.Archive, maxAge time.Duration) snapshotCollector {
	if maxAge <= 0 {
		maxAge = DefaultQueueGaugesMaxAge
	}
	return snapshotCollector{snapshot: sharedread.New(maxAge, func(ctx context.Context) (attempts.Snapshot, error) {
		return archive.Snapshot(ctx, pool)
	})}
}

var (
	descPending = prometheus.NewDesc("outbox_pending_depth", "Instructions waiting in pending (due or not).", nil, nil)
	descDue     = prometheus.NewDesc("outbox_due_depth", "Pending instructions due now.", nil, nil)
	descOldest  = prometheus.NewDesc("outbox_oldest_pending_age_seconds", "Age of the oldest due instruction.", nil, nil)
	descFlight  = prometheus.NewDesc("outbox_inflight", "Instructions in flight.", nil, nil)
	descStuck   = prometheus.NewDesc("outbox_stuck_dispatching_count", "In-flight instructions past their lease (a relayer died).", nil, nil)
	descDLQ     = prometheus.NewDesc("outbox_dlq_depth", "Dead letters not yet acknowledged.", nil, nil)
	descUp      = prometheus.NewDesc("outbox_snapshot_up", "1 if the queue snapshot could be read at this scrape.", nil, nil)
	// The vacuum horizon's holder (store.HorizonHolder); not exported on
	// a standby, whose sessions hold back nothing on the primary.
	descHorizonAge = prometheus.NewDesc("outbox_vacuum_horizon_age_seconds",
		"Age of the oldest transaction holding back vacuum in the outbox's database (0: none, or a holder known by transaction ids only: see outbox_vacuum_horizon_xid_age).", nil, nil)
	descHorizonXIDs = prometheus.NewDesc("outbox_vacuum_horizon_xid_age",
		"Transaction ids since the oldest horizon held in the outbox's database (session, prepared transaction, standby feedback or replication slot); 0: none.", nil, nil)
	// The archive's upkeep (store.ArchiveHealth).
	descCheckpointAge = prometheus.NewDesc("outbox_archive_checkpoint_age_seconds",
		"How long ago the last checkpoint's period ended (rows archived since are covered by the hash chains only); no series before the first checkpoint.", nil, nil)
	descMonthsReady = prometheus.NewDesc("outbox_archive_months_ready",
		"Months of the archive, from the current one (UTC) on, that have their partition: upkeep keeps 4; 0: this month's rows go to the default partition.", nil, nil)
	descDefaultRows = prometheus.NewDesc("outbox_archive_default_partition_rows",
		"Rows in the archive's default partition (the statistics collector's count; months stuck there until outbox archive move-default); not exported on a standby.", nil, nil)
	// One series per pause in force (rail_type "*": every rail); none
	// when nothing is paused.
	descRailPaused = prometheus.NewDesc("outbox_rail_paused_seconds",
		"How long an operator's pause of dispatch to a rail (rail_type \"*\": every rail) has been in force; no series when the rail is not paused.", []string{"rail_type"}, nil)
)

func (snapshotCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPending, descDue, descOldest, descFlight, descStuck, descDLQ, descUp, descHorizonAge, descHorizonXIDs, descRailPaused,
		descCheckpointAge, descMonthsReady, descDefaultRows} {
		ch <- d
	}
}

func (c snapshotCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	s, err := c.snapshot.Get(ctx)
	if err != nil {
		ch <- prometheus.MustNewConstMetric(descUp, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(descUp, prometheus.GaugeValue, 1)
	for d, v := range map[*prometheus.Desc]float64{descPending: float64(s.Pending), descDue: float64(s.Due),
		descOldest: s.OldestPendingSecs, descFlight: float64(s.InFlight), descStuck: float64(s.Stuck), descDLQ: float64(s.DeadLetters)} {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v)
	}
	for _, p := range s.PausedRails {
		ch <- prometheus.MustNewConstMetric(descRailPaused, prometheus.GaugeValue, p.AgeSeconds, p.RailType)
	}
	if a := s.Archive.CheckpointAgeSecs; a != nil {
		ch <- prometheus.MustNewConstMetric(descCheckpointAge, prometheus.GaugeValue, *a)
	}
	ch <- prometheus.MustNewConstMetric(descMonthsReady, prometheus.GaugeValue, float64(s.Archive.MonthsReady))
	if !s.Standby {
		ch <- prometheus.MustNewConstMetric(descDefaultRows, prometheus.GaugeValue, float64(s.Archive.DefaultRows))
		var age, xids float64
		if h := s.VacuumHorizon; h != nil {
			age, xids = h.AgeSeconds, float64(h.XIDAge)
		}
		ch <- prometheus.MustNewConstMetric(descHorizonAge, prometheus.GaugeValue, age)
		ch <- prometheus.MustNewConstMetric(descHorizonXIDs, prometheus.GaugeValue, xids)
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
