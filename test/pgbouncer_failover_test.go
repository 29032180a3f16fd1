package test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/internal/pglocal"
	"github.com/ledgerline/outbox/migrations"
	"github.com/ledgerline/outbox/poolconfig"
)

// startOwnPgBouncer starts a real PgBouncer (pool_mode = transaction) in
// front of a cluster of the test's own. Without the binary the test is
// skipped, unless OUTBOX_REQUIRE_PGBOUNCER is set, then it fails.
func startOwnPgBouncer(ctx context.Context, t *testing.T, c *pglocal.Cluster) *pglocal.PgBouncer {
	t.Helper()
	b, err := pglocal.StartPgBouncer(ctx, c, pglocal.PgBouncerOptions{PoolSize: 20})
	if errors.Is(err, pglocal.ErrNoPgBouncer) && os.Getenv("OUTBOX_REQUIRE_PGBOUNCER") == "" {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Stop)
	return b
}

// openPooledPool opens a producer's pool through a transaction pooler, as
// a payment service behind PgBouncer does (poolconfig's pooler settings:
// unnamed statements, no startup timeouts).
func openPooledPool(t *testing.T, dbURL string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	s := poolconfig.Producer()
	s.Pooler = poolconfig.PoolerTransaction
	s.ApplyPool(cfg)
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// freeAddrs returns n loopback addresses nothing listens on yet.
func freeAddrs(t *testing.T, n int) []string {
	t.Helper()
	addrs := make([]string, n)
	for i := range addrs {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addrs[i] = ln.Addr().String()
		ln.Close()
	}
	return addrs
}

// waitReady waits until every current relayer's /readyz answers 200.
func waitReady(t *testing.T, f *fleet, addr func(slot int) string, timeout time.Duration) {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second}
	for slot := range f.current {
		poll(t, timeout, fmt.Sprintf("relayer slot %d's /readyz", slot), func() (bool, string) {
			if err := f.healthy(); err != nil {
				t.Fatal(err)
			}
			resp, err := client.Get("http://" + addr(slot) + "/readyz")
			if err != nil {
				return false, err.Error()
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK, resp.Status
		})
	}
}

// failoverLeaseGrace is the relayers' lease grace in
// TestFaultFailoverBehindPgBouncer: leases of 7 s, longer than the
// failover with room for a loaded machine.
const failoverLeaseGrace = 5 * time.Second

// TestFaultFailoverBehindPgBouncer fails the database over while every
// outbox process reaches it through a real PgBouncer in transaction mode
// (--pooler transaction): the primary crashes (pg_ctl stop -m immediate)
// mid-drain, with a producer enqueueing through the pooler, the
// synchronous standby is promoted and PgBouncer is pointed at it and
// reloaded, as an HA manager's promotion hook does; the processes are not
// told anything. Every enqueue the producer was told had committed is on
// the new primary, the drain finishes there, the invariants hold, every
// instruction was paid exactly once, every attempt the rail received is
// in the archive, and every relayer's /readyz answers 200 again.
func TestFaultFailoverBehindPgBouncer(t *testing.T) {
	heavy(t)
	seed := seedFor(t, 11)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	primary := startCluster(ctx, t, "primary")
	standby, err := primary.StartReplica(ctx, pglocal.Options{TCP: true})
	if err != nil {
		t.Fatalf("start the standby: %v", err)
	}
	t.Cleanup(func() { stopCluster(t, standby, "standby") })
	if err := primary.RequireSynchronousStandby(ctx); err != nil {
		t.Fatal(err)
	}
	// The test's own checks go straight to whichever server is the primary.
	direct := fmt.Sprintf("postgres://postgres@/postgres?host=127.0.0.1,127.0.0.1&port=%d,%d&target_session_attrs=read-write&sslmode=disable",
		primary.Port(), standby.Port())
	pool := openPool(t, direct)
	if err := migrations.Migrate(ctx, pool); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	bouncer := startOwnPgBouncer(ctx, t, primary)
	viaBouncer := bouncer.ConnString("postgres", "postgres")
	producers := openPooledPool(t, viaBouncer)

	const n = 4000
	d := setupDrain(t, pool, workload{prefix: "pgb-failover", n: n, seed: seed},
		sandboxFlags{seed: int64(seed), latencyMin: 2 * time.Millisecond, latencyMax: 20 * time.Millisecond},
		func(int) string { return viaBouncer })
	d.fleet.extraArgs = []string{"--pooler", "transaction", "--lease-grace", failoverLeaseGrace.String()}
	admin := freeAddrs(t, 3)
	d.fleet.adminAddr = func(slot int) string { return admin[slot] }
	enqueued := d.startFleet(t, 2)
	waitReady(t, d.fleet, d.fleet.adminAddr, 30*time.Second)

	waitProgress(t, pool, d.fleet, n/4, 2*time.Minute)
	liveWork := workload{prefix: "pgb-failover-live", n: 1 << 30, seed: seed}
	live := startLiveProducer(producers, liveWork)
	time.Sleep(300 * time.Millisecond)
	crashAt := time.Now()
	if err := primary.Crash(ctx); err != nil {
		t.Fatalf("crash the primary: %v", err)
	}
	time.Sleep(time.Second)
	if err := standby.Promote(ctx); err != nil {
		t.Fatalf("promote the standby: %v", err)
	}
	if err := bouncer.Retarget(ctx, standby); err != nil {
		t.Fatalf("point PgBouncer at the promoted standby: %v", err)
	}
	failover := time.Since(crashAt)
	verifyNow(t, pool, "right after the promotion")
	waitReady(t, d.fleet, d.fleet.adminAddr, 30*time.Second)
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
	// The failover (crash to PgBouncer reloaded) is shorter than the
	// lease: the outcomes of the claims in flight at the crash reach the
	// new primary before their leases end, so nothing is reaped under a
	// relayer that already called the rail, and nothing is sent twice.
	// With PgBouncer's default server_login_retry (15 s), every client
	// waited 15 s after the reload, the reaper requeued every such claim
	// and another relayer sent each again (98 of 98 in one run).
	if end.late != 0 || end.report.DispatchedTwice != 0 || end.sandbox.Replays != 0 {
		t.Errorf("after a failover of %s, shorter than the lease (%s): %d late outcomes, %d instructions dispatched twice, %d replays answered by the rail; want none",
			failover.Round(time.Millisecond), lease+failoverLeaseGrace-leaseGrace, end.late, end.report.DispatchedTwice, end.sandbox.Replays)
	}
	summary(t, "pgbouncer-failover", end.report.Dispatched+end.report.DeadLetters, z.healed, z.worst, end.sandbox.EffectiveDuplicates,
		"failover="+failover.Round(time.Millisecond).String()+" live_enqueues="+strconv.Itoa(acked)+
			fmt.Sprintf(" late=%d dispatched_twice=%d replays=%d", end.late, end.report.DispatchedTwice, end.sandbox.Replays))
}

// TestFaultPgBouncerRestart kills PgBouncer (SIGKILL) twice in the middle
// of a drain, with relayers and a producer going through it in transaction
// mode, and starts it again on the same port a second later: every client
// and server connection breaks mid-statement, commits among them, whose
// answers never arrive. Every enqueue the producer was told had committed
// is there, the drain finishes, the invariants hold, every instruction was
// paid exactly once, every attempt the rail received is in the archive,
// and every relayer's /readyz answers 200 again.
func TestFaultPgBouncerRestart(t *testing.T) {
	heavy(t)
	seed := seedFor(t, 12)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cluster := startCluster(ctx, t, "PostgreSQL")
	direct := cluster.ConnString("postgres")
	pool := openPool(t, direct)
	if err := migrations.Migrate(ctx, pool); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	bouncer := startOwnPgBouncer(ctx, t, cluster)
	viaBouncer := bouncer.ConnString("postgres", "postgres")
	producers := openPooledPool(t, viaBouncer)

	const n = 4000
	d := setupDrain(t, pool, workload{prefix: "pgb-restart", n: n, seed: seed},
		sandboxFlags{seed: int64(seed), latencyMin: 2 * time.Millisecond, latencyMax: 20 * time.Millisecond},
		func(int) string { return viaBouncer })
	d.fleet.extraArgs = []string{"--pooler", "transaction"}
	admin := freeAddrs(t, 3)
	d.fleet.adminAddr = func(slot int) string { return admin[slot] }
	enqueued := d.startFleet(t, 2)
	waitReady(t, d.fleet, d.fleet.adminAddr, 30*time.Second)

	liveWork := workload{prefix: "pgb-restart-live", n: 1 << 30, seed: seed}
	live := startLiveProducer(producers, liveWork)
	for i, at := range []int64{n / 4, n / 2} {
		waitProgress(t, pool, d.fleet, at, 2*time.Minute)
		if err := bouncer.Restart(ctx, time.Second); err != nil {
			t.Fatalf("restart %d of PgBouncer: %v", i+1, err)
		}
	}
	waitReady(t, d.fleet, d.fleet.adminAddr, 30*time.Second)
	noticed := 0
	for _, p := range d.fleet.current {
		if strings.Contains(p.log(), "failing; retrying") {
			noticed++
		}
	}
	if noticed == 0 {
		t.Fatal("no relayer saw a statement fail: the restarts cut nothing, the test proves nothing")
	}
	time.Sleep(500 * time.Millisecond)
	acked, held := live.stopAndCheck(t, pool, liveWork, "the database")

	enqueued()
	want := int64(n) + held
	waitDrained(t, pool, d.fleet, want, 3*time.Minute)
	d.fleet.stopAll()
	end := checkEnd(t, pool, d.sb, want)
	z := archiveZombieHeal(t, pool)
	if z.unhealed > 0 {
		t.Errorf("%d requeued zombies never reached DISPATCHED or FAILED", z.unhealed)
	}
	summary(t, "pgbouncer-restart", end.report.Dispatched+end.report.DeadLetters, z.healed, z.worst, end.sandbox.EffectiveDuplicates,
		fmt.Sprintf("live_enqueues=%d late=%d dispatched_twice=%d replays=%d", acked, end.late, end.report.DispatchedTwice, end.sandbox.Replays))
}
