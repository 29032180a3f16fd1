package test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/internal/pglocal"
	"github.com/ledgerline/outbox/migrations"
	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/pending"
	"github.com/ledgerline/outbox/poolconfig"
)

// TestFaultFailover fails the database over in the middle of a drain, at
// the worst moment: the standby's replication stream is black-holed (a
// network partition between the two servers) for two seconds, then the
// primary crashes (pg_ctl stop -m immediate) and, a second later, the
// standby, which received nothing of those two seconds, is promoted, as an
// HA manager fails over. The relayers, the producer and the test's checks
// all use one URL naming both servers with target_session_attrs=read-write,
// so they reach whichever accepts writes; nothing else tells them that the
// primary moved.
//
// Commits wait for the synchronous standby, so during the partition no
// commit is acknowledged and nothing acknowledged is lost: the drain
// finishes on the promoted standby, invariants 1-5 hold, every
// instruction was paid exactly once and every attempt that reached the
// rail is in the archive (checkEnd). With an asynchronous standby the same
// run loses what was acknowledged during the partition: enqueues the
// producer was told had committed, and claims whose rail calls were made
// (docs/operations.md, "Failover").
func TestFaultFailover(t *testing.T) {
	heavy(t)
	seed := seedFor(t, 7)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	primary := startCluster(ctx, t, "primary")
	standby, err := primary.StartReplica(ctx, pglocal.Options{TCP: true})
	if err != nil {
		t.Fatalf("start the standby: %v", err)
	}
	t.Cleanup(func() { stopCluster(t, standby, "standby") })
	replication := startProxy(t, fmt.Sprintf("127.0.0.1:%d", primary.Port()))
	streamThrough(t, primary, standby, replication)
	if err := primary.RequireSynchronousStandby(ctx); err != nil {
		t.Fatal(err)
	}
	dbURL := fmt.Sprintf("postgres://postgres@/postgres?host=127.0.0.1,127.0.0.1&port=%d,%d&target_session_attrs=read-write&sslmode=disable",
		primary.Port(), standby.Port())
	pool := openPool(t, dbURL)
	if err := migrations.Migrate(ctx, pool); err != nil {
		t.Fatalf("migrate: %v", err)
	}

	const n = 10000
	d := setupDrain(t, pool, workload{prefix: "failover", n: n, seed: seed},
		sandboxFlags{seed: int64(seed), latencyMin: 2 * time.Millisecond, latencyMax: 20 * time.Millisecond},
		func(int) string { return dbURL })
	enqueued := d.startFleet(t, 3)

	waitProgress(t, pool, d.fleet, n/3, 2*time.Minute)
	liveWork := workload{prefix: "failover-live", n: 1 << 30, seed: seed}
	live := startLiveProducer(pool, liveWork)
	time.Sleep(200 * time.Millisecond)
	partitionAt := time.Now()
	replication.blackHole()
	time.Sleep(2 * time.Second)
	crashAt := time.Now()
	if err := primary.Crash(ctx); err != nil {
		t.Fatalf("crash the primary: %v", err)
	}
	replication.close() // what the partition held never arrives
	// A failure detector takes a moment to decide; meanwhile no server
	// accepts writes, and the relayers and the producer retry.
	time.Sleep(time.Second)
	if err := standby.Promote(ctx); err != nil {
		t.Fatalf("promote the standby: %v", err)
	}
	failover := time.Since(crashAt)
	verifyNow(t, pool, "right after the promotion")
	waitListening(t, pool, d.fleet, partitionAt)
	time.Sleep(500 * time.Millisecond)
	acked, held := live.stopAndCheck(t, pool, liveWork, "the promoted standby")

	enqueued()
	want := int64(n) + held
	waitDrained(t, pool, d.fleet, want, 3*time.Minute)
	d.fleet.stopAll()
	end := checkEnd(t, pool, d.sb, want)
	z := archiveZombieHeal(t, pool)
	if z.unhealed > 0 {
		t.Errorf("%d requeued zombies never reached DISPATCHED or FAILED", z.unhealed)
	}
	summary(t, "failover", end.report.Dispatched+end.report.DeadLetters, z.healed, z.worst, end.sandbox.EffectiveDuplicates,
		fmt.Sprintf("failover=%s live_enqueues=%d late=%d dispatched_twice=%d replays=%d dead=%d",
			failover.Round(time.Millisecond), acked, end.late, end.report.DispatchedTwice, end.sandbox.Replays, end.report.DeadLetters))
}

// liveProducer enqueues one instruction per transaction, as a payment
// service does, through the failover: a transaction that fails is retried
// with the same instruction (its idempotency key makes that safe whether
// or not it had committed) until it is acknowledged; then the next.
// Stopped, it ends once the instruction under way is acknowledged, so
// every key it wrote is one it was told committed.
type liveProducer struct {
	cancel context.CancelFunc
	done   chan struct{}
	acked  int
	err    error
}

// stopAndCheck stops the live producer and fails the test unless it had
// enqueues acknowledged and the database (what, for the message: "the
// promoted standby") holds every one of them. Each live enqueue was
// acknowledged before the next began, and stop waits for the one under
// way, so the acknowledged ones are the first acked of the stream and the
// only ones. It returns acked and how many of the stream's instructions
// the database holds (the one under way at the stop may have committed
// too): what the drain must count.
func (lp *liveProducer) stopAndCheck(t *testing.T, pool *pgxpool.Pool, w workload, what string) (acked int, held int64) {
	t.Helper()
	acked, err := lp.stop()
	if err != nil {
		t.Fatalf("live producer: %v", err)
	}
	if acked == 0 {
		t.Fatal("the live producer had no enqueue acknowledged: it proves nothing")
	}
	ackedIDs := make([]string, acked)
	for i, ins := range w.instructions(0, acked) {
		ackedIDs[i] = ins.InstructionID
	}
	v := mustInts(t, pool, `SELECT
		(SELECT count(*) FROM unnest($1::text[]) AS a(id)
		 WHERE NOT EXISTS (SELECT 1 FROM outbox.idempotency_keys k WHERE k.instruction_id = a.id)),
		(SELECT count(*) FROM outbox.idempotency_keys WHERE instruction_id LIKE $2)`, ackedIDs, w.prefix+"-%")
	if v[0] > 0 {
		t.Fatalf("the producer was told %d enqueues committed; %s lacks %d of them", acked, what, v[0])
	}
	return acked, v[1]
}

func startLiveProducer(pool *pgxpool.Pool, w workload) *liveProducer {
	ctx, cancel := context.WithCancel(context.Background())
	lp := &liveProducer{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(lp.done)
		var stopped time.Time // when stop found an instruction failing
		for i := 0; ctx.Err() == nil; i++ {
			ins := w.instructions(i, i+1)[0]
			for {
				// Stop takes effect between instructions, never during one.
				// A commit cut off by a cancelled context may still land on
				// the server after pgx has returned the cancellation (it
				// cancels the query after returning), so stop would return
				// before it and the test count one key too few (it did: want
				// 11,094 keys, 11,095 drained). An attempt that times out is
				// retried under the same key, which dedupes it.
				actx, acancel := context.WithTimeout(context.Background(), 10*time.Second)
				err := pgx.BeginFunc(actx, pool, func(tx pgx.Tx) error {
					_, err := producer.Enqueue(actx, tx, ins)
					return err
				})
				acancel()
				if err == nil {
					lp.acked = i + 1
					break
				}
				if errors.Is(err, payment.ErrValidation) || errors.Is(err, pending.ErrIdempotencyMismatch) || errors.Is(err, pending.ErrKeyRetired) {
					lp.err = fmt.Errorf("enqueue %s: %w", ins.InstructionID, err)
					return
				}
				if ctx.Err() != nil {
					if stopped.IsZero() {
						stopped = time.Now()
					} else if time.Since(stopped) > 30*time.Second {
						// The database stayed unusable after stop: say so
						// rather than hang the test.
						lp.err = fmt.Errorf("stopped, but enqueue %s still failing after 30 s: %w", ins.InstructionID, err)
						return
					}
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
	}()
	return lp
}

// stop ends the stream and returns how many enqueues were acknowledged.
func (lp *liveProducer) stop() (int, error) {
	lp.cancel()
	<-lp.done
	return lp.acked, lp.err
}

// streamThrough makes standby stream from primary through proxy (its
// primary_conninfo, which a reload applies by restarting its WAL
// receiver), and waits until primary's only standby connection is the one
// through the proxy.
func streamThrough(t *testing.T, primary, standby *pglocal.Cluster, proxy *blackHoleProxy) {
	t.Helper()
	host, port, err := net.SplitHostPort(proxy.addr())
	if err != nil {
		t.Fatal(err)
	}
	spool := openPool(t, standby.ConnString(""))
	if _, err := spool.Exec(context.Background(), fmt.Sprintf(
		"ALTER SYSTEM SET primary_conninfo = 'host=%s port=%s user=postgres application_name=through_proxy'", host, port)); err != nil {
		t.Fatal(err)
	}
	if _, err := spool.Exec(context.Background(), "SELECT pg_reload_conf()"); err != nil {
		t.Fatal(err)
	}
	ppool := openPool(t, primary.ConnString(""))
	poll(t, 30*time.Second, "the standby to stream through the proxy", func() (bool, string) {
		v, err := queryInts(ppool, `SELECT count(*) FILTER (WHERE application_name = 'through_proxy' AND state = 'streaming'),
			count(*) FROM pg_stat_replication`)
		if err != nil {
			return false, err.Error()
		}
		return v[0] == 1 && v[1] == 1, fmt.Sprintf("%d through the proxy of %d standby connections", v[0], v[1])
	})
}

// TestDeadlineDuringAStandbyWaitIsAnError: a commit waiting for a
// synchronous standby that is cancelled returns success with a warning
// although the standby may never get it (docs/operations.md, "Failover").
// When a deadline interrupts an outbox process's commit, pgx returns the
// deadline's error first and only then cancels and closes the connection,
// so the success reaches nobody: the caller counts the write as failed,
// and retrying it under the same idempotency key is what resolves it. Here
// no standby can ever confirm (synchronous_standby_names names none), an
// enqueue with the producer's pool settings gives up after half a second
// with an error, and once the requirement is lifted the retry finds the
// enqueue committed (a duplicate).
func TestDeadlineDuringAStandbyWaitIsAnError(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("starts its own PostgreSQL: skipped with -short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cluster := startCluster(ctx, t, "dedicated PostgreSQL")
	admin := openPool(t, cluster.ConnString(""))
	if err := migrations.Migrate(ctx, admin); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	requireStandby := func(names string) {
		t.Helper()
		if _, err := admin.Exec(ctx, fmt.Sprintf("ALTER SYSTEM SET synchronous_standby_names = '%s'", names)); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
			t.Fatal(err)
		}
		// pg_reload_conf only signals the postmaster: a backend it forks
		// before reloading has the old setting, and the producers' pool
		// connects afresh. Wait until a new connection has the new one.
		for {
			conn, err := pgx.Connect(ctx, cluster.ConnString(""))
			if err != nil {
				t.Fatal(err)
			}
			var got string
			err = conn.QueryRow(ctx, "SELECT current_setting('synchronous_standby_names')").Scan(&got)
			_ = conn.Close(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if got == names {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		// Backends decide whether to wait from a flag in shared memory
		// that the checkpointer sets when it reloads, which may come
		// later: until then a commit does not wait, whatever the
		// setting says (it failed so in one make test run). A commit
		// that wrote WAL and timed out shows the wait in force.
		for names != "" {
			conn, err := pgx.Connect(ctx, cluster.ConnString(""))
			if err != nil {
				t.Fatal(err)
			}
			probe, cancelProbe := context.WithTimeout(ctx, 200*time.Millisecond)
			err = pgx.BeginFunc(probe, conn, func(tx pgx.Tx) error {
				_, err := tx.Exec(probe, "CREATE TABLE IF NOT EXISTS sync_probe (); DROP TABLE sync_probe")
				return err
			})
			cancelProbe()
			_ = conn.Close(ctx)
			if err != nil {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	cfg, err := pgxpool.ParseConfig(cluster.ConnString(""))
	if err != nil {
		t.Fatal(err)
	}
	poolconfig.Producer().ApplyPool(cfg)
	producers, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(producers.Close)
	ins := workload{prefix: "deadline", n: 1, seed: 1}.instructions(0, 1)[0]
	enqueue := func(ctx context.Context) (pending.Receipt, error) {
		var r pending.Receipt
		err := pgx.BeginFunc(ctx, producers, func(tx pgx.Tx) (err error) {
			r, err = producer.Enqueue(ctx, tx, ins)
			return err
		})
		return r, err
	}

	requireStandby("nobody")
	short, cancelShort := context.WithTimeout(ctx, 500*time.Millisecond)
	_, err = enqueue(short)
	cancelShort()
	if err == nil {
		t.Fatal("an enqueue whose commit no standby can confirm succeeded")
	}
	requireStandby("")
	r, err := enqueue(ctx)
	if err != nil {
		t.Fatalf("retry: %v", err)
	}
	if !r.Duplicate {
		t.Errorf("the retry enqueued afresh (%+v): the abandoned commit did not complete", r)
	}
}

// TestFaultOutcomesLostWithAnAsynchronousStandby: with an asynchronous
// standby, a failover can lose outcomes the old primary acknowledged
// (docs/operations.md, "Failover"). Here every claim reached the standby
// (replication is synchronous until they have committed), then its
// replication stream is black-holed and replication made asynchronous
// while the rail is called, and the outcomes are written on the primary
// alone, the primary crashes and
// the standby is promoted: each instruction is in flight again there, its
// DISPATCHED row gone. The reaper requeues each after its lease and the
// relayer sends it to the rail again under the same idempotency key,
// never a new one: the rail answers every one as a replay and makes no
// payment twice, and the archive verifies, each instruction dispatched
// once, every attempt the rail received in it.
func TestFaultOutcomesLostWithAnAsynchronousStandby(t *testing.T) {
	heavy(t)
	seed := seedFor(t, 13)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	primary := startCluster(ctx, t, "primary")
	standby, err := primary.StartReplica(ctx, pglocal.Options{TCP: true})
	if err != nil {
		t.Fatalf("start the standby: %v", err)
	}
	t.Cleanup(func() { stopCluster(t, standby, "standby") })
	replication := startProxy(t, fmt.Sprintf("127.0.0.1:%d", primary.Port()))
	streamThrough(t, primary, standby, replication)
	// Synchronous while the claims commit, so that each is on the standby
	// once it has committed, however slowly the standby replays;
	// asynchronous for the outcomes.
	if err := primary.RequireSynchronousStandby(ctx); err != nil {
		t.Fatal(err)
	}
	dbURL := fmt.Sprintf("postgres://postgres@/postgres?host=127.0.0.1,127.0.0.1&port=%d,%d&target_session_attrs=read-write&sslmode=disable",
		primary.Port(), standby.Port())
	pool := openPool(t, dbURL)
	if err := migrations.Migrate(ctx, pool); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	onPrimary := openPool(t, primary.ConnString("postgres"))
	onStandby := openPool(t, standby.ConnString("postgres"))

	// One participant each, and fewer than the rail's 32 concurrent
	// calls, so that one claim takes them all, each is sent at once, and
	// nothing is claimed after the stream is cut (such a claim would be
	// lost too, and its rail call with it: the case synchronous
	// replication exists for, not this one; with 40, 8 waited for a rail
	// slot past their leases' margin, were released and claimed again).
	const n = 24
	ins := workload{prefix: "lost-outcome", n: n, seed: seed}.instructions(0, n)
	for i := range ins {
		ins[i].ParticipantID = ins[i].InstructionID
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := producer.EnqueueBatch(ctx, tx, ins)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	// The margins are wide for a loaded machine (make test's -race, every
	// package at once): the rail answers 5 s after each call, the time
	// the test has to cut the stream once it sees the claims; the lease
	// grace of 5 s is how late a claimed instruction may reach the rail
	// (with the suite's 1 s, claims that waited longer were released
	// and claimed again after the cut, on the primary alone, and their
	// rail calls were lost with it).
	const latency, timeout, grace = 5 * time.Second, 8 * time.Second, 5 * time.Second
	sb := startSandbox(t, sandboxFlags{seed: int64(seed), latencyMin: latency, latencyMax: latency})
	f := newFleet(t, writeRailsConfigTimeout(t, sb.url, timeout), func(int) string { return dbURL })
	f.extraArgs = []string{"--lease-grace", grace.String()}
	f.start(1)

	poll(t, 30*time.Second, "every instruction in flight on the primary", func() (bool, string) {
		v, err := queryInts(onPrimary, `SELECT count(*) FROM outbox.inflight`)
		if err != nil {
			return false, err.Error()
		}
		return v[0] == n, fmt.Sprintf("%d of %d in flight", v[0], n)
	})
	// The rail answers 5 s after the claim: the outcomes are not written
	// yet.
	replication.blackHole()
	// Commits waiting for the standby (none should) are released, and the
	// outcomes commit on the primary alone.
	for _, q := range []string{"ALTER SYSTEM SET synchronous_standby_names = ''", "SELECT pg_reload_conf()"} {
		if _, err := onPrimary.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	poll(t, 30*time.Second, "the outcomes on the primary", func() (bool, string) {
		v, err := queryInts(onPrimary, `SELECT count(*) FROM outbox.attempts WHERE state = 'DISPATCHED'`)
		if err != nil {
			return false, err.Error()
		}
		return v[0] == n, fmt.Sprintf("%d of %d dispatched", v[0], n)
	})
	// The scene needs one claim of each instruction, made before the cut
	// (so the standby has it): another is an instruction released and
	// claimed again after the cut, whose rail call the failover loses.
	if v := mustInts(t, onPrimary, `SELECT count(*) FROM outbox.attempts WHERE state = 'DISPATCHING'`); v[0] != n {
		t.Fatalf("%d claims on the primary, want one for each of the %d instructions: the test's margins were too short for this machine, it proves nothing", v[0], n)
	}
	if err := primary.Crash(ctx); err != nil {
		t.Fatalf("crash the primary: %v", err)
	}
	replication.close()
	if err := standby.Promote(ctx); err != nil {
		t.Fatalf("promote the standby: %v", err)
	}
	if v := mustInts(t, onStandby, `SELECT count(*) FROM outbox.inflight`); v[0] != n {
		t.Fatalf("the promoted standby has %d of %d instructions in flight: the outcomes were not lost, the test proves nothing", v[0], n)
	}

	waitDrained(t, pool, f, n, time.Minute)
	f.stopAll()
	end := checkEnd(t, pool, sb, n)
	if end.sandbox.Payments != n || end.sandbox.Replays != n {
		t.Errorf("the rail made %d payments and answered %d replays; want each of the %d instructions paid once and sent again under its key once (stats %+v)",
			end.sandbox.Payments, end.sandbox.Replays, n, end.sandbox)
	}
	if end.zombies != n {
		t.Errorf("%d ZOMBIE_REQUEUE rows; want the reaper to requeue each of the %d claims whose outcome was lost", end.zombies, n)
	}
}
