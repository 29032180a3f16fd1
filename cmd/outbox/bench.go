package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/attempts"
	"github.com/ledgerline/outbox/engine"
	"github.com/ledgerline/outbox/migrations"
	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/pending"
	"github.com/ledgerline/outbox/poolconfig"
	"github.com/ledgerline/outbox/rails"
)

// benchFlags configure `outbox bench`.
type benchFlags struct {
	instructions int
	participants int
	relayers     int
	rate         int
	duration     time.Duration
	producers    int
	pairs        int
	railLatency  time.Duration
	maxConc      int
	batchSize    int
	cpuProfile   string
}

var benchScenarios = []string{"drain", "latency", "enqueue"}

func runBench(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet(env, "bench", "bench [flags] [drain|latency|enqueue ...]   (default: all three)")
	var db dbFlags
	var bf benchFlags
	db.register(fs, poolconfig.Operator("bench"))
	fs.IntVar(&bf.instructions, "instructions", 100_000, "drain: instructions to enqueue, then drain")
	fs.IntVar(&bf.participants, "participants", 1000, "participants the instructions spread over")
	fs.IntVar(&bf.relayers, "relayers", 2, "relayers (in this process)")
	fs.IntVar(&bf.rate, "rate", 1000, "latency: steady enqueue rate (instructions/s)")
	fs.DurationVar(&bf.duration, "duration", 20*time.Second, "latency and enqueue: how long to run")
	fs.IntVar(&bf.producers, "producers", 16, "enqueue: concurrent producers (one instruction per transaction); latency: at least 32 are used")
	fs.IntVar(&bf.pairs, "pairs", 3, "enqueue: trigger on/off run pairs (the ratio reported is the median of the pairs' ratios)")
	fs.DurationVar(&bf.railLatency, "rail-latency", 0, "sandbox rail latency per call")
	fs.IntVar(&bf.maxConc, "max-concurrency", engine.DefaultMaxConcurrency, "relayer max concurrency")
	fs.IntVar(&bf.batchSize, "batch-size", engine.DefaultBatchSize, "relayer claim batch size")
	fs.StringVar(&bf.cpuProfile, "cpuprofile", "", "write a CPU profile (pprof) of the whole run to this file")
	if _, err := parseFlags(fs, env, args); err != nil {
		return err
	}
	if bf.cpuProfile != "" {
		f, err := os.Create(bf.cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if bf.pairs < 1 || bf.rate < 1 || bf.producers < 1 || bf.duration <= 0 {
		return fmt.Errorf("%w: --pairs, --rate, --producers and --duration must be positive", errUsage)
	}
	scenarios := fs.Args()
	if len(scenarios) == 0 {
		scenarios = benchScenarios
	}
	for _, s := range scenarios {
		if !slices.Contains(benchScenarios, s) {
			return fmt.Errorf("%w: unknown scenario %q (want %v)", errUsage, s, benchScenarios)
		}
	}
	log, err := newLogger(env.stderr, "text", "info")
	if err != nil {
		return err
	}
	pool, cleanup, err := db.connect(ctx, log, int32(max(bf.producers, latencyProducers)+8*bf.relayers+8))
	if err != nil {
		return err
	}
	defer cleanup()
	b := &bench{env: env, pool: pool, flags: bf}
	fmt.Fprintf(env.stdout, "bench: %d relayers, sandbox rail latency %v, max concurrency %d, batch %d\n",
		bf.relayers, bf.railLatency, bf.maxConc, bf.batchSize)
	for _, s := range scenarios {
		var err error
		switch s {
		case "drain":
			err = b.drain(ctx)
		case "latency":
			err = b.latency(ctx)
		case "enqueue":
			err = b.enqueue(ctx)
		}
		if err != nil {
			return fmt.Errorf("bench %s: %w", s, err)
		}
	}
	return nil
}

type bench struct {
	env   *environment
	pool  *pgxpool.Pool
	flags benchFlags
}

// settle starts a run from clean buffers: a CHECKPOINT, so no run pays for
// the writes of the one before (a 100,000-instruction drain leaves enough
// dirty buffers behind to halve the next run's commit rate on a small
// machine). It needs superuser or pg_checkpoint; without it runs are
// noisier, not wrong.
func (b *bench) settle(ctx context.Context) {
	_, _ = b.pool.Exec(ctx, "CHECKPOINT")
}

// freshSchema migrates a new schema for one run, with per-participant
// ordering on or off, and returns a cleanup that drops it.
func (b *bench) freshSchema(ctx context.Context, ordered bool) (string, func(), error) {
	schema := fmt.Sprintf("bench_%x", rand.Uint32())
	if err := migrations.MigrateWith(ctx, b.pool, migrations.Options{Schema: schema}); err != nil {
		return "", nil, err
	}
	if err := migrations.SetOrdered(ctx, b.pool, schema, ordered); err != nil {
		return "", nil, err
	}
	return schema, func() {
		_, _ = b.pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
	}, nil
}

// relayers starts the benchmark's relayers; observe sees every outcome.
func (b *bench) relayers(ctx context.Context, schema string, observe func([]engine.Recorded)) ([]*engine.Relayer, func(), error) {
	sbx := rails.NewSandbox(rails.SandboxOptions{LatencyMin: b.flags.railLatency, LatencyMax: b.flags.railLatency})
	set, err := rails.NewSet(rails.Options{Type: "sandbox", Profile: payment.Generic{}, Transport: sbx, MaxConcurrency: b.flags.maxConc})
	if err != nil {
		return nil, nil, err
	}
	var rs []*engine.Relayer
	stop := func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, r := range rs {
			_ = r.Stop(sctx)
		}
	}
	for i := range b.flags.relayers {
		r, err := engine.New(b.pool, engine.Config{Schema: schema, RelayerID: fmt.Sprintf("bench-%d", i), Rails: set,
			MaxConcurrency: b.flags.maxConc, BatchSize: b.flags.batchSize, OnRecorded: observe})
		if err != nil {
			stop()
			return nil, nil, err
		}
		if err := r.Start(ctx); err != nil {
			stop()
			return nil, nil, err
		}
		rs = append(rs, r)
	}
	return rs, stop, nil
}

func benchInstruction(run uint32, n, participants int) pending.Instruction {
	return pending.Instruction{
		InstructionID: fmt.Sprintf("bench-%x-%d", run, n), ParticipantID: fmt.Sprintf("p%05d", n%participants),
		IdempotencyKey: fmt.Sprintf("bench-%x-%d", run, n), RailType: "sandbox",
		AmountMinor: 1000, Currency: "USD", Destination: "acct-1",
	}
}

// drain enqueues N instructions, then measures how fast the relayers empty
// the queue, with ordering on and off.
func (b *bench) drain(ctx context.Context) error {
	fmt.Fprintf(b.env.stdout, "\n== drain: %d instructions over %d participants\n", b.flags.instructions, b.flags.participants)
	results := map[bool]float64{}
	for _, ordered := range []bool{true, false} {
		schema, drop, err := b.freshSchema(ctx, ordered)
		if err != nil {
			return err
		}
		producer, _ := pending.NewProducer(pending.Config{Schema: schema})
		run := rand.Uint32()
		for start := 0; start < b.flags.instructions; start += 1000 {
			batch := make([]pending.Instruction, 0, 1000)
			for n := start; n < min(start+1000, b.flags.instructions); n++ {
				batch = append(batch, benchInstruction(run, n, b.flags.participants))
			}
			if err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
				_, err := producer.EnqueueBatch(ctx, tx, batch)
				return err
			}); err != nil {
				drop()
				return err
			}
		}
		b.settle(ctx)
		var done atomic.Int64
		finished := make(chan struct{})
		var once sync.Once
		target := int64(b.flags.instructions)
		t0 := time.Now()
		_, stop, err := b.relayers(ctx, schema, func(recs []engine.Recorded) {
			for _, r := range recs {
				if r.State == attempts.Dispatched && done.Add(1) == target {
					once.Do(func() { close(finished) })
				}
			}
		})
		if err != nil {
			drop()
			return err
		}
		select {
		case <-finished:
		case <-ctx.Done():
		}
		elapsed := time.Since(t0)
		stop()
		drop()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		rate := float64(target) / elapsed.Seconds()
		results[ordered] = rate
		fmt.Fprintf(b.env.stdout, "ordering %-3s  %8.0f msgs/s  (%d in %v)\n", onOff(ordered), rate, target, elapsed.Round(time.Millisecond))
	}
	fmt.Fprintf(b.env.stdout, "ordered/unordered ratio: %.2f\n", results[true]/results[false])
	return nil
}

// latencyProducers is the least number of producers the latency scenario
// uses: with durable commits of a few milliseconds each, that many keep a
// steady 1,000/s with room to spare.
const latencyProducers = 32

// latency runs a steady, open-loop producer stream and reports
// enqueue→dispatch percentiles. The schedule is fixed in advance (one
// instruction every 1/rate seconds) and does not wait for slow commits, so
// the rate reported is the rate that was measured; it also says how far
// the producers fell behind it, if they did.
func (b *bench) latency(ctx context.Context) error {
	fmt.Fprintf(b.env.stdout, "\n== latency: steady %d msgs/s for %v (ordered, %d participants)\n", b.flags.rate, b.flags.duration, b.flags.participants)
	schema, drop, err := b.freshSchema(ctx, true)
	if err != nil {
		return err
	}
	defer drop()
	b.settle(ctx)
	hist := hdrhistogram.New(1, int64(time.Hour/time.Microsecond), 3)
	var mu sync.Mutex
	const warmupFor = 2 * time.Second
	warmup := time.Now().Add(warmupFor)
	_, stop, err := b.relayers(ctx, schema, func(recs []engine.Recorded) {
		mu.Lock()
		defer mu.Unlock()
		for _, r := range recs {
			if r.State == attempts.Dispatched && r.EnqueuedAt.After(warmup) {
				_ = hist.RecordValue(max(1, r.RecordedAt.Sub(r.EnqueuedAt).Microseconds()))
			}
		}
	})
	if err != nil {
		return err
	}
	defer stop()
	producer, _ := pending.NewProducer(pending.Config{Schema: schema})
	run := rand.Uint32()
	total := warmupFor + b.flags.duration
	interval := time.Second / time.Duration(b.flags.rate)

	// The pacer hands out instruction numbers on schedule; producers take
	// them. A number nobody could take within a second of its due time
	// counts as missed (the stream fell behind).
	work := make(chan int, b.flags.rate)
	var sent, failed, missed atomic.Int64
	var maxLag time.Duration // the pacer's own: only it reads and writes
	var wg sync.WaitGroup
	for range max(b.flags.producers, latencyProducers) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				if _, err := producer.Enqueue(ctx, b.pool, benchInstruction(run, i, b.flags.participants)); err != nil {
					failed.Add(1)
					continue
				}
				sent.Add(1)
			}
		}()
	}
	t0 := time.Now()
	for i := 0; ; i++ {
		due := t0.Add(time.Duration(i) * interval)
		if due.Sub(t0) >= total || ctx.Err() != nil {
			break
		}
		if d := time.Until(due); d > 0 {
			time.Sleep(d)
		} else {
			maxLag = max(maxLag, -d)
		}
		select {
		case work <- i:
		default:
			missed.Add(1)
		}
	}
	close(work)
	wg.Wait()
	elapsed := time.Since(t0)
	time.Sleep(time.Second) // let the tail dispatch
	if ctx.Err() != nil {
		return ctx.Err()
	}
	achieved := float64(sent.Load()) / elapsed.Seconds()
	mu.Lock()
	defer mu.Unlock()
	fmt.Fprintf(b.env.stdout, "sent %d in %v: %.0f/s of %d/s asked (%d missed, %d failed, pacer lag max %v)\n",
		sent.Load(), elapsed.Round(time.Millisecond), achieved, b.flags.rate, missed.Load(), failed.Load(),
		maxLag.Round(time.Microsecond))
	fmt.Fprintf(b.env.stdout, "enqueue→dispatch p50 %s  p99 %s  p99.9 %s  max %s  (%d samples after %v warm-up)\n",
		us(hist.ValueAtQuantile(50)), us(hist.ValueAtQuantile(99)), us(hist.ValueAtQuantile(99.9)), us(hist.Max()),
		hist.TotalCount(), warmupFor)
	if achieved < 0.95*float64(b.flags.rate) {
		fmt.Fprintf(b.env.stdout, "WARNING: the producers did not keep up; these are percentiles at %.0f/s, not at %d/s\n", achieved, b.flags.rate)
	}
	return nil
}

// enqueue measures producer throughput (one instruction per transaction)
// while relayers drain, with the NOTIFY trigger on and off.
//
// Commit latency (fsync) dominates this number and on small machines it
// drifts by a factor of two or more within minutes, so single runs compare
// nothing. The runs alternate on/off in pairs, each starting after a
// CHECKPOINT (so no run pays for an earlier one's dirty buffers), and the
// ratio reported is the median of the pairs' own ratios: drift between
// pairs cancels out.
func (b *bench) enqueue(ctx context.Context) error {
	fmt.Fprintf(b.env.stdout, "\n== enqueue: %d producers, one instruction per transaction, relayers draining, %v per run, %d on/off pairs\n",
		b.flags.producers, b.flags.duration, b.flags.pairs)
	var on, off, ratios []float64
	for pair := range b.flags.pairs {
		var onRate, offRate float64
		for _, trigger := range []bool{true, false} {
			if pair%2 == 1 {
				trigger = !trigger // alternate which goes first
			}
			rate, notified, err := b.enqueueRun(ctx, trigger)
			if err != nil {
				return err
			}
			if trigger {
				onRate = rate
			} else {
				offRate = rate
			}
			fmt.Fprintf(b.env.stdout, "pair %d  trigger %-3s  %8.0f enqueues/s  (relayer wakeups by NOTIFY: %d)\n", pair+1, onOff(trigger), rate, notified)
		}
		on, off, ratios = append(on, onRate), append(off, offRate), append(ratios, onRate/offRate)
	}
	fmt.Fprintf(b.env.stdout, "median: trigger on %.0f/s, off %.0f/s; on/off ratio median %.2f (pairs: %s)\n",
		median(on), median(off), median(ratios), formatRatios(ratios))
	return nil
}

// median returns the median of xs (which it sorts).
func median(xs []float64) float64 {
	slices.Sort(xs)
	n := len(xs)
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}

func formatRatios(xs []float64) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprintf("%.2f", x)
	}
	return strings.Join(parts, " ")
}

func (b *bench) enqueueRun(ctx context.Context, trigger bool) (float64, int64, error) {
	schema, drop, err := b.freshSchema(ctx, true)
	if err != nil {
		return 0, 0, err
	}
	defer drop()
	if err := migrations.SetNotify(ctx, b.pool, schema, trigger); err != nil {
		return 0, 0, err
	}
	b.settle(ctx)
	rs, stop, err := b.relayers(ctx, schema, nil)
	if err != nil {
		return 0, 0, err
	}
	producer, _ := pending.NewProducer(pending.Config{Schema: schema})
	pctx, cancel := context.WithTimeout(ctx, b.flags.duration)
	defer cancel()
	run := rand.Uint32()
	var n atomic.Int64
	var wg sync.WaitGroup
	for range b.flags.producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for pctx.Err() == nil {
				i := n.Add(1)
				if _, err := producer.Enqueue(pctx, b.pool, benchInstruction(run, int(i), b.flags.participants)); err != nil && pctx.Err() == nil {
					fmt.Fprintln(b.env.stderr, "enqueue:", err)
					return
				}
			}
		}()
	}
	t0 := time.Now()
	wg.Wait()
	elapsed := time.Since(t0)
	stop()
	var committed int64
	if err := b.pool.QueryRow(ctx, "SELECT count(*) FROM "+schema+".idempotency_keys").Scan(&committed); err != nil {
		return 0, 0, err
	}
	var notified int64
	for _, r := range rs {
		notified += r.Stats().Notifications
	}
	return float64(committed) / elapsed.Seconds(), notified, nil
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}
