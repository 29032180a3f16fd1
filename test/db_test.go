package test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/attempts"
	"github.com/ledgerline/outbox/internal/pglocal"
	"github.com/ledgerline/outbox/pending"
	"github.com/ledgerline/outbox/rails"
)

const (
	// participants the instructions of a drain are spread over.
	participants = 200
	// enqueueBatch is the size of one producer transaction.
	enqueueBatch = 1000
	// queryTimeout bounds each of the test's own queries.
	queryTimeout = 10 * time.Second
)

// openPool opens the test's own small pool on a database, closed when the
// test ends.
func openPool(t *testing.T, dbURL string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(withAppName(t, dbURL, "fault-test"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// startCluster starts a PostgreSQL of the test's own, on TCP, and stops it
// when the test ends; name says which in errors.
func startCluster(ctx context.Context, t *testing.T, name string) *pglocal.Cluster {
	t.Helper()
	c, err := pglocal.Start(ctx, pglocal.Options{Ephemeral: true, TCP: true})
	if err != nil {
		t.Fatalf("start the %s: %v", name, err)
	}
	t.Cleanup(func() { stopCluster(t, c, name) })
	return c
}

// stopCluster stops a cluster of the test's own at its end.
func stopCluster(t *testing.T, c *pglocal.Cluster, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Stop(ctx); err != nil {
		t.Errorf("stop the %s: %v", name, err)
	}
}

// queryInts runs a query returning one row of bigints, with a timeout.
func queryInts(pool *pgxpool.Pool, sql string, args ...any) ([]int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), queryTimeout)
	defer cancel()
	rows, err := pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	vals, err := pgx.CollectExactlyOneRow(rows, func(r pgx.CollectableRow) ([]int64, error) {
		v := make([]int64, len(r.FieldDescriptions()))
		ptrs := make([]any, len(v))
		for i := range v {
			ptrs[i] = &v[i]
		}
		return v, r.Scan(ptrs...)
	})
	return vals, err
}

// mustInts is queryInts that fails the test on error.
func mustInts(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) []int64 {
	t.Helper()
	v, err := queryInts(pool, sql, args...)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return v
}

// workload describes the instructions of one drain: n instructions of the
// sandbox rail in USD, spread (seeded) over the participants.
type workload struct {
	prefix string // instruction id prefix, unique per drain
	n      int
	seed   uint64
}

func (w workload) instructions(from, to int) []pending.Instruction {
	ins := make([]pending.Instruction, 0, to-from)
	for i := from; i < to; i++ {
		// A per-instruction generator keeps any range of the workload the
		// same whatever the batching.
		r := rand.New(rand.NewPCG(w.seed, uint64(i)))
		id := fmt.Sprintf("%s-%06d", w.prefix, i)
		ins = append(ins, pending.Instruction{
			InstructionID:  id,
			ParticipantID:  fmt.Sprintf("participant-%03d", r.IntN(participants)),
			IdempotencyKey: pending.DeterministicKey("fault-suite", id),
			RailType:       "sandbox",
			AmountMinor:    int64(100 + r.IntN(1_000_000)),
			Currency:       "USD",
			Destination:    fmt.Sprintf("acct-%d", i),
		})
	}
	return ins
}

var producer = func() *pending.Producer {
	p, err := pending.NewProducer(pending.Config{})
	if err != nil {
		panic(err)
	}
	return p
}()

// enqueue enqueues instructions [from, to) of the workload in transactions
// of enqueueBatch, through the Go producer API. A transaction that fails
// for a reason other than the instructions themselves (the server crashed
// or cut the connection, possibly after committing) is retried with the
// same instructions: the idempotency keys make the retry safe, and it
// returns the original receipts for what had committed.
func (w workload) enqueue(ctx context.Context, pool *pgxpool.Pool, from, to int) error {
	for lo := from; lo < to; lo += enqueueBatch {
		hi := min(lo+enqueueBatch, to)
		batch := w.instructions(lo, hi)
		for {
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				receipts, err := producer.EnqueueBatch(ctx, tx, batch)
				if err == nil && len(receipts) != len(batch) {
					err = fmt.Errorf("%d receipts for %d instructions", len(receipts), len(batch))
				}
				return err
			})
			if err == nil {
				break
			}
			var be *pending.BatchError
			if errors.As(err, &be) || ctx.Err() != nil {
				return fmt.Errorf("enqueue %s [%d, %d): %w", w.prefix, lo, hi, err)
			}
			select { // a transient failure: retry the same batch
			case <-ctx.Done():
				return fmt.Errorf("enqueue %s [%d, %d): %w (then %v)", w.prefix, lo, hi, err, ctx.Err())
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	return nil
}

// enqueueInBackground enqueues [from, n) while the test goes on; the
// returned function waits for it (bounded) and fails the test on error.
func (w workload) enqueueInBackground(t *testing.T, pool *pgxpool.Pool, from int) (wait func()) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	errc := make(chan error, 1)
	go func() { errc <- w.enqueue(ctx, pool, from, w.n) }()
	waited := false
	t.Cleanup(func() { // a test that stopped early: end the enqueue quietly
		if !waited {
			cancel()
			<-errc
		}
	})
	return func() {
		t.Helper()
		if waited {
			return
		}
		waited = true
		defer cancel()
		if err := <-errc; err != nil {
			t.Fatalf("background enqueue: %v", err)
		}
	}
}

// queueCounts is where the instructions are right now.
type queueCounts struct {
	keys, pending, inflight, due int64
}

func (c queueCounts) String() string {
	return fmt.Sprintf("enqueued=%d pending=%d (due now %d) inflight=%d", c.keys, c.pending, c.due, c.inflight)
}

// finished is how many enqueued instructions reached a terminal state.
func (c queueCounts) finished() int64 { return c.keys - c.pending - c.inflight }

func counts(pool *pgxpool.Pool) (queueCounts, error) {
	v, err := queryInts(pool, `SELECT
		(SELECT count(*) FROM outbox.idempotency_keys),
		(SELECT count(*) FROM outbox.pending),
		(SELECT count(*) FROM outbox.inflight),
		(SELECT count(*) FROM outbox.pending WHERE next_attempt_at <= now())`)
	if err != nil {
		return queueCounts{}, err
	}
	return queueCounts{keys: v[0], pending: v[1], inflight: v[2], due: v[3]}, nil
}

// waitProgress waits until at least n instructions finished, checking that
// no relayer crashed. Query errors (a restarting server) are retried.
func waitProgress(t *testing.T, pool *pgxpool.Pool, f *fleet, n int64, timeout time.Duration) {
	t.Helper()
	var last queueCounts
	var lastErr error
	poll(t, timeout, fmt.Sprintf("%d finished instructions", n), func() (bool, string) {
		if err := f.healthy(); err != nil {
			t.Fatal(err)
		}
		c, err := counts(pool)
		if err != nil {
			lastErr = err
			return false, fmt.Sprintf("%s; last query error: %v", last, lastErr)
		}
		last = c
		return c.finished() >= n, fmt.Sprintf("%s; last query error: %v", last, lastErr)
	})
}

// waitDrained waits until all want enqueued instructions reached a terminal
// state (nothing pending, nothing in flight, also nothing parked for a
// later retry) and fails with the counts if that takes longer than timeout.
func waitDrained(t *testing.T, pool *pgxpool.Pool, f *fleet, want int64, timeout time.Duration) {
	t.Helper()
	var last queueCounts
	var lastErr error
	poll(t, timeout, "the drain", func() (bool, string) {
		if err := f.healthy(); err != nil {
			t.Fatal(err)
		}
		c, err := counts(pool)
		if err != nil {
			lastErr = err
		} else {
			last = c
		}
		detail := fmt.Sprintf("want %d enqueued and finished; %s; last query error: %v", want, last, lastErr)
		return err == nil && c.keys == want && c.pending == 0 && c.inflight == 0, detail
	})
}

// endState is what a scenario's final checks found.
type endState struct {
	report  attempts.Report
	sandbox rails.SandboxStatsResponse
	// late counts outcome rows recorded after their lease was reaped;
	// zombies counts ZOMBIE_REQUEUE rows; timeouts counts RAIL_TIMEOUT
	// attempts.
	late, zombies, timeouts int64
}

var archive = func() *attempts.Archive {
	a, err := attempts.New("")
	if err != nil {
		panic(err)
	}
	return a
}()

// checkRailAttemptsArchived checks that every attempt that reached the rail
// (the X-Outbox-Attempt-Id of its requests) is a DISPATCHING row of the
// archive. A relayer calls the rail only once its claim, which writes that
// row, has committed; an attempt the rail saw and the archive lacks is a
// payment the auditors cannot see (a claim lost after the rail was called).
func checkRailAttemptsArchived(t *testing.T, pool *pgxpool.Pool, sb *sandboxServer) {
	t.Helper()
	called := sb.attemptIDs(t)
	if len(called) == 0 {
		t.Error("the sandbox recorded no attempt: nothing to compare with the archive")
		return
	}
	ids := make([]string, len(called))
	for i, id := range called {
		ids[i] = id.String()
	}
	v := mustInts(t, pool, `SELECT count(*) FROM unnest($1::uuid[]) AS c(id)
		WHERE NOT EXISTS (SELECT 1 FROM outbox.attempts a WHERE a.attempt_id = c.id AND a.state = 'DISPATCHING')`, ids)
	if v[0] > 0 {
		t.Errorf("%d of the %d attempts that reached the rail have no DISPATCHING row in the archive", v[0], len(called))
	}
}

// checkEnd runs the checks every scenario ends with, after the drain and
// the fleet's graceful stop: invariants 1-5 (Verify, ordered), nothing left
// pending or in flight, every enqueue accounted for, no overlapping claims,
// and the rail's view: no effective duplicate, and every instruction that
// ended dispatched paid exactly once.
func checkEnd(t *testing.T, pool *pgxpool.Pool, sb *sandboxServer, want int64) endState {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var s endState
	var err error
	if s.report, err = archive.Verify(ctx, pool, attempts.VerifyOptions{Ordered: true}); err != nil {
		t.Fatalf("verify: %v", err)
	}
	r := s.report
	for _, v := range r.Violations {
		t.Errorf("violation: %s", v)
	}
	if r.Instructions != want || r.Pending != 0 || r.InFlight != 0 {
		t.Errorf("want %d instructions, none pending or in flight; got %d instructions, %d pending, %d in flight",
			want, r.Instructions, r.Pending, r.InFlight)
	}
	if r.Dispatched+r.DeadLetters < want {
		t.Errorf("%d dispatched + %d dead letters < %d instructions", r.Dispatched, r.DeadLetters, want)
	}
	checkNoOverlappingClaims(t, pool)

	s.sandbox = sb.stats(t)
	if s.sandbox.EffectiveDuplicates != 0 {
		t.Errorf("the sandbox rail saw %d effective duplicate payments (stats %+v)", s.sandbox.EffectiveDuplicates, s.sandbox)
	}
	if s.sandbox.Payments != r.Dispatched {
		t.Errorf("the sandbox made %d payments, but %d instructions ended dispatched: each must be paid exactly once (stats %+v)",
			s.sandbox.Payments, r.Dispatched, s.sandbox)
	}
	checkRailAttemptsArchived(t, pool, sb)
	v := mustInts(t, pool, `SELECT
		count(*) FILTER (WHERE late),
		count(*) FILTER (WHERE state = 'ZOMBIE_REQUEUE'),
		count(*) FILTER (WHERE error_code = 'RAIL_TIMEOUT')
		FROM outbox.attempts`)
	s.late, s.zombies, s.timeouts = v[0], v[1], v[2]
	return s
}

// verifyNow checks invariants 1-5 on the live system (Verify reads one
// REPEATABLE READ snapshot, and every transition is atomic, so any instant
// must satisfy them, including right after a crash). Query errors are
// retried for a while: the server may just have restarted.
func verifyNow(t *testing.T, pool *pgxpool.Pool, when string) {
	t.Helper()
	var r attempts.Report
	poll(t, 30*time.Second, "a mid-drain verification "+when, func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var err error
		r, err = archive.Verify(ctx, pool, attempts.VerifyOptions{Ordered: true})
		return err == nil, fmt.Sprint(err)
	})
	for _, v := range r.Violations {
		t.Errorf("%s: violation: %s", when, v)
	}
}

// checkNoOverlappingClaims fails the test if an instruction was claimed
// while an earlier claim of it was still open: every DISPATCHING row that
// is followed by another claim must have been closed (outcome or
// ZOMBIE_REQUEUE, not a late row) before that next claim.
func checkNoOverlappingClaims(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rows, err := pool.Query(ctx, `
		WITH claims AS (
		  SELECT outbox_id, attempt_id, created_at,
		         lead(created_at) OVER (PARTITION BY outbox_id ORDER BY created_at, attempt_id) AS next_claim
		  FROM outbox.attempts WHERE state = 'DISPATCHING'
		)
		SELECT format('outbox %s: claim %s (%s) still open when claimed again at %s', outbox_id, attempt_id, created_at, next_claim)
		FROM claims c
		WHERE next_claim IS NOT NULL AND NOT EXISTS (
		  SELECT 1 FROM outbox.attempts x
		  WHERE x.outbox_id = c.outbox_id AND x.claim_attempt_id = c.attempt_id AND NOT x.late AND x.created_at <= c.next_claim)
		LIMIT 10`)
	if err != nil {
		t.Fatalf("overlapping claims query: %v", err)
	}
	overlaps, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatalf("overlapping claims query: %v", err)
	}
	for _, o := range overlaps {
		t.Errorf("double claim: %s", o)
	}
}

// zombieHeal is the archive's view of zombies: instructions the reaper
// requeued, and how long until each reached DISPATCHED or FAILED, counted
// from the abandoned claim (an upper bound of the time since the fault that
// stranded it).
type zombieHeal struct {
	healed, unhealed int64
	worst            time.Duration
}

func archiveZombieHeal(t *testing.T, pool *pgxpool.Pool) zombieHeal {
	t.Helper()
	v := mustInts(t, pool, `
		SELECT count(h.at), count(*) - count(h.at),
		       coalesce((extract(epoch FROM max(h.at - z.claimed_at)) * 1000)::bigint, 0)
		FROM outbox.attempts z
		LEFT JOIN LATERAL (
		  SELECT min(a.created_at) AS at FROM outbox.attempts a
		  WHERE a.outbox_id = z.outbox_id AND a.state IN ('DISPATCHED', 'FAILED') AND a.created_at > z.created_at) h ON true
		WHERE z.state = 'ZOMBIE_REQUEUE'`)
	return zombieHeal{healed: v[0], unhealed: v[1], worst: time.Duration(v[2]) * time.Millisecond}
}

// dbNow is the database clock (archive timestamps are on it).
func dbNow(t *testing.T, pool *pgxpool.Pool) time.Time {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), queryTimeout)
	defer cancel()
	var now time.Time
	if err := pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&now); err != nil {
		t.Fatalf("clock_timestamp: %v", err)
	}
	return now
}

// waitBackendsGone waits until no server backend of the given
// application_name is left in this database (concurrent scenarios share the
// cluster and their relayers' names): after a kill -9 the server may still be
// finishing (and committing) the dead relayer's last statements. On
// timeout it reports what those backends were doing.
func waitBackendsGone(t *testing.T, pool *pgxpool.Pool, appName string) {
	t.Helper()
	poll(t, 15*time.Second, "the backends of "+appName+" to end", func() (bool, string) {
		v, err := queryInts(pool, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database()`, appName)
		if err != nil {
			return false, err.Error()
		}
		if v[0] == 0 {
			return true, ""
		}
		return false, fmt.Sprintf("%d backends left:\n%s", v[0], backendReport(pool, appName))
	})
}

// backendReport describes the backends of an application_name and the
// backends blocking them, for failure messages.
func backendReport(pool *pgxpool.Pool, appName string) string {
	ctx, cancel := context.WithTimeout(context.Background(), queryTimeout)
	defer cancel()
	rows, err := pool.Query(ctx, `
		WITH mine AS (SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database())
		SELECT format('pid %s app %s db %s state %s wait %s/%s blocked_by %s xact_age %s query_age %s: %s',
		              a.pid, a.application_name, a.datname, a.state, a.wait_event_type, a.wait_event, pg_blocking_pids(a.pid),
		              now() - a.xact_start, now() - a.query_start, left(regexp_replace(a.query, '\s+', ' ', 'g'), 300))
		FROM pg_stat_activity a
		WHERE a.pid IN (SELECT pid FROM mine)
		   OR a.pid IN (SELECT unnest(pg_blocking_pids(pid)) FROM mine)
		ORDER BY a.application_name <> $1, a.pid`, appName)
	if err != nil {
		return err.Error()
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err.Error()
	}
	return strings.Join(lines, "\n")
}

// heldClaim is an in-flight row a killed relayer left behind.
type heldClaim struct {
	outboxID, attemptID uuid.UUID
	leaseUntil          time.Time
}

// heldBy lists the in-flight rows of a relayer.
func heldBy(t *testing.T, pool *pgxpool.Pool, relayer string) []heldClaim {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), queryTimeout)
	defer cancel()
	rows, err := pool.Query(ctx, `SELECT outbox_id, attempt_id, lease_until FROM outbox.inflight WHERE relayer_id = $1`, relayer)
	if err != nil {
		t.Fatalf("in-flight rows of %s: %v", relayer, err)
	}
	held, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (heldClaim, error) {
		var h heldClaim
		return h, r.Scan(&h.outboxID, &h.attemptID, &h.leaseUntil)
	})
	if err != nil {
		t.Fatalf("in-flight rows of %s: %v", relayer, err)
	}
	return held
}
