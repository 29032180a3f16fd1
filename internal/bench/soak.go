package bench

import (
	"context"
	"fmt"
	"runtime"
	"runtime/metrics"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ledgerline/outbox/engine"
	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/pending"
	"github.com/ledgerline/outbox/reaper"
)

// DefaultSoakDuration and DefaultSoakReport are the soak workload's run
// length and report interval when Config leaves them zero.
const (
	DefaultSoakDuration = 10 * time.Minute
	DefaultSoakReport   = 30 * time.Second
)

// SoakSample is what the soak workload reports at each interval: the
// tables that must stay bounded (pending, inflight), the ones that grow
// by design (idempotency_keys, the current archive partition), the
// relayers' process, and the latency of the interval.
type SoakSample struct {
	ElapsedSeconds float64      `json:"elapsed_s"`
	Tables         []TableStats `json:"tables"`
	RSSMiB         float64      `json:"rss_mib"`
	// HeapMiB is the Go heap that survived the last collection: memory
	// the process holds on to, without the garbage RSS also counts.
	HeapMiB    float64 `json:"heap_live_mib"`
	Goroutines int     `json:"goroutines"`
	// P99 is enqueue to outcome committed, over this interval only (ms).
	P99 float64 `json:"p99_ms"`
}

// TableStats is one table's size and vacuum state.
type TableStats struct {
	Table       string `json:"table"`
	HeapBytes   int64  `json:"heap_bytes"`
	IndexBytes  int64  `json:"index_bytes"`
	LiveTuples  int64  `json:"live_tuples"`
	DeadTuples  int64  `json:"dead_tuples"`
	Autovacuums int64  `json:"autovacuums"`
}

// Table returns the stats of the table named name ("pending", "inflight",
// "idempotency_keys", or "archive" for the current archive partition).
func (s SoakSample) Table(name string) TableStats {
	for _, t := range s.Tables {
		if t.Table == name {
			return t
		}
	}
	return TableStats{Table: name}
}

// String is the sample as one line of text.
func (s SoakSample) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "soak t=%4.0fs rss %5.1f MiB heap %5.1f MiB goroutines %4d p99 %6.2f ms", s.ElapsedSeconds, s.RSSMiB, s.HeapMiB, s.Goroutines, s.P99)
	for _, t := range s.Tables {
		fmt.Fprintf(&b, " | %s %s+%s idx, %d live %d dead, %d autovacuums", t.Table,
			mib(t.HeapBytes), mib(t.IndexBytes), t.LiveTuples, t.DeadTuples, t.Autovacuums)
	}
	return b.String()
}

func mib(b int64) string { return fmt.Sprintf("%.1fMiB", float64(b)/(1<<20)) }

// soakTablesSQL reads the sizes and vacuum counters of the soak's tables.
// The statistics views lag by up to a second (the stats collector's
// flush), which is well inside a report interval.
const soakTablesSQL = `
SELECT CASE WHEN c.relname LIKE 'attempts_%' THEN 'archive' ELSE c.relname END,
       pg_table_size(c.oid), pg_indexes_size(c.oid),
       coalesce(s.n_live_tup, 0), coalesce(s.n_dead_tup, 0), coalesce(s.autovacuum_count, 0)
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE n.nspname = $1
  AND c.relname IN ('pending', 'inflight', 'idempotency_keys',
                    'attempts_' || to_char(now() AT TIME ZONE 'UTC', 'YYYY_MM'))
ORDER BY array_position(ARRAY['pending', 'inflight', 'idempotency_keys'], c.relname::text) NULLS LAST`

// soak runs a steady stream of Rate instructions per second for Duration
// (default 10 minutes) with ordering on, relayers and a reaper as a
// deployment runs them, and reports a SoakSample every Report interval
// (default 30 s): what a long run does to the hot tables' sizes, dead
// tuples and the process's memory. Its last result compares the first and
// last samples.
func (r *runner) soak(ctx context.Context) ([]Result, error) {
	duration, every := r.cfg.Duration, r.cfg.Report
	if !r.cfg.durationSet {
		duration = DefaultSoakDuration
	}
	if every <= 0 {
		every = DefaultSoakReport
	}
	schema, drop, err := r.freshSchema(ctx, true)
	if err != nil {
		return nil, err
	}
	defer drop()
	r.settle(ctx)

	var (
		enqueuedAt sync.Map // instruction id -> time.Time
		mu         sync.Mutex
		interval   = newHistogram() // this report interval's outcomes
		whole      = newHistogram()
		recorded   rate
	)
	_, stopRelayers, err := r.relayers(ctx, schema, nil, func(recs []engine.Recorded) {
		mu.Lock()
		defer mu.Unlock()
		for _, rec := range recs {
			recorded.n.Add(1)
			if t, ok := enqueuedAt.LoadAndDelete(rec.InstructionID); ok && rec.State == store.Dispatched {
				d := max(1, rec.RecordedAt.Sub(t.(time.Time)).Microseconds())
				_ = interval.RecordValue(d)
				_ = whole.RecordValue(d)
			}
		}
	})
	if err != nil {
		return nil, err
	}
	defer stopRelayers()
	rp, err := reaper.New(r.relayerDB, reaper.Config{Schema: schema})
	if err != nil {
		return nil, err
	}
	if err := rp.Start(ctx); err != nil {
		return nil, err
	}
	defer func() { _ = rp.Stop(context.Background()) }()
	producer, err := pending.NewProducer(pending.Config{Schema: schema})
	if err != nil {
		return nil, err
	}

	var sent, failed atomic.Int64
	run := r.stream(ctx, duration, func(i int) {
		ins := instruction(r.runID, i, r.cfg.Participants)
		enqueuedAt.Store(ins.InstructionID, time.Now())
		if _, err := producer.Enqueue(ctx, r.producerDB, ins); err != nil {
			enqueuedAt.Delete(ins.InstructionID)
			failed.Add(1)
			return
		}
		sent.Add(1)
	})

	var results []Result
	var samples []SoakSample
	t0 := time.Now()
	lastAt := t0
	tick := time.NewTicker(every)
	defer tick.Stop()
	sample := func() error {
		mu.Lock()
		p99 := float64(interval.ValueAtQuantile(99)) / 1000
		interval.Reset()
		mu.Unlock()
		s, err := r.soakSample(ctx, schema, time.Since(t0), p99)
		if err != nil {
			return err
		}
		n := recorded.since()
		since := time.Since(lastAt)
		lastAt = time.Now()
		samples = append(samples, s)
		res := Result{Workload: "soak", Ordered: true, Participants: r.cfg.Participants, Instructions: int(n),
			MsgsPerSec: float64(n) / since.Seconds(), RSSMiB: s.RSSMiB, Seconds: s.ElapsedSeconds, Soak: &s}
		results = append(results, res)
		r.emit(res)
		return nil
	}
	for done := false; !done; {
		select {
		case <-tick.C:
			if err := sample(); err != nil {
				return results, err
			}
		case <-run.done:
			done = true
		case <-ctx.Done():
			return results, ctx.Err()
		}
	}
	if err := run.err(); err != nil {
		return results, err
	}
	// The end's own sample, unless a report was just made: the stream
	// ends with the duration, often before the tick of the same moment,
	// and "start vs end" compared the report before the end (with the
	// duration a multiple of the interval and two reports, the first
	// with itself).
	if time.Since(lastAt) > every/10 {
		if err := sample(); err != nil {
			return results, err
		}
	}
	stopRelayers()
	if err := r.verify(ctx, schema, true); err != nil {
		return results, err
	}
	if len(samples) == 0 {
		return results, fmt.Errorf("soak: no sample in %v (report interval %v)", duration, every)
	}
	first, last := samples[0], samples[len(samples)-1]
	mu.Lock()
	final := Result{Workload: "soak", Ordered: true, Participants: r.cfg.Participants, Instructions: int(sent.Load()),
		MsgsPerSec: float64(sent.Load()) / time.Since(t0).Seconds(), P50: ms(whole, 50), P99: ms(whole, 99), P999: ms(whole, 99.9),
		RSSMiB: last.RSSMiB, Seconds: time.Since(t0).Seconds(), Soak: &last,
		Note: fmt.Sprintf("start vs end: pending %s→%s, inflight %s→%s, keys %s→%s, archive %s→%s, rss %.1f→%.1f MiB, goroutines %d→%d, p99 %.2f→%.2f ms; %d enqueues failed, %d missed their schedule",
			mib(total(first.Table("pending"))), mib(total(last.Table("pending"))),
			mib(total(first.Table("inflight"))), mib(total(last.Table("inflight"))),
			mib(total(first.Table("idempotency_keys"))), mib(total(last.Table("idempotency_keys"))),
			mib(total(first.Table("archive"))), mib(total(last.Table("archive"))),
			first.RSSMiB, last.RSSMiB, first.Goroutines, last.Goroutines, first.P99, last.P99, failed.Load(), run.missed.Load())}
	mu.Unlock()
	r.emit(final)
	return append(results, final), nil
}

func total(t TableStats) int64 { return t.HeapBytes + t.IndexBytes }

// soakSample reads the tables' sizes and the process's state now.
func (r *runner) soakSample(ctx context.Context, schema string, elapsed time.Duration, p99 float64) (SoakSample, error) {
	live := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(live)
	s := SoakSample{ElapsedSeconds: elapsed.Round(time.Second).Seconds(), RSSMiB: float64(currentRSS()) / (1 << 20),
		Goroutines: runtime.NumGoroutine(), P99: p99}
	if live[0].Value.Kind() == metrics.KindUint64 {
		s.HeapMiB = float64(live[0].Value.Uint64()) / (1 << 20)
	}
	rows, err := r.cfg.Pool.Query(ctx, soakTablesSQL, schema)
	if err != nil {
		return s, fmt.Errorf("soak: table sizes: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var t TableStats
		if err := rows.Scan(&t.Table, &t.HeapBytes, &t.IndexBytes, &t.LiveTuples, &t.DeadTuples, &t.Autovacuums); err != nil {
			return s, fmt.Errorf("soak: table sizes: %w", err)
		}
		s.Tables = append(s.Tables, t)
	}
	return s, rows.Err()
}
