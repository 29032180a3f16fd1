package main

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ledgerline/outbox/admin"
	"github.com/ledgerline/outbox/attempts"
	"github.com/ledgerline/outbox/engine"
	"github.com/ledgerline/outbox/migrations"
	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/pending"
	"github.com/ledgerline/outbox/poolconfig"
	"github.com/ledgerline/outbox/rails"
	"github.com/ledgerline/outbox/relay"
)

// demoFlags configure `outbox demo`.
type demoFlags struct {
	rate          int
	participants  int
	relayers      int
	duration      time.Duration
	retryableRate float64
	terminalRate  float64
	latencyMin    time.Duration
	latencyMax    time.Duration
	ordered       bool
	outage        time.Duration
	keepConsole   bool
}

func runDemo(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet(env, "demo", "demo [flags]")
	var db dbFlags
	var rf relayFlags
	var df demoFlags
	db.register(fs, poolconfig.Operator("demo"))
	rf.registerShared(fs)
	fs.IntVar(&df.rate, "rate", 500, "instructions per second the producer stream enqueues")
	fs.IntVar(&df.participants, "participants", 100, "participants the stream spreads over")
	fs.IntVar(&df.relayers, "relayers", 2, "relayers to run")
	fs.DurationVar(&df.duration, "duration", 30*time.Second, "how long to produce (0: until Ctrl-C)")
	fs.Float64Var(&df.retryableRate, "retryable-rate", 0.03, "sandbox rail: share of calls answered retryable")
	fs.Float64Var(&df.terminalRate, "terminal-rate", 0.01, "sandbox rail: share of payments rejected terminally")
	fs.DurationVar(&df.latencyMin, "latency-min", 2*time.Millisecond, "sandbox rail: fastest answer")
	fs.DurationVar(&df.latencyMax, "latency-max", 20*time.Millisecond, "sandbox rail: slowest answer")
	fs.BoolVar(&df.ordered, "ordered", true, "per-participant ordering (as outbox migrate ordering-on|ordering-off sets it)")
	fs.DurationVar(&df.outage, "outage", 3*time.Second, "sandbox rail: an outage this long a third of the way through --duration, which opens its breaker once (0, or --duration 0: none)")
	fs.BoolVar(&df.keepConsole, "keep-console", false, "after the summary, keep the console up until Ctrl-C")
	logFormat := fs.String("log-format", "text", "log format: text or json")
	logLevel := fs.String("log-level", "error", "log level of the relayers (the summary is printed regardless)")
	if _, err := parseFlags(fs, env, args); err != nil {
		return err
	}
	if df.rate <= 0 || df.participants <= 0 || df.relayers <= 0 {
		return fmt.Errorf("%w: --rate, --participants and --relayers must be positive", errUsage)
	}
	if err := rf.checkRailDefaults(); err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	if err := rf.checkAdmin(); err != nil {
		return err
	}
	log, err := newLogger(env.stderr, *logFormat, *logLevel)
	if err != nil {
		return err
	}
	bootLog, _ := newLogger(env.stderr, *logFormat, "info")
	pool, cleanup, err := db.connect(ctx, bootLog, int32(8+4*df.relayers))
	if err != nil {
		return err
	}
	defer cleanup()
	if err := migrations.MigrateWith(ctx, pool, migrations.Options{Schema: db.schema}); err != nil {
		return err
	}
	if on, err := migrations.Ordered(ctx, pool, db.schema); err != nil {
		return err
	} else if on != df.ordered {
		if err := migrations.SetOrdered(ctx, pool, db.schema, df.ordered); err != nil {
			return err
		}
	}

	sandbox := rails.NewSandbox(rails.SandboxOptions{Seed: time.Now().UnixNano(), LatencyMin: df.latencyMin,
		LatencyMax: df.latencyMax, RetryableRate: df.retryableRate, TerminalRate: df.terminalRate})
	// Breakers open for 2 s (30 s by default) so the outage's shows and
	// heals within a demo.
	breaker := rails.BreakerOptions{OpenFor: 2 * time.Second}
	set, err := rails.NewSet(
		rails.Options{Type: "sandbox", Profile: payment.Generic{}, Transport: sandbox, Timeout: rf.railTimeout,
			MaxConcurrency: rf.railMaxConcurrency, Breaker: breaker},
		rails.Options{Type: "event", Profile: payment.Event{}, Transport: sandbox, Timeout: rf.railTimeout,
			MaxConcurrency: rf.railMaxConcurrency, Breaker: breaker})
	if err != nil {
		return err
	}
	archive, err := attempts.New(db.schema)
	if err != nil {
		return err
	}
	d := &demo{env: env, pool: pool, schema: db.schema, archive: archive, sandbox: sandbox,
		latency: hdrhistogram.New(1, int64(10*time.Minute/time.Microsecond), 3),
		window:  hdrhistogram.New(1, int64(10*time.Minute/time.Microsecond), 3)}

	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	// One relay service per relayer; the first also runs the reaper.
	var services []*relay.Service
	for i := range df.relayers {
		cfg := rf.serviceConfig(db.schema, set, log)
		cfg.Relayer.RelayerID = fmt.Sprintf("demo-relayer-%d", i+1)
		cfg.Relayer.OnRecorded = d.observe
		cfg.NoReaper = cfg.NoReaper || i > 0
		svc, err := relay.New(pool, cfg)
		if err != nil {
			return err
		}
		if err := svc.Start(runCtx); err != nil {
			return err
		}
		services = append(services, svc)
	}

	closeConsole, err := d.console(ctx, pool, db.schema, &rf, set, services[0], log)
	if err != nil {
		return err
	}
	defer closeConsole()
	outage, outageAt := df.outage > 0 && df.duration > 0, df.duration/3
	if outage {
		go d.outage(runCtx, outageAt, df.outage)
	}

	produceCtx := runCtx
	if df.duration > 0 {
		var cancel context.CancelFunc
		produceCtx, cancel = context.WithTimeout(runCtx, df.duration)
		defer cancel()
	}
	fmt.Fprintf(env.stdout, "demo: %d instr/s over %d participants, %d relayers, sandbox rail (%.1f%% retryable, %.1f%% rejected)\n",
		df.rate, df.participants, df.relayers, 100*df.retryableRate, 100*df.terminalRate)
	if outage {
		// Said up front: the pause in dispatches it causes is the point.
		fmt.Fprintf(env.stdout, "demo: the sandbox rail goes down at %s for %s; its breaker opens, instructions wait in pending, then it heals (--outage 0: none)\n",
			outageAt.Round(100*time.Millisecond), df.outage)
	}
	// A pause outlives the run that made it: one left in this database
	// holds the whole stream back, which the lines below would not say.
	if err := d.pausesBefore(ctx); err != nil {
		return err
	}
	d.header()
	var producer sync.WaitGroup
	producer.Add(1)
	go func() { defer producer.Done(); d.produce(produceCtx, df) }()

	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	start := time.Now()
	for produceCtx.Err() == nil {
		select {
		case <-produceCtx.Done():
		case <-tick.C:
			d.summary(ctx, time.Since(start))
		}
	}
	producer.Wait()

	// Let the relayers finish what is due (retries scheduled later stay
	// pending; they are durable and the next run picks them up).
	drainUntil := time.Now().Add(10 * time.Second)
	for ctx.Err() == nil && time.Now().Before(drainUntil) && d.due(ctx) > 0 {
		select {
		case <-ctx.Done():
		case <-tick.C:
			d.summary(ctx, time.Since(start))
		}
	}
	stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, svc := range services {
		_ = svc.Stop(stopCtx)
	}
	d.summary(context.Background(), time.Since(start))
	err = d.final(context.Background(), !df.ordered)
	if perr := d.pauses(context.Background()); err == nil {
		err = perr
	}
	if df.keepConsole && ctx.Err() == nil {
		fmt.Fprintln(env.stdout, "the console stays up until Ctrl-C")
		<-ctx.Done()
	}
	return err
}

// console serves the admin address (console, API, probes, metrics) for the
// demo: on --admin-addr, or a free local port, with the credentials of
// --admin-tokens-*, or a fresh operator token it prints.
func (d *demo) console(ctx context.Context, pool *pgxpool.Pool, schema string, rf *relayFlags, set *rails.Set,
	svc *relay.Service, log *slog.Logger) (func(), error) {
	tokens, err := rf.adminTokens(d.env)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errUsage, err)
	}
	secret := ""
	if len(tokens) == 0 {
		b := make([]byte, 16)
		_, _ = crand.Read(b)
		secret = "demo-" + hex.EncodeToString(b)
		tok, err := admin.NewToken("demo-operator", admin.RoleOperator, secret)
		if err != nil {
			return nil, err
		}
		tokens = []admin.Token{tok}
	}
	trusted, err := rf.trustedProxies()
	if err != nil {
		return nil, err
	}
	adm, err := admin.New(admin.Config{Pool: pool, Schema: schema, Tokens: tokens, Rails: set, Relayer: svc.Relayer(),
		DegradedAfter: rf.degradedAfter, HorizonDegradedAfter: rf.horizonAfter, MaxConcurrentRequests: rf.adminMaxRequests, TrustedProxies: trusted, Logger: log})
	if err != nil {
		return nil, err
	}
	addr := rf.adminAddr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	registry := prometheus.NewRegistry()
	for _, c := range svc.Collectors() {
		if err := registry.Register(c); err != nil {
			return nil, err
		}
	}
	shutdown, bound, err := serveAdmin(addr, adm, registry, log)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(d.env.stdout, "console: http://%s/console/", bound)
	if secret != "" {
		fmt.Fprintf(d.env.stdout, "  (sign in with the operator token %s)", secret)
	}
	fmt.Fprintln(d.env.stdout)
	go func() { <-ctx.Done(); adm.SetStopping() }()
	return shutdown, nil
}

// outage takes the sandbox rail down for a while, after a delay: its
// breaker opens, instructions wait in pending, and it heals.
func (d *demo) outage(ctx context.Context, after, length time.Duration) {
	select {
	case <-ctx.Done():
		return
	case <-time.After(after):
	}
	d.sandbox.SetDown(fmt.Errorf("%w: demo outage", rails.ErrUnavailable))
	select {
	case <-ctx.Done():
	case <-time.After(length):
	}
	d.sandbox.SetDown(nil)
}

// demo holds the live counters.
type demo struct {
	env     *environment
	pool    *pgxpool.Pool
	schema  string
	archive *attempts.Archive
	sandbox *rails.Sandbox

	// lastPauseEvent is the newest pause or resume recorded before the
	// run (nil: none), which the summary's account of pauses starts after.
	lastPauseEvent *uuid.UUID

	enqueued, dispatched, retried, dead atomic.Int64
	lastEnqueued                        int64
	mu                                  sync.Mutex
	latency, window                     *hdrhistogram.Histogram
}

// observe is every relayer's OnRecorded hook.
func (d *demo) observe(recs []engine.Recorded) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, r := range recs {
		switch r.Result() {
		case engine.ResultDispatched:
			d.dispatched.Add(1)
			us := r.RecordedAt.Sub(r.EnqueuedAt).Microseconds()
			_ = d.latency.RecordValue(max(us, 1))
			_ = d.window.RecordValue(max(us, 1))
		case engine.ResultDead:
			d.dead.Add(1)
		case engine.ResultRetried:
			d.retried.Add(1)
		}
	}
}

// produce enqueues a steady stream in small batches, one transaction each,
// every 10 ms.
func (d *demo) produce(ctx context.Context, df demoFlags) {
	producer, _ := pending.NewProducer(pending.Config{Schema: d.schema})
	run := mrand.Uint64()
	start := time.Now()
	n := 0
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		// Pace by elapsed time, not ticks: a slow commit makes the next
		// batch bigger instead of lowering the rate (up to what one batch
		// takes; the rest is owed at the next tick).
		owed := int(time.Since(start).Seconds()*float64(df.rate)) - n
		var batch []pending.Instruction
		for ; owed > 0 && len(batch) < pending.MaxBatchSize; owed-- {
			n++
			batch = append(batch, pending.Instruction{
				// The whole run in the id, as in the key: an instruction id
				// takes one key (migration 030), and two runs sharing a
				// shortened id would have their instructions refused.
				InstructionID:  fmt.Sprintf("demo-%016x-%d", run, n),
				ParticipantID:  fmt.Sprintf("merchant-%03d", mrand.IntN(df.participants)),
				IdempotencyKey: pending.DeterministicKey("demo", fmt.Sprint(run), fmt.Sprint(n)),
				RailType:       "sandbox",
				AmountMinor:    100 + mrand.Int64N(99_900),
				Currency:       "USD",
				Destination:    fmt.Sprintf("acct-%06d", mrand.IntN(1_000_000)),
			})
		}
		if len(batch) == 0 {
			continue
		}
		err := pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
			_, err := producer.EnqueueBatch(ctx, tx, batch)
			return err
		})
		if err != nil {
			if ctx.Err() == nil {
				fmt.Fprintln(d.env.stderr, "demo: enqueue:", err)
			}
			continue
		}
		d.enqueued.Add(int64(len(batch)))
	}
}

func (d *demo) header() {
	fmt.Fprintf(d.env.stdout, "%6s %7s %9s %10s %8s %6s %8s %8s %9s %9s\n",
		"time", "enq/s", "enqueued", "dispatched", "retried", "dead", "pending", "inflight", "p50", "p99")
}

// summary prints one line: counters, queue depth, and the enqueue→dispatch
// latency percentiles of the last interval.
func (d *demo) summary(ctx context.Context, elapsed time.Duration) {
	snap, _ := d.archive.Snapshot(ctx, d.pool)
	enq := d.enqueued.Load()
	d.mu.Lock()
	p50, p99 := d.window.ValueAtQuantile(50), d.window.ValueAtQuantile(99)
	d.window.Reset()
	d.mu.Unlock()
	fmt.Fprintf(d.env.stdout, "%6s %7d %9d %10d %8d %6d %8d %8d %9s %9s\n",
		elapsed.Round(time.Second), enq-d.lastEnqueued, enq, d.dispatched.Load(), d.retried.Load(), d.dead.Load(),
		snap.Pending, snap.InFlight, us(p50), us(p99))
	d.lastEnqueued = enq
}

// due counts what is still due or in flight, less what a pause of the
// demo's rail holds: the drain would wait for it in vain.
func (d *demo) due(ctx context.Context) int64 {
	snap, _ := d.archive.Snapshot(ctx, d.pool)
	if demoRailPaused(snap.PausedRails) {
		return snap.InFlight
	}
	return snap.Due + snap.InFlight
}

// demoRailPaused reports whether a pause in pauses holds the demo's rail.
func demoRailPaused(pauses []attempts.RailPause) bool {
	for _, p := range pauses {
		if p.RailType == "sandbox" || p.RailType == attempts.AllRails {
			return true
		}
	}
	return false
}

// pauseEventsKept bounds the record of pauses the summary reads back.
const pauseEventsKept = 1000

// pausesBefore notes where the record of pauses ends before the run, and
// says which pauses are already in force.
func (d *demo) pausesBefore(ctx context.Context) error {
	events, err := d.archive.RailPauseEvents(ctx, d.pool, 1)
	if err != nil {
		return err
	}
	if len(events) == 1 {
		d.lastPauseEvent = &events[0].ID
	}
	pauses, err := d.archive.RailPauses(ctx, d.pool)
	if err != nil {
		return err
	}
	for _, p := range pauses {
		fmt.Fprintf(d.env.stdout, "demo: %s is paused (by %s: %s): nothing of it is dispatched until `outbox rails resume %s` or the console resumes it\n",
			demoPauseName(p.RailType), p.PausedBy, p.Reason, demoShellWord(p.RailType))
	}
	return nil
}

// pauses ends the summary with the pauses in force and those made during
// the run: a paused rail explains dispatches that stopped, and
// instructions still pending.
func (d *demo) pauses(ctx context.Context) error {
	w := d.env.stdout
	pauses, err := d.archive.RailPauses(ctx, d.pool)
	if err != nil {
		return err
	}
	for _, p := range pauses {
		fmt.Fprintf(w, "%s is paused (by %s: %s) since %s: its instructions stay pending until it is resumed (outbox rails resume %s)\n",
			demoPauseName(p.RailType), p.PausedBy, p.Reason, p.PausedAt.UTC().Format(time.DateTime+" UTC"), demoShellWord(p.RailType))
	}
	events, err := d.archive.RailPauseEvents(ctx, d.pool, pauseEventsKept)
	if err != nil {
		return err
	}
	// Newest first: keep the run's, then read them oldest first.
	for i, e := range events {
		if d.lastPauseEvent != nil && e.ID == *d.lastPauseEvent {
			events = events[:i]
			break
		}
	}
	for i := len(events) - 1; i >= 0; i-- {
		e := events[i]
		if e.Action != "PAUSED" {
			continue
		}
		// The resume that ended it, if any, is a newer event of its rail.
		resumed := ""
		for j := i - 1; j >= 0; j-- {
			if events[j].RailType == e.RailType && events[j].Action == "RESUMED" {
				resumed = fmt.Sprintf(", and resumed (by %s: %s)", events[j].Operator, events[j].Reason)
				break
			}
		}
		if resumed == "" {
			resumed = ", and is paused still"
		}
		fmt.Fprintf(w, "%s was paused during the run (by %s: %s)%s\n", demoPauseName(e.RailType), e.Operator, e.Reason, resumed)
	}
	return nil
}

// demoPauseName names what a pause of railType pauses.
func demoPauseName(railType string) string {
	if railType == attempts.AllRails {
		return `every rail ("*")`
	}
	return fmt.Sprintf("rail %q", railType)
}

// demoShellWord is railType as a shell command line takes it: * quoted,
// or the shell would put the directory's files in its place.
func demoShellWord(railType string) string {
	if railType == attempts.AllRails {
		return "'*'"
	}
	return railType
}

func (d *demo) final(ctx context.Context, unordered bool) error {
	w := d.env.stdout
	d.mu.Lock()
	fmt.Fprintf(w, "\nenqueue→dispatch latency over the run: p50 %s, p99 %s, max %s (%d dispatched)\n",
		us(d.latency.ValueAtQuantile(50)), us(d.latency.ValueAtQuantile(99)), us(d.latency.Max()), d.latency.TotalCount())
	d.mu.Unlock()
	st := d.sandbox.Stats()
	fmt.Fprintf(w, "sandbox rail: %d calls, %d payments, %d idempotent replays, %d rejected, effective duplicates %d\n",
		st.Calls, st.Payments, st.Replays, st.Rejected, st.EffectiveDuplicates)
	rep, err := d.archive.Verify(ctx, d.pool, attempts.VerifyOptions{Ordered: !unordered})
	if err != nil {
		return err
	}
	why := "retries not yet due"
	if pauses, err := d.archive.RailPauses(ctx, d.pool); err != nil {
		return err
	} else if demoRailPaused(pauses) {
		why = "held by a pause of the rail, or retries not yet due"
	}
	fmt.Fprintf(w, "database: %d instructions: %d dispatched, %d dead letters, %d pending (%s), %d in flight; %d attempt rows\n",
		rep.Instructions, rep.Dispatched, rep.DeadLetters, rep.Pending, why, rep.InFlight, rep.Attempts)
	if rep.OK() {
		fmt.Fprintln(w, "invariants: OK (nothing lost, nothing in two places, sequences gap-free, ordering kept, attempt trails complete)")
		return nil
	}
	for _, v := range rep.Violations {
		fmt.Fprintln(w, "invariant violated:", v)
	}
	return exitError{code: 1}
}

func us(v int64) string {
	return (time.Duration(v) * time.Microsecond).Round(100 * time.Microsecond).String()
}
