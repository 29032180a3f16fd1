package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/engine"
	"github.com/ledgerline/outbox/internal/pglocal"
	"github.com/ledgerline/outbox/internal/store"
)

// ceiling runs the engine's own hot statements through pgbench, without
// the engine: what this database can do on this machine with these
// statements, to state the engine's figures as a share of it.
//
//   - claim+outcome, per ordering mode: a queue of Instructions as the drain
//     has, and each pgbench transaction is a draining relayer's write: it
//     records as DISPATCHED what the client's last transaction claimed
//     (the participant lock and outcome statements) and claims FlushSize
//     more, the size of a draining relayer's writes (the hand-off: the
//     freed participants' next instructions, then a refill from the due
//     queue), its result folded into the next outcome statement's
//     arguments, all in one pipeline as the relayer sends it
//     (dispatchScript). The client's first transaction records nothing and
//     claims a full batch; with ordering on and fewer participants than
//     the clients' batches, an equal share of them, and later writes do
//     not refill (clientBatch).
//   - enqueue: the producer's three statements, pipelined in one implicit
//     transaction per instruction, as Producer.Enqueue on a pool sends
//     them, with a fresh key each.
//
// Each runs at every client count of Config.Clients; the best is reported.
//
// Then the latency floor, at the latency workload's rate and producer
// count (see ceilingAtRate): the enqueue statements alone, and a bare
// durable commit (one row into a table without indexes). No instruction
// reaches a rail before its enqueue commits, so the first bounds what the
// latency workload's enqueue→rail call can be on this machine in this
// run; the second is what any durable write at that rate waits.
func (r *runner) ceiling(ctx context.Context) ([]Result, error) {
	bin, err := r.pgbench()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "outbox-ceiling-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)

	var out []Result
	batch := r.cfg.FlushSize
	if batch <= 0 {
		batch = engine.DefaultFlushSize
	}
	for _, ordered := range r.cfg.Ordered {
		best := Result{}
		for _, clients := range r.clients([]int{1, 2, 4, 8}) {
			res, err := r.ceilingDispatch(ctx, bin, dir, ordered, clients, batch)
			if err != nil {
				return out, err
			}
			r.progressf("ceiling claim+outcome ordered=%v: %d clients, %.0f msgs/s", ordered, clients, res.MsgsPerSec)
			if res.MsgsPerSec > best.MsgsPerSec {
				best = res
			}
		}
		r.emit(best)
		out = append(out, best)
	}
	best := Result{}
	for _, clients := range r.clients([]int{4, 8, 16, 32}) {
		res, err := r.ceilingEnqueue(ctx, bin, dir, clients)
		if err != nil {
			return out, err
		}
		r.progressf("ceiling enqueue: %d clients, %.0f msgs/s", clients, res.MsgsPerSec)
		if res.MsgsPerSec > best.MsgsPerSec {
			best = res
		}
	}
	r.emit(best)
	out = append(out, best)
	for _, statements := range []string{statementsEnqueue, statementsCommit} {
		res, err := r.ceilingAtRate(ctx, bin, dir, statements)
		if err != nil {
			return out, err
		}
		r.emit(res)
		out = append(out, res)
	}
	return out, nil
}

// The statements of the ceiling's latency floors (Result.Statements).
const (
	statementsEnqueue = "enqueue at rate"
	statementsCommit  = "commit at rate"
)

func (r *runner) clients(def []int) []int {
	if len(r.cfg.Clients) > 0 {
		return r.cfg.Clients
	}
	return def
}

func (r *runner) progressf(format string, args ...any) {
	if r.cfg.Progress != nil {
		fmt.Fprintf(r.cfg.Progress, format+"\n", args...)
	}
}

// pgbench finds the pgbench binary: Config.PgBench, the one next to the
// server's binaries, or pgbench on $PATH.
func (r *runner) pgbench() (string, error) {
	if r.cfg.PgBench != "" {
		return r.cfg.PgBench, nil
	}
	if dir, err := pglocal.FindBinDir(); err == nil {
		if p := filepath.Join(dir, "pgbench"); fileExists(p) {
			return p, nil
		}
	}
	p, err := exec.LookPath("pgbench")
	if err != nil {
		return "", errors.New("no pgbench: it comes with the PostgreSQL server package (apt-get install -y postgresql)")
	}
	return p, nil
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// ceilingDispatch measures the claim and outcome statements at one client
// count on a fresh queue.
func (r *runner) ceilingDispatch(ctx context.Context, bin, dir string, ordered bool, clients, batch int) (Result, error) {
	schema, drop, err := r.queued(ctx, ordered)
	if err != nil {
		return Result{}, err
	}
	defer drop()
	n := r.cfg.Instructions
	st, err := store.New(schema)
	if err != nil {
		return Result{}, err
	}
	batch, held := clientBatch(ordered, clients, batch, r.cfg.Participants)
	script, err := dispatchScript(st.HotPath(), !held)
	if err != nil {
		return Result{}, err
	}
	// Claims stop short of the queue's end, so every transaction claims a
	// full batch or close to it (an empty queue would make them free);
	// one more per client for its first, which records nothing.
	perClient := max(1, int(0.9*float64(n))/claimedPerRound(ordered, clients, batch, r.cfg.Participants)) + 1
	vars := []string{"relayer=pgbench", "batch=" + strconv.Itoa(batch), "rails={sandbox}", "leases={600000}", "first=1"}
	run, err := r.runPgBench(ctx, bin, dir, script, clients, []string{"-t", strconv.Itoa(perClient)}, vars...)
	if err != nil {
		return Result{}, err
	}
	// A figure counts only from statements that kept every invariant, as
	// a drain's does (what each client claimed last is in flight).
	if err := r.verify(ctx, schema, ordered); err != nil {
		return Result{}, fmt.Errorf("ceiling: %w", err)
	}
	// Each client claims as relayer pgbench-<client>, so the outcome rows
	// say who dispatched what.
	rows, err := r.cfg.Pool.Query(ctx, "SELECT count(*) FROM "+schema+
		".attempts WHERE state = 'DISPATCHED' GROUP BY relayer_id ORDER BY length(relayer_id), relayer_id")
	if err != nil {
		return Result{}, err
	}
	byClient, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return Result{}, err
	}
	var dispatched int64
	for _, n := range byClient {
		dispatched += n
	}
	secs := run.seconds()
	return Result{Workload: "ceiling", Ordered: ordered, Participants: r.cfg.Participants, Instructions: int(dispatched),
		MsgsPerSec: float64(dispatched) / secs, Seconds: secs, Statements: "claim+outcome", Clients: clients,
		ClientDispatched: byClient}, nil
}

// dispatchScript is the ceiling's transaction: a draining relayer's write,
// one pipeline as the relayer sends it (its plan settings, the participant
// lock, the outcome statement, the hand-off), recording what the client's
// last write claimed and claiming the next batch. pgbench cannot read a
// result inside a pipeline (\gset), so the hand-off leaves its claims in
// the session's settings and the next write reads them there
// (store.CarriedArgument). Sent one by one instead, and planned afresh
// at each call (without the plan settings), the same statements ran
// 4,790–5,063 msgs/s over 10 participants against 7,891–8,896 so (three
// alternating pairs); over 1,000 participants the two were level.
//
// With refill false (the clients hold every participant: see clientBatch)
// only a client's first write refills, to claim its first batch; the
// others send the hand-off without the refill, as a relayer does while
// its claims come back short.
func dispatchScript(h store.HotPath, refill bool) (string, error) {
	var st statements
	outcomes := make(map[int]string, 13)
	for i := 1; i <= 13; i++ {
		outcomes[i] = store.CarriedArgument("a" + strconv.Itoa(i))
	}
	participants := store.CarriedArgument("p")
	write := func(handoff string) string {
		return "\\startpipeline\n" +
			h.PlanSettings + ";\n" +
			st.sql(h.LockParticipants, map[int]string{1: participants}) + ";\n" +
			st.sql(h.RecordDispatched, outcomes) + ";\n" +
			st.sql(handoff, map[int]string{1: "(:relayer::text || '-' || :client_id::text)", 2: ":batch", 3: ":rails", 4: ":leases",
				5: participants, 6: store.CarriedArgument("a3"), 7: "true"}) + ";\n" +
			"\\endpipeline\n"
	}
	if refill {
		script := write(h.HandoffAsOutcomes)
		return script, st.err
	}
	script := "\\if :first\n" + write(h.HandoffAsOutcomes) + "\\set first 0\n\\else\n" +
		write(h.HandoffSuccessorsAsOutcomes) + "\\endif\n"
	return script, st.err
}

// clientBatch is the batch each ceiling client claims and records, and
// whether the clients hold every participant between them (ordering on,
// fewer participants than a batch per client). Then each client takes an
// equal share of them, so that the clients write side by side, as many
// pipelines as clients; with full batches the first client's first claim
// took every participant's head, and over 10 participants two clients
// were one pipeline and an idle client (8,635–9,047 msgs/s for one
// client, 10,544–11,430 for two with five participants each, three
// alternating pairs).
func clientBatch(ordered bool, clients, batch, participants int) (int, bool) {
	if !ordered || participants <= 0 || participants >= clients*batch {
		return batch, false
	}
	return max(1, (participants+clients-1)/clients), true
}

// claimedPerRound is how many instructions the ceiling's clients claim
// between them when each has run one transaction: a batch each, but with
// ordering on no more than one per participant, since a participant's next
// instruction waits until the outcome of the one in flight. Sized by
// batches alone, a run over 10 participants left its queue almost
// untouched: 870 of 50,000 instructions, in 0.18 s.
func claimedPerRound(ordered bool, clients, batch, participants int) int {
	n := clients * batch
	if ordered && participants > 0 {
		n = min(n, participants)
	}
	return max(n, 1)
}

// ceilingEnqueue measures the enqueue statements at one client count.
func (r *runner) ceilingEnqueue(ctx context.Context, bin, dir string, clients int) (Result, error) {
	schema, st, drop, err := r.enqueueSchema(ctx)
	if err != nil {
		return Result{}, err
	}
	defer drop()
	secs := r.pgbenchSeconds(clients)
	script, err := r.enqueueScript(st)
	if err != nil {
		return Result{}, err
	}
	run, err := r.runPgBench(ctx, bin, dir, script, clients, []string{"-T", strconv.Itoa(secs)})
	if err != nil {
		return Result{}, err
	}
	var committed int64
	if err := r.cfg.Pool.QueryRow(ctx, "SELECT count(*) FROM "+schema+".pending").Scan(&committed); err != nil {
		return Result{}, err
	}
	return Result{Workload: "ceiling", Ordered: true, Participants: r.cfg.Participants, Instructions: int(committed),
		MsgsPerSec: run.tps, Seconds: run.seconds(), Statements: "enqueue", Clients: clients}, nil
}

// enqueueSchema is a fresh, empty schema with ordering on, for pgbench's
// enqueues, after the database settled; drop removes it.
func (r *runner) enqueueSchema(ctx context.Context) (schema string, st *store.Store, drop func(), err error) {
	schema, drop, err = r.freshSchema(ctx, true)
	if err != nil {
		return "", nil, nil, err
	}
	r.settle(ctx)
	if st, err = store.New(schema); err != nil {
		drop()
		return "", nil, nil, err
	}
	return schema, st, drop, nil
}

// enqueueScript is a pgbench transaction of the producer's three
// statements for one instruction, its ids made from a random number (the
// outbox id is their md5, so all three statements agree on it).
func (r *runner) enqueueScript(st *store.Store) (string, error) {
	h := st.HotPath()
	var s statements
	id := `('ceiling-' || :client_id || '-' || :n)`
	uuid := `(md5` + id + `::uuid)`
	payload := `'{"amount_minor":1000,"currency":"USD","destination":"acct-1"}'`
	part := `('p' || :p)`
	script := fmt.Sprintf("\\set n random(1, 1000000000000)\n\\set p random(0, %d)\n", r.cfg.Participants-1) +
		"\\startpipeline\n" +
		s.sql(h.InsertKey, map[int]string{1: `''`, 2: id, 3: id, 4: uuid, 5: part, 6: `'\x00'::bytea`}) + ";\n" +
		s.sql(h.InsertPending, map[int]string{1: uuid, 2: `'sandbox'`, 3: `''`, 4: payload}) + ";\n" +
		s.sql(h.LookupKey, map[int]string{1: `''`, 2: id, 3: id, 4: uuid}) + ";\n" +
		"\\endpipeline\n"
	return script, s.err
}

// ceilingAtRate runs statements (statementsEnqueue or statementsCommit)
// through pgbench at the latency workload's rate (Config.Rate) for half of
// Config.Duration (or longer, see secs), with as many clients as that workload has producers,
// on a fresh schema, and reports each transaction's own time as the
// latency workload reports its enqueue (EnqueueP50, EnqueueP99: from the
// start of the transaction to its commit returning). pgbench's schedule
// lag, the wait for a free client, is left out as the latency workload
// leaves out a producer's wait for its turn; the line's note gives its
// p99, which grows large when the statements cannot keep up with the
// rate (their p50 then understates what an open stream would see).
func (r *runner) ceilingAtRate(ctx context.Context, bin, dir, statements string) (Result, error) {
	schema, st, drop, err := r.enqueueSchema(ctx)
	if err != nil {
		return Result{}, err
	}
	defer drop()
	var script string
	switch statements {
	case statementsCommit:
		if _, err := r.cfg.Pool.Exec(ctx, "CREATE TABLE "+schema+".ceiling_commits (n bigint)"); err != nil {
			return Result{}, err
		}
		script = "INSERT INTO " + schema + ".ceiling_commits VALUES (:client_id);\n"
	default:
		if script, err = r.enqueueScript(st); err != nil {
			return Result{}, err
		}
	}
	clients := max(r.cfg.Producers, latencyProducers)
	secs := r.pgbenchSeconds(clients)
	prefix := filepath.Join(dir, fmt.Sprintf("txlog-%x", rand.Uint32()))
	run, err := r.runPgBench(ctx, bin, dir, script, clients,
		[]string{"-T", strconv.Itoa(secs), "-R", strconv.Itoa(r.cfg.Rate), "-l", "--log-prefix", prefix})
	if err != nil {
		return Result{}, err
	}
	own, lag, err := readTxLogs(prefix)
	if err != nil {
		return Result{}, err
	}
	achieved := float64(run.transactions) / float64(secs)
	return Result{Workload: "ceiling", Ordered: true, Participants: r.cfg.Participants, Instructions: int(run.transactions),
		MsgsPerSec: run.tps, Rate: ptr(float64(r.cfg.Rate)), AchievedRate: ptr(achieved),
		EnqueueP50: ms(own, 50), EnqueueP99: ms(own, 99), Seconds: float64(secs), Statements: statements, Clients: clients,
		Note: fmt.Sprintf("pgbench schedule lag (the wait for a free client) p99 %.2f ms", *ms(lag, 99))}, nil
}

// pgbenchSeconds is how long a pgbench run of the enqueue statements
// lasts: half of Config.Duration, and at least long enough for each of
// clients to run, at the rate, four times the transactions readTxLogs
// leaves out. A test's short run (32 clients at 200/s for a second) on a
// busy machine gave no client a transaction past its warm-up, or none at
// all while its connections were still being made, and so had no figure.
func (r *runner) pgbenchSeconds(clients int) int {
	return max(1, int(r.cfg.Duration.Seconds()/2), int(math.Ceil(float64(4*warmTransactions*clients)/float64(max(r.cfg.Rate, 1)))))
}

// warmTransactions is how many transactions of each pgbench client
// readTxLogs leaves out, as the latency workload leaves out its warm-up:
// a fresh connection prepares its statements on first use, and PostgreSQL
// plans them afresh for their first five executions.
const warmTransactions = 5

// readTxLogs reads pgbench's per-transaction logs (-l, with -R) written
// under prefix: each line "client transaction latency script epoch µs lag",
// latency counted from the scheduled start, so a transaction's own time is
// latency - lag (µs). Each client's first warmTransactions are left out.
func readTxLogs(prefix string) (own, lag *hdrhistogram.Histogram, err error) {
	files, err := filepath.Glob(prefix + ".*")
	if err != nil {
		return nil, nil, err
	}
	own, lag = newHistogram(), newHistogram()
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, nil, err
		}
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			if line == "" {
				// A client that ran no transaction (all its time went
				// to its connection, on a busy machine) logs nothing.
				continue
			}
			fields := strings.Fields(line)
			if len(fields) < 7 {
				return nil, nil, fmt.Errorf("pgbench log %s: %q is not a transaction with its schedule lag", f, line)
			}
			seq, err0 := strconv.Atoi(fields[1])
			total, err1 := strconv.ParseInt(fields[2], 10, 64)
			behind, err2 := strconv.ParseInt(fields[6], 10, 64)
			if err := errors.Join(err0, err1, err2); err != nil {
				return nil, nil, fmt.Errorf("pgbench log %s: %q: %w", f, line, err)
			}
			if seq < warmTransactions {
				continue
			}
			_ = own.RecordValue(max(1, total-behind))
			_ = lag.RecordValue(max(1, behind))
		}
	}
	if own.TotalCount() == 0 {
		return nil, nil, fmt.Errorf("pgbench logged no transaction after its clients' first %d under %s", warmTransactions, prefix)
	}
	return own, lag, nil
}

// pgbenchRun is what pgbench reported.
type pgbenchRun struct {
	transactions int64
	tps          float64 // without the initial connection time
}

// seconds is how long the transactions took.
func (p pgbenchRun) seconds() float64 { return float64(p.transactions) / p.tps }

var (
	pgbenchTransactions = regexp.MustCompile(`number of transactions actually processed: (\d+)`)
	pgbenchTPS          = regexp.MustCompile(`tps = ([0-9.]+) \(without initial connection time\)`)
)

// runPgBench runs script with clients clients (prepared statements, no
// vacuum of pgbench's own tables, no JIT) and reads its summary.
func (r *runner) runPgBench(ctx context.Context, bin, dir, script string, clients int, limit []string, vars ...string) (pgbenchRun, error) {
	path := filepath.Join(dir, fmt.Sprintf("script-%x.sql", rand.Uint32()))
	if err := os.WriteFile(path, []byte(script), 0o600); err != nil {
		return pgbenchRun{}, err
	}
	args := []string{"-n", "-M", "prepared", "-c", strconv.Itoa(clients), "-j", strconv.Itoa(min(clients, 4)), "-f", path}
	args = append(args, limit...)
	for _, v := range vars {
		args = append(args, "-D", v)
	}
	conn, connEnv := pgbenchConn(r.cfg.Pool.Config())
	args = append(args, conn)
	cmd := exec.CommandContext(ctx, bin, args...)
	// Without JIT, as the engine runs them (store's genericPlansSQL): a
	// generic plan costed over jit_above_cost is compiled at every
	// execution, which would make the ceiling PostgreSQL's LLVM's.
	cmd.Env = append(append(os.Environ(), "PGOPTIONS=-c jit=off"), connEnv...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	if err != nil {
		return pgbenchRun{}, fmt.Errorf("pgbench: %w: %s", err, lastLines(stderr.String(), 5))
	}
	m1, m2 := pgbenchTransactions.FindStringSubmatch(stdout.String()), pgbenchTPS.FindStringSubmatch(stdout.String())
	if m1 == nil || m2 == nil {
		return pgbenchRun{}, fmt.Errorf("pgbench: no summary in its output (ran %v): %s", time.Since(start), lastLines(stdout.String()+stderr.String(), 10))
	}
	var run pgbenchRun
	run.transactions, _ = strconv.ParseInt(m1[1], 10, 64)
	run.tps, _ = strconv.ParseFloat(m2[1], 64)
	if run.transactions == 0 || run.tps == 0 {
		return pgbenchRun{}, fmt.Errorf("pgbench ran no transaction: %s", lastLines(stdout.String()+stderr.String(), 10))
	}
	return run, nil
}

// pgbenchConn is the connection string pgbench is given, without its
// password, and the environment that carries the password instead
// (PGPASSWORD, which libpq reads when the string has none): a process's
// arguments are readable by every user of the machine (ps), its
// environment by its own user only. A string whose password is not
// found where a URL or a keyword=value string keeps it is given as it is.
func pgbenchConn(cfg *pgxpool.Config) (conn string, env []string) {
	conn = cfg.ConnString()
	password := cfg.ConnConfig.Password
	if password == "" {
		return conn, nil
	}
	if strings.HasPrefix(conn, "postgres://") || strings.HasPrefix(conn, "postgresql://") {
		if u, err := url.Parse(conn); err == nil {
			if u.User != nil {
				u.User = url.User(u.User.Username())
			}
			q := u.Query()
			q.Del("password")
			u.RawQuery = q.Encode()
			conn = u.String()
		}
	} else {
		conn = keywordPassword.ReplaceAllString(conn, "")
	}
	return conn, []string{"PGPASSWORD=" + password}
}

// keywordPassword is a password=... pair of a keyword=value connection
// string, its value plain or single-quoted (with \' and \\ escapes).
var keywordPassword = regexp.MustCompile(`(^|\s)password\s*=\s*('(?:\\.|[^'\\])*'|\S+)`)

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

var placeholder = regexp.MustCompile(`\$(\d+)`)

// pgbenchSQL is a statement with its parameters $1, $2 ... replaced as
// args says (pgbench variables, :name, or SQL expressions), on one line
// per statement as pgbench reads them. A parameter without an argument,
// or an argument the statement has no parameter for, is an error: a
// statement whose parameters changed would otherwise be measured with
// its arguments in the wrong places (the enqueue's once was, and only a
// jsonb cast that happened to fail in pgbench showed it).
func pgbenchSQL(sql string, args map[int]string) (string, error) {
	used := make(map[int]bool, len(args))
	var missing []int
	sql = placeholder.ReplaceAllStringFunc(sql, func(m string) string {
		n, _ := strconv.Atoi(m[1:])
		a, ok := args[n]
		if !ok {
			missing = append(missing, n)
			return m
		}
		used[n] = true
		return a
	})
	var unused []int
	for n := range args {
		if !used[n] {
			unused = append(unused, n)
		}
	}
	if len(missing) > 0 || len(unused) > 0 {
		slices.Sort(unused)
		return "", fmt.Errorf("bench: the statement's parameters and the script's arguments differ (no argument for %v, no parameter for %v) in the statement beginning %.60q",
			missing, unused, strings.TrimSpace(sql))
	}
	return strings.TrimSpace(sql), nil
}

// statements renders a script's statements with pgbenchSQL, keeping the
// first error, so that a script reads as the pipeline it sends.
type statements struct{ err error }

func (s *statements) sql(q string, args map[int]string) string {
	out, err := pgbenchSQL(q, args)
	if s.err == nil {
		s.err = err
	}
	return out
}
