package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"

	"github.com/ledgerline/outbox/engine"
	"github.com/ledgerline/outbox/internal/bench"
	"github.com/ledgerline/outbox/poolconfig"
)

func runBench(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet(env, "bench", "bench [flags] [drain|latency|enqueue|ceiling|notify|soak ...]   (default: drain latency enqueue ceiling)")
	var db dbFlags
	var cfg bench.Config
	var ordered, clients, cpuProfile, memProfile string
	db.register(fs, poolconfig.Operator("bench"))
	fs.IntVar(&cfg.Instructions, "instructions", 100_000, "drain and ceiling: instructions queued up front")
	fs.IntVar(&cfg.Participants, "participants", 1000, "participants the instructions spread over")
	fs.StringVar(&ordered, "ordered", "both", "drain and ceiling: ordering on, off or both")
	fs.IntVar(&cfg.Relayers, "relayers", 2, "relayers (in this process)")
	fs.IntVar(&cfg.Rate, "rate", 1000, "latency and soak: steady enqueue rate (instructions/s)")
	fs.DurationVar(&cfg.Duration, "duration", 0, "how long to run (0: 20s for latency, enqueue and notify; 10m for soak)")
	fs.DurationVar(&cfg.Report, "report", bench.DefaultSoakReport, "soak: interval between reports of table sizes, dead tuples, RSS, goroutines and p99")
	fs.IntVar(&cfg.Producers, "producers", 16, "enqueue and notify: concurrent producers (one instruction per transaction); latency uses at least 32")
	fs.IntVar(&cfg.Pairs, "pairs", 3, "notify: trigger on/off run pairs")
	fs.IntVar(&cfg.Rounds, "rounds", 1, "run the workloads this many times; every result says its round, drains alternate which ordering runs first, and the summary gives each ratio per round and its median")
	fs.DurationVar(&cfg.RailLatency, "rail-latency", 0, "sandbox rail latency per call")
	fs.IntVar(&cfg.MaxConcurrency, "max-concurrency", engine.DefaultMaxConcurrency, "each relayer's max concurrency")
	fs.IntVar(&cfg.BatchSize, "batch-size", engine.DefaultBatchSize, "each relayer's claim batch")
	fs.IntVar(&cfg.FlushSize, "flush-size", engine.DefaultFlushSize, "each relayer's largest outcome write (and the ceiling's batch: a draining relayer writes that many outcomes and claims as many in one transaction)")
	fs.StringVar(&clients, "clients", "", "ceiling: pgbench client counts to try, comma-separated (default 1,2,4,8 for claim+outcome, 4,8,16,32 for enqueue)")
	fs.BoolVar(&cfg.JSON, "json", false, "print one JSON object per result line")
	fs.BoolVar(&cfg.Roles, "roles", false, "run the relayers as outbox_relayer and the producers as outbox_producer (the roles script on each fresh schema, as a deployment with --create-roles): their row-level security and grants cost what they cost there (needs a superuser's URL, and those roles logging in without a password: the embedded cluster)")
	fs.StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile (pprof) of the whole run to this file")
	fs.StringVar(&memProfile, "memprofile", "", "write a heap profile (pprof) at the end of the run to this file (what is still live: a leak shows here)")
	if _, err := parseFlags(fs, env, args); err != nil {
		return err
	}
	switch ordered {
	case "both":
		cfg.Ordered = []bool{true, false}
	case "on":
		cfg.Ordered = []bool{true}
	case "off":
		cfg.Ordered = []bool{false}
	default:
		return fmt.Errorf("%w: --ordered %q: want on, off or both", errUsage, ordered)
	}
	for c := range strings.SplitSeq(clients, ",") {
		if c = strings.TrimSpace(c); c == "" {
			continue
		}
		n, err := strconv.Atoi(c)
		if err != nil || n < 1 {
			return fmt.Errorf("%w: --clients %q: want positive numbers", errUsage, clients)
		}
		cfg.Clients = append(cfg.Clients, n)
	}
	if cfg.Pairs < 1 || cfg.Rounds < 1 || cfg.Rate < 1 || cfg.Producers < 1 || cfg.Duration < 0 || cfg.Report <= 0 || cfg.Instructions < 1 || cfg.Participants < 1 {
		return fmt.Errorf("%w: --instructions, --participants, --pairs, --rounds, --rate, --producers and --duration must be positive", errUsage)
	}
	workloads := fs.Args()
	for _, w := range workloads {
		if !slices.Contains(bench.Workloads, w) {
			return fmt.Errorf("%w: unknown workload %q (want %v)", errUsage, w, bench.Workloads)
		}
	}
	if cpuProfile != "" {
		f, err := os.Create(cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if memProfile != "" {
		defer func() {
			if f, err := os.Create(memProfile); err == nil {
				runtime.GC()
				_ = pprof.Lookup("heap").WriteTo(f, 0)
				f.Close()
			}
		}()
	}
	log, err := newLogger(env.stderr, "text", "warn")
	if err != nil {
		return err
	}
	pool, cleanup, err := db.connect(ctx, log, int32(max(cfg.Producers, 32)+8*cfg.Relayers+8))
	if err != nil {
		return err
	}
	defer cleanup()
	cfg.Pool, cfg.Out, cfg.Progress = pool, env.stdout, env.stderr
	if !cfg.JSON {
		fmt.Fprintf(env.stdout, "bench: %d relayers, sandbox rail latency %v, max concurrency %d, claim batch %d, outcome writes up to %d\n",
			cfg.Relayers, cfg.RailLatency, cfg.MaxConcurrency, cfg.BatchSize, cfg.FlushSize)
	}
	results, err := bench.Run(ctx, cfg, workloads)
	if !cfg.JSON {
		for _, line := range bench.Summary(results) {
			fmt.Fprintln(env.stdout, line)
		}
	}
	return err
}
