package test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/migrations"
)

// heavySlots bounds how many fault scenarios run at once: each runs a
// sandbox, two or three relayer processes and keeps PostgreSQL busy, and
// the suite must fit a 2-core machine.
var heavySlots = make(chan struct{}, 2)

// heavy marks a fault scenario: skipped with -short, parallel with at most
// one other scenario.
func heavy(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("fault scenario: skipped with -short")
	}
	t.Parallel()
	heavySlots <- struct{}{}
	t.Cleanup(func() { <-heavySlots })
}

// envInt reads a positive integer knob from the environment.
func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	v, err := strconv.Atoi(s)
	if err != nil || v <= 0 {
		t.Fatalf("%s=%q: want a positive integer", name, s)
	}
	return v
}

// clockSeed is the base seed when OUTBOX_FAULT_SEED is not set.
var clockSeed = uint64(time.Now().UnixNano() % 1_000_000_000)

// seedFor returns a scenario's seed: OUTBOX_FAULT_SEED (or else the clock)
// plus an offset per scenario. It is logged, so a run can be repeated.
func seedFor(t *testing.T, scenario uint64) uint64 {
	t.Helper()
	base := clockSeed
	if s := os.Getenv("OUTBOX_FAULT_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("OUTBOX_FAULT_SEED=%q: want an unsigned integer", s)
		}
		base = v
	}
	seed := base + scenario*1000
	t.Logf("seed %d (repeat with OUTBOX_FAULT_SEED=%d)", seed, base)
	return seed
}

// summary logs the grep-able result line of a scenario.
func summary(t *testing.T, scenario string, instructions, zombiesHealed int64, worstHeal time.Duration, duplicates int64, extra string) {
	t.Helper()
	t.Logf("FAULT-SUMMARY scenario=%s instructions=%d zombies_healed=%d worst_heal=%s duplicates=%d %s",
		scenario, instructions, zombiesHealed, worstHeal.Round(time.Millisecond), duplicates, extra)
}

// drainSetup is what every scenario starts with: a database with a first
// share of the workload, the sandbox rail server, its rails configuration
// and an (empty) fleet.
type drainSetup struct {
	pool  *pgxpool.Pool
	work  workload
	sb    *sandboxServer
	fleet *fleet
}

// setupDrain enqueues the first quarter of the workload (the rest is
// enqueued while the relayers run), starts the sandbox server and prepares
// the fleet; dbURL returns each relayer slot's database URL.
func setupDrain(t *testing.T, pool *pgxpool.Pool, w workload, sf sandboxFlags, dbURL func(slot int) string) *drainSetup {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := w.enqueue(ctx, pool, 0, w.n/4); err != nil {
		t.Fatal(err)
	}
	sb := startSandbox(t, sf)
	return &drainSetup{pool: pool, work: w, sb: sb, fleet: newFleet(t, writeRailsConfig(t, sb.url), dbURL)}
}

// startFleet starts relayers in slots 1..n, then the background enqueue of
// the rest of the workload; the returned function waits for the enqueue.
func (d *drainSetup) startFleet(t *testing.T, n int) (enqueued func()) {
	t.Helper()
	for slot := 1; slot <= n; slot++ {
		d.fleet.start(slot)
	}
	return d.work.enqueueInBackground(t, d.pool, d.work.n/4)
}

// drain waits for the background enqueue, then for the drain.
func (d *drainSetup) drain(t *testing.T, enqueued func(), timeout time.Duration) {
	t.Helper()
	enqueued()
	waitDrained(t, d.pool, d.fleet, int64(d.work.n), timeout)
}

// stopAndCheck stops the fleet gracefully and runs the common end checks.
func (d *drainSetup) stopAndCheck(t *testing.T) endState {
	t.Helper()
	d.fleet.stopAll()
	return checkEnd(t, d.pool, d.sb, int64(d.work.n))
}

// finish is drain, then stopAndCheck.
func (d *drainSetup) finish(t *testing.T, enqueued func(), drainTimeout time.Duration) endState {
	t.Helper()
	d.drain(t, enqueued, drainTimeout)
	return d.stopAndCheck(t)
}

// TestFaultKill9Relayers proves invariant 6 against the crash that matters
// most: a relayer process killed with SIGKILL at an arbitrary instruction
// of its work (claim, rail call, outcome recording). Three relayer
// processes drain a workload while, at seeded random moments, one of them
// is killed and replaced by a new generation; this is repeated for several
// drains with different seeds. Every drain must complete (the reaper heals
// every zombie within 3x the lease after the kill), invariants 1-5 must
// hold, and the rail, which honours idempotency keys and outlives the
// relayers, must have paid every dispatched instruction exactly once.
func TestFaultKill9Relayers(t *testing.T) {
	heavy(t)
	// Three rounds, not five: make test is bound by the processor, and
	// this test's race-built relayers are the fault suite's largest part.
	rounds := envInt(t, "OUTBOX_FAULT_ROUNDS", 3)
	n := envInt(t, "OUTBOX_FAULT_INSTRUCTIONS", 20000)
	seed := seedFor(t, 1)
	var total killRoundResult
	for r := range rounds {
		roundSeed := seed + uint64(r)
		t.Run(fmt.Sprintf("round%d-seed%d", r+1, roundSeed), func(t *testing.T) {
			res := killRound(t, roundSeed, n)
			t.Logf("round %d: instructions=%d kills=%d zombies_healed=%d worst_heal=%s worst_lease_to_requeue=%s late=%d dispatched_twice=%d replays=%d dead=%d duplicates=%d drain=%s",
				r+1, res.instructions, res.kills, res.zombies, res.worstHeal.Round(time.Millisecond),
				res.worstRequeueLag.Round(time.Millisecond), res.late, res.dispatchedTwice, res.replays, res.dead,
				res.duplicates, res.elapsed.Round(100*time.Millisecond))
			total.add(res)
		})
	}
	summary(t, "kill9", total.instructions, total.zombies, total.worstHeal, total.duplicates,
		fmt.Sprintf("rounds=%d kills=%d worst_lease_to_requeue=%s late=%d dispatched_twice=%d replays=%d dead=%d",
			rounds, total.kills, total.worstRequeueLag.Round(time.Millisecond), total.late, total.dispatchedTwice, total.replays, total.dead))
}

// killRoundResult are one drain's numbers (or the sum over drains).
type killRoundResult struct {
	instructions, kills, zombies, late, dispatchedTwice, replays, dead, duplicates int64
	worstHeal, worstRequeueLag, elapsed                                            time.Duration
}

func (a *killRoundResult) add(b killRoundResult) {
	a.instructions += b.instructions
	a.kills += b.kills
	a.zombies += b.zombies
	a.late += b.late
	a.dispatchedTwice += b.dispatchedTwice
	a.replays += b.replays
	a.dead += b.dead
	a.duplicates += b.duplicates
	a.worstHeal = max(a.worstHeal, b.worstHeal)
	a.worstRequeueLag = max(a.worstRequeueLag, b.worstRequeueLag)
	a.elapsed += b.elapsed
}

// kill is one kill -9: the victim, the database time just before the
// signal, and the in-flight rows it held once its backends were gone.
type kill struct {
	relayer string
	at      time.Time
	held    []heldClaim
}

func killRound(t *testing.T, seed uint64, n int) killRoundResult {
	begin := time.Now()
	rng := rand.New(rand.NewPCG(seed, 0x6b696c6c))
	dbURL := testdb.URL(t)
	pool := openPool(t, dbURL)
	d := setupDrain(t, pool, workload{prefix: fmt.Sprintf("kill-%d", seed), n: n, seed: seed},
		sandboxFlags{seed: int64(seed), latencyMin: 2 * time.Millisecond, latencyMax: 20 * time.Millisecond, terminalRate: 0.005},
		func(int) string { return dbURL })
	enqueued := d.startFleet(t, 3)

	// Several kills per drain, at seeded moments between 10% and 70% of
	// the drain, each plus a seeded delay so the moment is not aligned to
	// the progress poll. A kill waits until the previous kill's zombies
	// healed: otherwise the next victim may be the relayer that re-claimed
	// one of them, stranding it twice, and its heal time would measure two
	// faults instead of one.
	thresholds := make([]int64, 3+rng.IntN(2))
	for i := range thresholds {
		thresholds[i] = int64(float64(n) * (0.10 + 0.60*rng.Float64()))
	}
	slices.Sort(thresholds)
	var kills []kill
	for _, th := range thresholds {
		waitProgress(t, pool, d.fleet, th, 2*time.Minute)
		if len(kills) > 0 {
			waitHealed(t, pool, d.fleet, kills[len(kills)-1])
		}
		time.Sleep(time.Duration(rng.IntN(250)) * time.Millisecond) // moves the kill moment, not a synchronisation
		kills = append(kills, killAndReplace(t, pool, d.fleet, 1+rng.IntN(3)))
	}
	end := d.finish(t, enqueued, 3*time.Minute)

	res := killRoundResult{
		instructions: end.report.Dispatched + end.report.DeadLetters, kills: int64(len(kills)), late: end.late,
		dispatchedTwice: end.report.DispatchedTwice, replays: end.sandbox.Replays, dead: end.report.DeadLetters,
		duplicates: end.sandbox.EffectiveDuplicates,
	}
	var worst zombieHealTime
	var worstKill kill
	for _, k := range kills {
		for _, h := range killHeals(t, pool, k) {
			res.zombies++
			if h.heal > worst.heal {
				worst, worstKill = h, k
			}
			res.worstRequeueLag = max(res.worstRequeueLag, h.requeueLag)
			// Three leases: the dead claim's, the reaper's pass, the
			// copy's call; and one more for each claim of the copy a
			// relayer handed back unsent, whose lease it did not wait for
			// (a loaded machine; make test once saw three in a row).
			if bound := 3*lease + time.Duration(h.released)*lease; h.heal > bound {
				t.Errorf("zombie %s of %s healed %s after the kill, more than 3x the lease and one more for each of its %d claims handed back unsent (%s); its trail: %s",
					h.outboxID, k.relayer, h.heal, h.released, bound, trail(t, pool, h.outboxID, k.at))
			}
		}
	}
	res.worstHeal = worst.heal
	if worst.outboxID != "" {
		t.Logf("slowest zombie %s of %s: healed after %s; trail: %s", worst.outboxID, worstKill.relayer,
			worst.heal.Round(time.Millisecond), trail(t, pool, worst.outboxID, worstKill.at))
	}
	res.elapsed = time.Since(begin)
	return res
}

// killAndReplace kill -9s a slot's relayer, starts its replacement, and
// records what the dead relayer held in flight (read once the server has
// finished the dead relayer's last statements).
func killAndReplace(t *testing.T, pool *pgxpool.Pool, f *fleet, slot int) kill {
	t.Helper()
	at := dbNow(t, pool)
	victim := f.kill(slot)
	f.start(slot)
	waitBackendsGone(t, pool, victim)
	k := kill{relayer: victim, at: at, held: heldBy(t, pool, victim)}
	verifyNow(t, pool, "right after the kill of "+victim)
	return k
}

// waitHealed waits until every in-flight row a killed relayer held has
// reached DISPATCHED or FAILED since the kill. The heal-time bound itself
// is checked on the archive after the drain; this only keeps kills apart.
func waitHealed(t *testing.T, pool *pgxpool.Pool, f *fleet, k kill) {
	t.Helper()
	ids := make([]uuid.UUID, len(k.held))
	for i, h := range k.held {
		ids[i] = h.outboxID
	}
	poll(t, 30*time.Second, "the zombies of "+k.relayer+" to heal", func() (bool, string) {
		if err := f.healthy(); err != nil {
			t.Fatal(err)
		}
		v, err := queryInts(pool, `SELECT count(*) FROM unnest($1::uuid[]) AS z(outbox_id)
			WHERE NOT EXISTS (SELECT 1 FROM outbox.attempts a WHERE a.outbox_id = z.outbox_id
			                  AND a.state IN ('DISPATCHED', 'FAILED') AND a.created_at > $2)`, ids, k.at)
		if err != nil {
			return false, err.Error()
		}
		return v[0] == 0, fmt.Sprintf("%d of %d not healed", v[0], len(ids))
	})
}

// zombieHealTime is one zombie of a kill: how long after the kill it
// reached DISPATCHED or FAILED, and how long after its lease expired the
// reaper requeued it.
type zombieHealTime struct {
	outboxID         string
	heal, requeueLag time.Duration
	// released counts the claims of the requeued instruction handed back
	// unsent (RELEASED) before it was healed: a relayer that could not
	// start the rail call with the rail's timeout left on the lease (a
	// loaded machine: the fault suite's lease grace is 1 s).
	released int64
}

// killHeals measures the zombies of a kill from the archive: the dead
// relayer's claims that a reaper closed with ZOMBIE_REQUEUE after the kill
// (the requeue row keeps the dead relayer's id and the claim's time; the
// lease ended at claimed_at + lease). Every in-flight row seen right after
// the kill must be among them.
func killHeals(t *testing.T, pool *pgxpool.Pool, k kill) []zombieHealTime {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rows, err := pool.Query(ctx, `
		SELECT z.outbox_id::text, z.claim_attempt_id::text,
		       (extract(epoch FROM h.at - $2::timestamptz) * 1000)::bigint,
		       (extract(epoch FROM z.created_at - (z.claimed_at + $3::bigint * interval '1 millisecond')) * 1000)::bigint,
		       (SELECT count(*) FROM outbox.attempts r
		        WHERE r.outbox_id = z.outbox_id AND r.error_code = 'RELEASED' AND r.created_at > $2 AND r.created_at < h.at)
		FROM outbox.attempts z
		LEFT JOIN LATERAL (
		  SELECT min(a.created_at) AS at FROM outbox.attempts a
		  WHERE a.outbox_id = z.outbox_id AND a.state IN ('DISPATCHED', 'FAILED') AND a.created_at > $2) h ON true
		WHERE z.state = 'ZOMBIE_REQUEUE' AND z.relayer_id = $1 AND z.created_at > $2`,
		k.relayer, k.at, lease.Milliseconds())
	if err != nil {
		t.Fatalf("zombies of %s: %v", k.relayer, err)
	}
	requeued := map[string]bool{}
	var heals []zombieHealTime
	for rows.Next() {
		var outboxID, claim string
		var healMS *int64
		var lagMS, released int64
		if err := rows.Scan(&outboxID, &claim, &healMS, &lagMS, &released); err != nil {
			t.Fatalf("zombies of %s: %v", k.relayer, err)
		}
		requeued[claim] = true
		if healMS == nil {
			t.Errorf("zombie %s of %s was requeued but never reached DISPATCHED or FAILED", outboxID, k.relayer)
			continue
		}
		heals = append(heals, zombieHealTime{outboxID: outboxID, released: released,
			heal: time.Duration(*healMS) * time.Millisecond, requeueLag: time.Duration(lagMS) * time.Millisecond})
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("zombies of %s: %v", k.relayer, err)
	}
	for _, h := range k.held {
		if !requeued[h.attemptID.String()] {
			t.Errorf("%s held outbox %s (attempt %s, lease until %s) when it was killed, but no reaper requeued it",
				k.relayer, h.outboxID, h.attemptID, h.leaseUntil)
		}
	}
	return heals
}

// trail is an instruction's attempt trail, compactly, with times relative
// to since (for messages).
func trail(t *testing.T, pool *pgxpool.Pool, outboxID string, since time.Time) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), queryTimeout)
	defer cancel()
	rows, err := pool.Query(ctx, `
		SELECT format('%s#%s%s by %s at %sms%s', state, attempt_no, CASE WHEN late THEN '(late)' ELSE '' END, relayer_id,
		              round(extract(epoch FROM created_at - $2::timestamptz) * 1000),
		              coalesce(' ' || error_code, '') || coalesce(' ' || rail_code, ''))
		FROM outbox.attempts WHERE outbox_id = $1 ORDER BY created_at, attempt_id`, outboxID, since)
	if err != nil {
		return err.Error()
	}
	steps, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err.Error()
	}
	return strings.Join(steps, " -> ")
}

// TestFaultPostgresRestart crashes the database server itself (pg_ctl
// restart -m immediate: every backend dies, the server runs recovery) when
// about a third of a drain is done. The relayers must reconnect on their
// own, their connection pools and their LISTEN connections, and finish the
// drain; the producer retries its interrupted transaction under the same
// idempotency keys. Afterwards invariants 1-5 hold (invariant 6 across a
// server crash) and every dispatched instruction was paid exactly once.
func TestFaultPostgresRestart(t *testing.T) {
	heavy(t)
	seed := seedFor(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cluster := startCluster(ctx, t, "dedicated PostgreSQL")
	dbURL := cluster.ConnString("postgres")
	pool := openPool(t, dbURL)
	if err := migrations.Migrate(ctx, pool); err != nil {
		t.Fatalf("migrate: %v", err)
	}

	n := max(envInt(t, "OUTBOX_FAULT_INSTRUCTIONS", 20000), 5000)
	d := setupDrain(t, pool, workload{prefix: "restart", n: n, seed: seed},
		sandboxFlags{seed: int64(seed), latencyMin: 2 * time.Millisecond, latencyMax: 20 * time.Millisecond},
		func(int) string { return dbURL })
	enqueued := d.startFleet(t, 3)

	waitProgress(t, pool, d.fleet, int64(n/3), 2*time.Minute)
	restartAt := time.Now()
	if err := cluster.Restart(ctx, "immediate"); err != nil {
		t.Fatalf("restart PostgreSQL: %v", err)
	}
	restartTook := time.Since(restartAt)
	verifyNow(t, pool, "right after the restart")
	waitListening(t, pool, d.fleet, restartAt)

	end := d.finish(t, enqueued, 3*time.Minute)
	z := archiveZombieHeal(t, pool)
	if z.unhealed > 0 {
		t.Errorf("%d requeued zombies never reached DISPATCHED or FAILED", z.unhealed)
	}
	summary(t, "pg-restart", end.report.Dispatched+end.report.DeadLetters, z.healed, z.worst, end.sandbox.EffectiveDuplicates,
		fmt.Sprintf("restart=%s late=%d dispatched_twice=%d replays=%d dead=%d",
			restartTook.Round(time.Millisecond), end.late, end.report.DispatchedTwice, end.sandbox.Replays, end.report.DeadLetters))
}

// waitListening waits until every current relayer has a LISTEN connection
// opened after since: the listener reconnected by itself.
func waitListening(t *testing.T, pool *pgxpool.Pool, f *fleet, since time.Time) {
	t.Helper()
	want := int64(len(f.current))
	poll(t, 30*time.Second, "every relayer to LISTEN again", func() (bool, string) {
		if err := f.healthy(); err != nil {
			t.Fatal(err)
		}
		v, err := queryInts(pool, `SELECT count(DISTINCT application_name) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name LIKE 'relayer-%' AND query ILIKE 'listen %' AND backend_start >= $1`, since)
		if err != nil {
			return false, err.Error()
		}
		return v[0] == want, fmt.Sprintf("%d of %d relayers listen", v[0], want)
	})
}

// TestFaultConnectionsTerminated cuts one relayer's database connections
// again and again during a drain (pg_terminate_backend on every backend of
// relayer 1, the pool's and the LISTEN connection), while two others run
// undisturbed. Statements die mid-claim and mid-outcome; the relayer must
// reconnect and carry on, and no outcome may be lost or applied twice:
// the drain completes, invariants 1-5 hold, no instruction was claimed
// while an earlier claim of it was open, and every dispatched instruction
// was paid exactly once.
func TestFaultConnectionsTerminated(t *testing.T) {
	heavy(t)
	seed := seedFor(t, 3)
	const n = 10000
	dbURL := testdb.URL(t)
	pool := openPool(t, dbURL)
	d := setupDrain(t, pool, workload{prefix: "terminate", n: n, seed: seed},
		sandboxFlags{seed: int64(seed), latencyMin: 2 * time.Millisecond, latencyMax: 20 * time.Millisecond},
		func(int) string { return dbURL })
	enqueued := d.startFleet(t, 3)

	term := terminateRepeatedly(pool, "relayer-1-%", seed)
	waitProgress(t, pool, d.fleet, int64(n/2), 2*time.Minute)
	verifyNow(t, pool, "half way through the terminations")
	d.drain(t, enqueued, 3*time.Minute)
	terminated := term.stop()
	end := d.stopAndCheck(t)
	if terminated == 0 {
		t.Errorf("no backend of relayer 1 was terminated: the fault was not injected")
	}
	z := archiveZombieHeal(t, pool)
	if z.unhealed > 0 {
		t.Errorf("%d requeued zombies never reached DISPATCHED or FAILED", z.unhealed)
	}
	t.Logf("terminated %d backends of relayer 1; %d late outcomes", terminated, end.late)
	summary(t, "conn-terminate", end.report.Dispatched+end.report.DeadLetters, z.healed, z.worst, end.sandbox.EffectiveDuplicates,
		fmt.Sprintf("terminated_backends=%d late=%d dispatched_twice=%d replays=%d dead=%d",
			terminated, end.late, end.report.DispatchedTwice, end.sandbox.Replays, end.report.DeadLetters))
}

// terminator terminates database backends in the background.
type terminator struct {
	cancel     context.CancelFunc
	done       chan struct{}
	terminated atomic.Int64
}

// terminateRepeatedly terminates every backend of the pool's database whose
// application_name is LIKE pattern (other scenarios' relayers share the
// cluster and the names), every 200-700 ms (seeded), until stop.
func terminateRepeatedly(pool *pgxpool.Pool, pattern string, seed uint64) *terminator {
	ctx, cancel := context.WithCancel(context.Background())
	term := &terminator{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(term.done)
		rng := rand.New(rand.NewPCG(seed, 0x7465726d))
		for {
			timer := time.NewTimer(time.Duration(200+rng.IntN(500)) * time.Millisecond)
			select {
			case <-ctx.Done():
				timer.Stop()
				return
			case <-timer.C:
			}
			qctx, qcancel := context.WithTimeout(ctx, queryTimeout)
			var k int64
			err := pool.QueryRow(qctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
				FROM pg_stat_activity WHERE application_name LIKE $1 AND datname = current_database()`, pattern).Scan(&k)
			qcancel()
			if err == nil {
				term.terminated.Add(k)
			}
		}
	}()
	return term
}

// stop ends the loop and returns how many backends it terminated.
func (term *terminator) stop() int64 {
	term.cancel()
	<-term.done
	return term.terminated.Load()
}

// TestFaultConnectionBlackHole puts a TCP proxy between one relayer and
// the database and black-holes it (no byte copied either way, sockets kept
// open) while that relayer holds work in flight, until the other relayers'
// reapers have requeued all of it, i.e. past its leases. The stranded
// relayer keeps dispatching to the rail, so its outcomes arrive late, after
// other relayers re-sent the same instructions under the same keys. Two
// holes: one ends as soon as such a re-sent copy is in flight elsewhere, so
// the late outcomes race it (fencing must leave the copy's claim alone);
// the other lasts lease + 1s, so the copies are done when the late
// outcomes arrive. The drain completes, invariants 1-5 hold, no
// instruction was claimed while an earlier claim of it was open, every
// requeued claim of the stranded relayer still got its own (late) outcome
// recorded, and the rail paid every dispatched instruction exactly once.
func TestFaultConnectionBlackHole(t *testing.T) {
	heavy(t)
	seed := seedFor(t, 4)
	const n = 10000
	dbURL := testdb.URL(t)
	pool := openPool(t, dbURL)
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := startProxy(t, u.Host)
	proxied := *u
	proxied.Host = proxy.addr()
	const strandedSlot = 2 // slots 1 and 3 connect directly
	// A slow tail: 10% of calls take 1.5s (within the rail timeout). The
	// sandbox's choices depend on (key, attempt number), and a requeued
	// zombie keeps its attempt number, so the copy of a slow call is slow
	// too: it stays in flight long enough for a late outcome to race it.
	d := setupDrain(t, pool, workload{prefix: "blackhole", n: n, seed: seed},
		sandboxFlags{seed: int64(seed), latencyMin: 2 * time.Millisecond, latencyMax: 20 * time.Millisecond,
			slowRate: 0.1, slowLatency: 1500 * time.Millisecond},
		func(slot int) string {
			if slot == strandedSlot {
				return proxied.String()
			}
			return dbURL
		})
	enqueued := d.startFleet(t, 3)
	stranded := relayerID(strandedSlot, 0)

	h := blackHoler{t: t, pool: pool, proxy: proxy, fleet: d.fleet, stranded: stranded}
	waitProgress(t, pool, d.fleet, int64(n/4), 2*time.Minute)
	racing := h.episode(true)
	waitProgress(t, pool, d.fleet, int64(n*3/5), 2*time.Minute)
	long := h.episode(false)
	end := d.finish(t, enqueued, 3*time.Minute)

	// Every claim of the stranded relayer that was requeued must have its
	// own outcome archived late: nothing it did was lost.
	v := mustInts(t, pool, `SELECT count(*),
		count(*) FILTER (WHERE EXISTS (SELECT 1 FROM outbox.attempts l
		                               WHERE l.outbox_id = z.outbox_id AND l.claim_attempt_id = z.claim_attempt_id AND l.late))
		FROM outbox.attempts z WHERE z.state = 'ZOMBIE_REQUEUE' AND z.relayer_id = $1`, stranded)
	requeued, withLate := v[0], v[1]
	if requeued == 0 || withLate != requeued {
		t.Errorf("%d claims of %s were requeued, %d of them got their late outcome recorded; want all, and at least one", requeued, stranded, withLate)
	}
	// Late outcomes of the stranded relayer archived while another
	// relayer's claim of the same instruction was open.
	raced := mustInts(t, pool, `SELECT count(*) FROM outbox.attempts l
		WHERE l.late AND l.relayer_id = $1 AND EXISTS (
		  SELECT 1 FROM outbox.attempts c JOIN outbox.attempts cc ON cc.claim_attempt_id = c.attempt_id AND NOT cc.late
		  WHERE c.outbox_id = l.outbox_id AND c.state = 'DISPATCHING' AND c.relayer_id <> $1
		    AND c.created_at < l.created_at AND cc.created_at > l.created_at)`, stranded)[0]
	if racing.copiesInFlight > 0 && raced == 0 {
		t.Errorf("the racing hole ended with %d copies in flight elsewhere, but no late outcome of %s was archived while a copy's claim was open",
			racing.copiesInFlight, stranded)
	}
	z := archiveZombieHeal(t, pool)
	if z.unhealed > 0 {
		t.Errorf("%d requeued zombies never reached DISPATCHED or FAILED", z.unhealed)
	}
	holes := fmt.Sprintf("racing_hole=%s/%d_requeued/%d_copies_in_flight long_hole=%s/%d_requeued",
		racing.duration.Round(time.Millisecond), racing.requeued, racing.copiesInFlight,
		long.duration.Round(time.Millisecond), long.requeued)
	t.Logf("%s; late outcomes of %s: %d, %d of them while a copy was in flight (all relayers: %d)", holes, stranded, withLate, raced, end.late)
	summary(t, "conn-blackhole", end.report.Dispatched+end.report.DeadLetters, z.healed, z.worst, end.sandbox.EffectiveDuplicates,
		fmt.Sprintf("late=%d late_stranded=%d late_racing_copy=%d dispatched_twice=%d replays=%d dead=%d %s",
			end.late, withLate, raced, end.report.DispatchedTwice, end.sandbox.Replays, end.report.DeadLetters, holes))
}

// blackHoler runs black-hole episodes against one proxied relayer.
type blackHoler struct {
	t        *testing.T
	pool     *pgxpool.Pool
	proxy    *blackHoleProxy
	fleet    *fleet
	stranded string
}

// blackHoleEpisode is one hold of the proxy.
type blackHoleEpisode struct {
	duration time.Duration
	requeued int64 // claims of the stranded relayer requeued meanwhile
	// copiesInFlight counts requeued instructions another relayer had
	// claimed again when the hole ended.
	copiesInFlight int64
}

// episode waits until the stranded relayer holds work in flight, black-holes
// its connections and keeps the hole until none of its in-flight rows is
// left (the other relayers' reapers requeued them once their leases
// expired). Then, if racing, it resumes as soon as a requeued instruction
// is in flight at another relayer (or after 3s without one); otherwise it
// verifies the invariants in that state and resumes once at least
// lease + 1s passed. If the relayer happened to hold nothing
// when the hole began, or (racing) no copy showed up in flight, it tries
// again.
func (h *blackHoler) episode(racing bool) blackHoleEpisode {
	t := h.t
	t.Helper()
	for try := 1; ; try++ {
		// Minutes, not one: on a loaded machine the rail's timeouts open a
		// relayer's breaker for 30 s and its half-open probes come one at
		// a time, all with nothing of the rail's in flight.
		poll(t, 3*time.Minute, h.stranded+" to hold work in flight", func() (bool, string) {
			if err := h.fleet.healthy(); err != nil {
				t.Fatal(err)
			}
			v, err := queryInts(h.pool, `SELECT count(*) FROM outbox.inflight WHERE relayer_id = $1`, h.stranded)
			return err == nil && v[0] > 0, fmt.Sprintf("err %v", err)
		})
		start := dbNow(t, h.pool)
		began := time.Now()
		h.proxy.blackHole()
		poll(t, 30*time.Second, "the other relayers to requeue the stranded relayer's work", func() (bool, string) {
			v, err := queryInts(h.pool, `SELECT count(*) FROM outbox.inflight WHERE relayer_id = $1`, h.stranded)
			return err == nil && v[0] == 0, fmt.Sprintf("in flight %v, err %v", v, err)
		})
		var copies int64
		if racing {
			requeuedAll := time.Now()
			for time.Since(requeuedAll) < 3*time.Second {
				copies = mustInts(t, h.pool, `SELECT count(*) FROM outbox.inflight f
					WHERE f.relayer_id <> $1 AND EXISTS (SELECT 1 FROM outbox.attempts z
					  WHERE z.outbox_id = f.outbox_id AND z.state = 'ZOMBIE_REQUEUE' AND z.relayer_id = $1 AND z.created_at > $2)`,
					h.stranded, start)[0]
				if copies > 0 {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
		} else {
			verifyNow(t, h.pool, "during a black hole, with "+h.stranded+"'s outcomes held back")
			if rest := lease + time.Second - time.Since(began); rest > 0 {
				time.Sleep(rest) // the hole outlasts the lease however fast the reapers were
			}
		}
		requeued := mustInts(t, h.pool, `SELECT count(*) FROM outbox.attempts
			WHERE state = 'ZOMBIE_REQUEUE' AND relayer_id = $1 AND created_at > $2`, h.stranded, start)[0]
		h.proxy.resume()
		if requeued > 0 && (!racing || copies > 0) {
			return blackHoleEpisode{duration: time.Since(began), requeued: requeued, copiesInFlight: copies}
		}
		if try == 5 {
			t.Fatalf("5 black holes in a row without the wanted state (racing %v): %d requeued, %d copies in flight at the end",
				racing, requeued, copies)
		}
	}
}

// TestFaultRailHangs runs the drain against a rail that sometimes never
// answers: 2% of calls hang without paying, 2% pay and then never answer
// (the relayer cannot know the payment happened). The relayer's hard
// timeout must turn both into retryable RAIL_TIMEOUT attempts, and the
// retry must carry the same idempotency key, so the rail answers the
// already-paid ones as replays (409) instead of paying again. Every
// instruction ends dispatched or dead, invariants 1-5 hold, and the rail
// paid every dispatched instruction exactly once.
func TestFaultRailHangs(t *testing.T) {
	heavy(t)
	seed := seedFor(t, 5)
	const n = 5000
	dbURL := testdb.URL(t)
	pool := openPool(t, dbURL)
	d := setupDrain(t, pool, workload{prefix: "hangs", n: n, seed: seed},
		sandboxFlags{seed: int64(seed), latencyMin: time.Millisecond, latencyMax: 10 * time.Millisecond,
			hangRate: 0.02, timeoutRate: 0.02},
		func(int) string { return dbURL })
	enqueued := d.startFleet(t, 2)
	waitProgress(t, pool, d.fleet, int64(n/2), 2*time.Minute)
	verifyNow(t, pool, "half way through the drain")
	end := d.finish(t, enqueued, 3*time.Minute)

	if end.timeouts == 0 {
		t.Errorf("no RAIL_TIMEOUT attempt: the rail's hangs did not reach the relayers as timeouts")
	}
	if end.sandbox.Hangs == 0 || end.sandbox.Timeouts == 0 {
		t.Errorf("the sandbox injected %d hangs and %d paid-then-silent timeouts; want both > 0", end.sandbox.Hangs, end.sandbox.Timeouts)
	}
	if end.sandbox.Replays == 0 {
		t.Errorf("no replay reached the sandbox: retries after paid-then-silent timeouts must carry the same key")
	}
	// In the archive: instructions that timed out and then were answered
	// 409 (the key was known, the earlier payment stands).
	replayedAfterTimeout := mustInts(t, pool, `SELECT count(DISTINCT d.outbox_id) FROM outbox.attempts d
		WHERE d.state = 'DISPATCHED' AND d.rail_code = 'HTTP_409' AND EXISTS (
		  SELECT 1 FROM outbox.attempts x WHERE x.outbox_id = d.outbox_id AND x.error_code = 'RAIL_TIMEOUT' AND x.created_at < d.created_at)`)[0]
	if replayedAfterTimeout == 0 {
		t.Errorf("no instruction was answered 409 after a RAIL_TIMEOUT")
	}
	z := archiveZombieHeal(t, pool)
	if z.unhealed > 0 {
		t.Errorf("%d requeued zombies never reached DISPATCHED or FAILED", z.unhealed)
	}
	summary(t, "rail-hangs", end.report.Dispatched+end.report.DeadLetters, z.healed, z.worst, end.sandbox.EffectiveDuplicates,
		fmt.Sprintf("rail_timeouts=%d sandbox_hangs=%d sandbox_paid_timeouts=%d replays=%d replayed_after_timeout=%d late=%d dispatched_twice=%d dead=%d",
			end.timeouts, end.sandbox.Hangs, end.sandbox.Timeouts, end.sandbox.Replays, replayedAfterTimeout, end.late,
			end.report.DispatchedTwice, end.report.DeadLetters))
}

// TestFaultRollingDeploy restarts relayers the way a deploy does, under
// load: SIGTERM, a replacement starts at once, and the old process gets a
// seeded grace period (sometimes shorter than its --stop-timeout) before
// SIGKILL. A relayer that exits within its grace must exit with status 0,
// having handed back what it had claimed but not sent (RELEASED) and
// flushed its outcomes; one killed mid-stop leaves zombies for the
// reapers. Either way the drain completes, invariants 1-5 hold, and the
// rail paid every dispatched instruction exactly once.
func TestFaultRollingDeploy(t *testing.T) {
	heavy(t)
	seed := seedFor(t, 6)
	rng := rand.New(rand.NewPCG(seed, 0x6465706c))
	const n = 10000
	dbURL := testdb.URL(t)
	pool := openPool(t, dbURL)
	// A slow tail (5% of calls take 1.5s, within the rail timeout) gives a
	// stopping relayer dispatches to wait for.
	d := setupDrain(t, pool, workload{prefix: "deploy", n: n, seed: seed},
		sandboxFlags{seed: int64(seed), latencyMin: 2 * time.Millisecond, latencyMax: 20 * time.Millisecond,
			slowRate: 0.05, slowLatency: 1500 * time.Millisecond},
		func(int) string { return dbURL })
	enqueued := d.startFleet(t, 3)

	var clean, forced int
	for i := range 4 {
		waitProgress(t, pool, d.fleet, int64(float64(n)*(0.1+0.15*float64(i))), 2*time.Minute)
		slot := 1 + rng.IntN(3)
		old := d.fleet.current[slot]
		grace := time.Duration(rng.IntN(2000)) * time.Millisecond // the stop may need up to the slow latency
		old.sigterm()
		termAt := time.Now()
		d.fleet.start(slot)
		if old.waitExit(grace) {
			clean++
			t.Logf("%s exited %s after SIGTERM (grace %s)", old.name, time.Since(termAt).Round(time.Millisecond), grace)
			if old.waitErr != nil {
				t.Errorf("%s stopped within its grace but not cleanly: %v; log tail:\n%s", old.name, old.waitErr, old.tail(25))
			}
		} else {
			forced++
			t.Logf("%s killed mid-stop after a grace of %s", old.name, grace)
			old.kill(t)
		}
		waitBackendsGone(t, pool, old.name)
		verifyNow(t, pool, "right after "+old.name+" was deployed away")
	}
	end := d.finish(t, enqueued, 3*time.Minute)
	released := mustInts(t, pool, `SELECT count(*) FROM outbox.attempts WHERE error_code = 'RELEASED'`)[0]
	z := archiveZombieHeal(t, pool)
	if z.unhealed > 0 {
		t.Errorf("%d requeued zombies never reached DISPATCHED or FAILED", z.unhealed)
	}
	summary(t, "rolling-deploy", end.report.Dispatched+end.report.DeadLetters, z.healed, z.worst, end.sandbox.EffectiveDuplicates,
		fmt.Sprintf("clean_stops=%d killed_mid_stop=%d released=%d late=%d dispatched_twice=%d replays=%d dead=%d",
			clean, forced, released, end.late, end.report.DispatchedTwice, end.sandbox.Replays, end.report.DeadLetters))
}
