// Package bench measures the engine on this machine: how fast relayers
// drain a queue with ordering on and off, the latency of a steady stream
// (enqueue to rail call, and to the outcome committed), how fast producers
// enqueue, and the ceiling: the engine's own hot statements run back to
// back through pgbench, without the engine, at their best client count, so
// each figure can be stated as a share of what this database can do here.
//
// Every result is one [Result]; with Config.JSON each is printed as one
// JSON object per line, otherwise as a line of text. Runs longer than a
// second print a progress line per second to Config.Progress.
package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/migrations"
)

// Workloads are the workloads Run knows, in the order it runs them.
var Workloads = []string{"drain", "latency", "enqueue", "ceiling", "notify", "soak"}

// DefaultWorkloads are what Run runs when asked for none (notify compares
// the NOTIFY trigger on and off, and soak runs for minutes: both are run on
// request).
var DefaultWorkloads = []string{"drain", "latency", "enqueue", "ceiling"}

// Config describes one benchmark run.
type Config struct {
	Pool *pgxpool.Pool
	// Out receives the results; Progress the progress lines (nil: none).
	Out, Progress io.Writer
	// JSON prints results as JSON lines instead of text.
	JSON bool

	Instructions int // drain and ceiling: instructions queued up front
	Participants int // instructions spread over this many participants
	Relayers     int // relayers in this process
	// Ordered lists the ordering modes drain and ceiling run (default
	// both, ordered first).
	Ordered []bool

	Rate int // latency and soak: instructions per second
	// Duration is how long latency, enqueue and notify run (default 20 s)
	// and soak runs (default DefaultSoakDuration).
	Duration time.Duration
	// Report is the soak's interval between samples (default
	// DefaultSoakReport).
	Report    time.Duration
	Producers int // enqueue and notify: concurrent producers
	Pairs     int // notify: trigger on/off pairs
	// Rounds runs the workloads this many times, one after the other
	// (default 1). This machine's speed drifts within minutes, so a ratio
	// is only worth what the runs it compares were: with several rounds
	// every result says its round, the drains alternate which ordering
	// mode runs first (the second of two back-to-back runs tends to be the
	// faster), and Summary gives each ratio per round and their median.
	Rounds int

	RailLatency    time.Duration // the sandbox rail's latency per call
	MaxConcurrency int           // each relayer's (0: the engine's default)
	BatchSize      int           // each relayer's claim batch (0: the default)
	// FlushSize is each relayer's largest outcome write (0: the engine's
	// default), and the ceiling's batch: a relayer draining a backlog
	// writes that many outcomes at once and claims as many in the same
	// transaction.
	FlushSize int

	// Roles runs the relayers as outbox_relayer and the producers as
	// outbox_producer, over the roles script (migrations.CreateRoles) run
	// on each fresh schema, as a deployment with --create-roles does: the
	// row-level security policies and the grants then cost what they cost
	// there. Pool must be a superuser's, and those roles must be able to
	// log in without a password from here (the embedded local cluster's
	// trust). Without it every connection is Pool's, which the policies do
	// not restrict. The ceiling's pgbench runs as Pool's user either way.
	Roles bool

	// Clients are the pgbench client counts the ceiling tries (default 1,
	// 2, 4, 8 for the claim and outcome, 4, 8, 16, 32 for the enqueue).
	Clients []int
	// PgBench is the pgbench binary (default: next to the server's, or on
	// $PATH).
	PgBench string

	durationSet bool // Duration was given (soak's default differs)
}

// Result is one line of a benchmark's report. The first five fields are
// on every line; the latency fields on latency lines only.
type Result struct {
	Workload     string  `json:"workload"` // drain, latency, enqueue, ceiling, notify
	Ordered      bool    `json:"ordered"`
	Participants int     `json:"participants"`
	Instructions int     `json:"instructions"`
	MsgsPerSec   float64 `json:"msgs_per_sec"`

	// Latency: the rate asked for and achieved, and percentiles (ms) from
	// the producer's call to enqueue to the rail being called (what River
	// reports as enqueue to job start) and to the outcome committed.
	Rate         *float64 `json:"rate,omitempty"`
	AchievedRate *float64 `json:"achieved_rate,omitempty"`
	CallP50      *float64 `json:"call_p50_ms,omitempty"`
	CallP99      *float64 `json:"call_p99_ms,omitempty"`
	CallP999     *float64 `json:"call_p999_ms,omitempty"`
	P50          *float64 `json:"p50_ms,omitempty"`
	P99          *float64 `json:"p99_ms,omitempty"`
	P999         *float64 `json:"p999_ms,omitempty"`
	// EnqueueP50 and EnqueueP99 are the producer's own share: from the
	// call to Enqueue to its commit returning (two of the commits on the
	// way to the rail call are the producer's and the claim's). On the
	// ceiling's "enqueue at rate" and "commit at rate" lines, the same for
	// pgbench's transactions at the latency workload's rate.
	EnqueueP50 *float64 `json:"enqueue_p50_ms,omitempty"`
	EnqueueP99 *float64 `json:"enqueue_p99_ms,omitempty"`
	// The rest of the way to the rail, in two parts: from the producer's
	// commit returning to the start of the transaction that claimed the
	// instruction (waiting for a relayer's next claim; negative when the
	// claim began before the commit's reply arrived), and from that start
	// to the rail call (the claim's statements, its durable commit and the
	// hand to the rail; for a hand-off, the whole outcome write that
	// claimed it). Timed by the archive's claimed_at, so on one machine.
	ClaimWaitP50   *float64 `json:"claim_wait_p50_ms,omitempty"`
	ClaimWaitP99   *float64 `json:"claim_wait_p99_ms,omitempty"`
	ClaimToCallP50 *float64 `json:"claim_to_call_p50_ms,omitempty"`
	ClaimToCallP99 *float64 `json:"claim_to_call_p99_ms,omitempty"`

	// Drain: the relayers' outcome transactions, the outcomes each
	// recorded on average, and the mean one's time (from sending its
	// statements, hand-off included, to its commit returning). With
	// ordering on, the write that records a participant's outcome claims
	// its next instruction, so a participant moves at most one
	// instruction per write: ParticipantBound (participants × 1000 /
	// WriteMS) bounds an ordered drain at its mean write, which is what
	// limits a drain over few busy participants.
	OutcomeWrites    int64    `json:"outcome_writes,omitempty"`
	OutcomesPerWrite *float64 `json:"outcomes_per_write,omitempty"`
	WriteMS          *float64 `json:"write_ms,omitempty"`
	ParticipantBound *float64 `json:"participant_bound_msgs_per_sec,omitempty"`

	// ProcessCPUPerMsg is this process's processor time (user and
	// system) per instruction over a drain, in microseconds: the relayers,
	// the sandbox rail and the bench's own counting. On a machine whose
	// cores the database shares, every microsecond here is one the
	// database's statements do not get; it drifts less than msgs_per_sec.
	ProcessCPUPerMsg *float64 `json:"process_cpu_us_per_msg,omitempty"`

	// RSSMiB is the largest resident set of this process during the run.
	RSSMiB float64 `json:"rss_mib"`
	// Procs is how many processors this process's Go runtime ran Go code
	// on at once (GOMAXPROCS: the machine's cores unless the environment
	// or a container's limit says fewer). On a machine whose two cores
	// the database shares, the relayers used half the processor a message
	// at 1 (docs/performance.md, "One processor beside the database"), so
	// a line says which it ran with.
	Procs int `json:"procs"`
	// Roles says the relayers and producers ran as outbox_relayer and
	// outbox_producer (Config.Roles).
	Roles bool `json:"roles,omitempty"`
	// Seconds is how long the measured part took.
	Seconds float64 `json:"seconds"`

	// Ceiling: which statements ran and at how many pgbench clients (the
	// best of those tried).
	Statements string `json:"statements,omitempty"`
	Clients    int    `json:"clients,omitempty"`
	// ClientDispatched is, on a claim+outcome line, how many instructions
	// each pgbench client dispatched (in client order): whether the
	// clients wrote side by side or one of them did the work.
	ClientDispatched []int64 `json:"client_dispatched,omitempty"`
	// Notify: whether the NOTIFY trigger was on, and how many wakeups it
	// caused.
	Trigger  *bool `json:"trigger,omitempty"`
	Notified int64 `json:"notified,omitempty"`
	// Soak is the soak workload's sample (on its last line, the last one).
	Soak *SoakSample `json:"soak,omitempty"`
	// Note says what a reader must know to read the line right.
	Note string `json:"note,omitempty"`
	// Round is the round of a run of several (Config.Rounds), from 1;
	// zero when there is one.
	Round int `json:"round,omitempty"`
}

// Run runs the workloads (DefaultWorkloads if none) and returns every
// result, printing each as it comes.
func Run(ctx context.Context, cfg Config, workloads []string) ([]Result, error) {
	cfg.defaults()
	if len(workloads) == 0 {
		workloads = DefaultWorkloads
	}
	for _, w := range workloads {
		if !slices.Contains(Workloads, w) {
			return nil, fmt.Errorf("bench: unknown workload %q (want one of %v)", w, Workloads)
		}
	}
	r := &runner{cfg: cfg, runID: rand.Uint32()}
	closeRoles, err := r.connectRoles(ctx)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	defer closeRoles()
	var all []Result
	for round := 1; round <= cfg.Rounds; round++ {
		if cfg.Rounds > 1 {
			r.round = round
		}
		for _, w := range workloads {
			var (
				rs  []Result
				err error
			)
			switch w {
			case "drain":
				rs, err = r.drain(ctx)
			case "latency":
				rs, err = r.latency(ctx)
			case "enqueue":
				rs, err = r.enqueue(ctx)
			case "ceiling":
				rs, err = r.ceiling(ctx)
			case "notify":
				rs, err = r.notify(ctx)
			case "soak":
				rs, err = r.soak(ctx)
			}
			for i := range rs {
				rs[i].Round, rs[i].Roles = r.round, cfg.Roles
			}
			all = append(all, rs...)
			if err != nil {
				return all, fmt.Errorf("bench %s: %w", w, err)
			}
		}
	}
	return all, nil
}

func (c *Config) defaults() {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&c.Instructions, 100_000)
	def(&c.Participants, 1000)
	def(&c.Relayers, 2)
	def(&c.Rate, 1000)
	def(&c.Producers, 16)
	def(&c.Pairs, 3)
	def(&c.Rounds, 1)
	if c.durationSet = c.Duration > 0; !c.durationSet {
		c.Duration = 20 * time.Second
	}
	if len(c.Ordered) == 0 {
		c.Ordered = []bool{true, false}
	}
	if c.Out == nil {
		c.Out = io.Discard
	}
}

// runner runs the workloads of one Config.
type runner struct {
	cfg   Config
	runID uint32 // tells this run's instruction ids from other runs'
	round int    // the round under way (Result.Round)
	// relayerDB and producerDB are what the relayers (and the soak's
	// reaper) and the producers connect with: Pool, or with Config.Roles
	// pools of their roles.
	relayerDB, producerDB *pgxpool.Pool
}

// connectRoles sets the runner's relayers' and producers' pools: Pool's,
// or with Config.Roles pools that log in as outbox_relayer and
// outbox_producer. The returned func closes those.
func (r *runner) connectRoles(ctx context.Context) (func(), error) {
	r.relayerDB, r.producerDB = r.cfg.Pool, r.cfg.Pool
	if !r.cfg.Roles {
		return func() {}, nil
	}
	as := func(role string) (*pgxpool.Pool, error) {
		cfg := r.cfg.Pool.Config().Copy()
		cfg.ConnConfig.User, cfg.ConnConfig.Password = role, ""
		return pgxpool.NewWithConfig(ctx, cfg)
	}
	var err error
	if r.relayerDB, err = as(migrations.RoleRelayer); err != nil {
		return nil, fmt.Errorf("connect as %s: %w", migrations.RoleRelayer, err)
	}
	if r.producerDB, err = as(migrations.RoleProducer); err != nil {
		r.relayerDB.Close()
		return nil, fmt.Errorf("connect as %s: %w", migrations.RoleProducer, err)
	}
	return func() { r.relayerDB.Close(); r.producerDB.Close() }, nil
}

// emit prints one result.
func (r *runner) emit(res Result) {
	res.Round = r.round
	res.Procs = runtime.GOMAXPROCS(0)
	res.Roles = r.cfg.Roles
	if r.cfg.JSON {
		b, _ := json.Marshal(res)
		fmt.Fprintf(r.cfg.Out, "%s\n", b)
		return
	}
	fmt.Fprintln(r.cfg.Out, res.text())
}

// text is a result as a line of text.
func (res Result) text() string {
	s := fmt.Sprintf("%-8s ordered=%-5v participants=%-6d instructions=%-7d %9.0f msgs/s  rss %5.1f MiB  %6.2fs",
		res.Workload, res.Ordered, res.Participants, res.Instructions, res.MsgsPerSec, res.RSSMiB, res.Seconds)
	if res.CallP50 != nil {
		s += fmt.Sprintf("\n         rate %.0f/s achieved %.0f/s; enqueue→rail call p50 %.2f ms p99 %.2f ms p99.9 %.2f ms; enqueue→outcome committed p50 %.2f ms p99 %.2f ms p99.9 %.2f ms; enqueue→its commit p50 %.2f ms p99 %.2f ms",
			*res.Rate, *res.AchievedRate, *res.CallP50, *res.CallP99, *res.CallP999, *res.P50, *res.P99, *res.P999, *res.EnqueueP50, *res.EnqueueP99)
		if res.ClaimWaitP50 != nil {
			s += fmt.Sprintf("; its commit→claim start p50 %.2f ms p99 %.2f ms; claim start→rail call p50 %.2f ms p99 %.2f ms",
				*res.ClaimWaitP50, *res.ClaimWaitP99, *res.ClaimToCallP50, *res.ClaimToCallP99)
		}
	}
	if res.ProcessCPUPerMsg != nil {
		s += fmt.Sprintf("  [this process: %.1f µs of processor per instruction]", *res.ProcessCPUPerMsg)
	}
	if res.WriteMS != nil {
		s += fmt.Sprintf("  [%d outcome writes, %.1f outcomes each, mean %.2f ms", res.OutcomeWrites, *res.OutcomesPerWrite, *res.WriteMS)
		if res.ParticipantBound != nil {
			s += fmt.Sprintf("; one instruction per participant per write: at most %.0f msgs/s", *res.ParticipantBound)
		}
		s += "]"
	}
	if res.Statements != "" {
		s += fmt.Sprintf("  [%s, %d pgbench clients]", res.Statements, res.Clients)
	}
	if res.CallP50 == nil && res.EnqueueP50 != nil {
		s += fmt.Sprintf("\n         rate %.0f/s achieved %.0f/s; transaction→its commit p50 %.2f ms p99 %.2f ms",
			*res.Rate, *res.AchievedRate, *res.EnqueueP50, *res.EnqueueP99)
	}
	if res.Soak != nil {
		s += "\n         " + res.Soak.String()
	}
	if res.Trigger != nil {
		s += fmt.Sprintf("  [trigger %v, %d NOTIFY wakeups]", *res.Trigger, res.Notified)
	}
	if res.Note != "" {
		s += "  (" + res.Note + ")"
	}
	if res.Roles {
		s += "  [as outbox_relayer and outbox_producer]"
	}
	if res.Round > 0 {
		s += fmt.Sprintf("  [round %d]", res.Round)
	}
	return s
}

// freshSchema migrates a new schema for one run, with ordering on or off,
// and returns a cleanup that drops it.
func (r *runner) freshSchema(ctx context.Context, ordered bool) (string, func(), error) {
	schema := fmt.Sprintf("bench_%x", rand.Uint32())
	if err := migrations.MigrateWith(ctx, r.cfg.Pool, migrations.Options{Schema: schema}); err != nil {
		return "", nil, err
	}
	drop := func() { _, _ = r.cfg.Pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") }
	if err := migrations.SetOrdered(ctx, r.cfg.Pool, schema, ordered); err != nil {
		drop()
		return "", nil, err
	}
	if r.cfg.Roles {
		if err := migrations.CreateRoles(ctx, r.cfg.Pool, schema); err != nil {
			drop()
			return "", nil, err
		}
	}
	return schema, drop, nil
}

// verify runs the invariant checks (audit verify) over a schema a run
// left behind: a figure is only reported for a run that kept every
// invariant.
func (r *runner) verify(ctx context.Context, schema string, ordered bool) error {
	st, err := store.New(schema)
	if err != nil {
		return err
	}
	rep, err := st.Verify(ctx, r.cfg.Pool, store.VerifyOptions{Ordered: ordered})
	if err != nil {
		return err
	}
	if len(rep.Violations) > 0 {
		return fmt.Errorf("invariants violated after the run: %v", rep.Violations)
	}
	return nil
}

// queued is a fresh schema with Config.Instructions queued, settled.
func (r *runner) queued(ctx context.Context, ordered bool) (string, func(), error) {
	schema, drop, err := r.freshSchema(ctx, ordered)
	if err != nil {
		return "", nil, err
	}
	if err := r.fill(ctx, schema, r.cfg.Instructions); err != nil {
		drop()
		return "", nil, err
	}
	r.settle(ctx)
	return schema, drop, nil
}

// settle starts a run from clean buffers: a CHECKPOINT, so no run pays for
// the writes of the one before (a 100,000-instruction drain leaves enough
// dirty buffers behind to halve the next run's commit rate on a small
// machine). It needs superuser or pg_checkpoint; without it runs are
// noisier, not wrong.
func (r *runner) settle(ctx context.Context) {
	_, _ = r.cfg.Pool.Exec(ctx, "CHECKPOINT")
}
