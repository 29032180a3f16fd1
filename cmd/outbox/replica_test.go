package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/engine"
	"github.com/ledgerline/outbox/internal/pglocal"
	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/pending"
	"github.com/ledgerline/outbox/rails"
	"github.com/ledgerline/outbox/relay"
)

// TestReadOnlyCommandsOnAReplica runs the auditors' commands against a real
// streaming replica (pg_basebackup of a primary this test starts): audit
// verify while the primary is under load (relayer, reaper, producers),
// then, once the replica has replayed everything, stats, archive list,
// audit trail and audit verify, whose answers match the primary's. A write
// on the replica fails: the commands really ran on a standby.
func TestReadOnlyCommandsOnAReplica(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	// Two minutes to start each cluster, not pglocal's 30 s: make test
	// runs this beside every other package (testdb.Starting).
	starting, cancel := testdb.Starting(ctx)
	defer cancel()
	primary, err := pglocal.Start(starting, pglocal.Options{Ephemeral: true, TCP: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = primary.Stop(context.Background()) })
	purl := primary.ConnString("")
	requireExit(t, invokeCLI(t, nil, "", "migrate", "--database-url", purl), 0)
	// Auditors' settings (docs/operations.md): replay waits for their
	// queries instead of cancelling them; the primary vacuums freely.
	replica, err := primary.StartReplica(starting, pglocal.Options{TCP: true,
		Settings: map[string]string{"max_standby_streaming_delay": "-1", "hot_standby_feedback": "off"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = replica.Stop(context.Background()) })
	rurl := replica.ConnString("")

	pool, err := pgxpool.New(ctx, purl)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	set, err := rails.NewSet(rails.Options{Type: "sandbox", Profile: payment.Generic{},
		Transport: rails.NewSandbox(rails.SandboxOptions{LatencyMax: 5 * time.Millisecond, RetryableRate: 0.1})})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := relay.New(pool, relay.Config{Relayer: engine.Config{Rails: set, BackoffBase: 20 * time.Millisecond, BackoffCap: 100 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Stop(context.Background()) })
	producer, err := pending.NewProducer(pending.Config{})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var stop atomic.Bool
	for p := range 4 {
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				key := fmt.Sprintf("r-%d-%d", p, i)
				if _, err := producer.Enqueue(ctx, pool, pending.Instruction{
					InstructionID: "ins-" + key, ParticipantID: fmt.Sprintf("p%d", i%10), IdempotencyKey: key,
					RailType: "sandbox", AmountMinor: 100, Currency: "USD", Destination: "acct-1",
				}); err != nil {
					t.Error(err)
					return
				}
				time.Sleep(3 * time.Millisecond)
			}
		})
	}
	verify := func(url string) map[string]any {
		t.Helper()
		r := invokeCLI(t, nil, "", "audit", "--database-url", url, "verify")
		var rep map[string]any
		if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil || r.code != 0 || rep["ok"] != true {
			t.Fatalf("audit verify on %s: %v\n%s", url, err, r)
		}
		// On the primary it warns that its snapshot held back vacuum.
		onStandby := url == rurl
		if rep["standby"] != onStandby || strings.Contains(r.stderr, "held back vacuum") == onStandby {
			t.Errorf("audit verify on %s: standby %v, stderr %q", url, rep["standby"], r.stderr)
		}
		return rep
	}
	time.Sleep(time.Second)
	for range 2 { // under load
		if rep := verify(rurl); rep["attempts"].(float64) == 0 {
			t.Fatalf("verify on the replica under load saw no archive: %v", rep)
		}
	}
	stop.Store(true)
	wg.Wait()
	// 60 s: on a loaded machine the producers above can leave a backlog
	// queued over 10 ordered participants.
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var left int
		if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM outbox.pending) + (SELECT count(*) FROM outbox.inflight)`).Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			// What is left says why: retries backing off, successors
			// waiting, or something stranded (in flight past its lease).
			var state string
			_ = pool.QueryRow(ctx, `SELECT format('pending: %s due, %s waiting, %s later (max attempt %s, last due %s); in flight: %s, %s past their leases',
				count(*) FILTER (WHERE next_attempt_at <= now()), count(*) FILTER (WHERE next_attempt_at = 'infinity'),
				count(*) FILTER (WHERE next_attempt_at > now() AND next_attempt_at <> 'infinity'), max(attempt_count),
				max(next_attempt_at) FILTER (WHERE next_attempt_at <> 'infinity') - now(),
				(SELECT count(*) FROM outbox.inflight), (SELECT count(*) FROM outbox.inflight WHERE lease_until < now()))
				FROM outbox.pending`).Scan(&state)
			t.Fatalf("%d instructions left on the primary (%s)", left, state)
		}
	}
	if err := svc.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	// Wait for the replica to replay everything the primary wrote.
	var lsn string
	if err := pool.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	rpool, err := pgxpool.New(ctx, rurl)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rpool.Close)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var caught bool
		if err := rpool.QueryRow(ctx, "SELECT pg_last_wal_replay_lsn() >= $1::text::pg_lsn", lsn).Scan(&caught); err != nil {
			t.Fatal(err)
		}
		if caught {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the replica did not catch up in 30 s")
		}
	}

	onPrimary, onReplica := verify(purl), verify(rurl)
	for _, k := range []string{"instructions", "dispatched", "attempts", "chained_rows"} {
		if onPrimary[k] != onReplica[k] {
			t.Errorf("verify %s: primary %v, replica %v", k, onPrimary[k], onReplica[k])
		}
	}
	same := func(args ...string) string {
		t.Helper()
		rp := invokeCLI(t, nil, "", append([]string{args[0], "--database-url", purl}, args[1:]...)...)
		rr := invokeCLI(t, nil, "", append([]string{args[0], "--database-url", rurl}, args[1:]...)...)
		requireExit(t, rr, 0)
		if rp.stdout != rr.stdout {
			t.Errorf("%v: the replica answers\n%s\nthe primary\n%s", args, rr.stdout, rp.stdout)
		}
		return rr.stdout
	}
	same("archive", "--exact", "list")
	same("audit", "--instruction-id", "ins-r-0-0", "trail")
	var stats map[string]any
	r := invokeCLI(t, nil, "", "stats", "--database-url", rurl)
	requireExit(t, r, 0)
	if err := json.Unmarshal([]byte(r.stdout), &stats); err != nil {
		t.Fatalf("stats on the replica: %v\n%s", err, r)
	}
	r = invokeCLI(t, nil, "", "enqueue", "--database-url", rurl, "--participant-id", "p1", "--instruction-id", "i-x",
		"--idempotency-key", "k-x", "--rail", "sandbox", "--amount-minor", "100", "--currency", "USD", "--destination", "acct-1")
	if r.code == 0 || !strings.Contains(r.stdout+r.stderr, "read-only") {
		t.Fatalf("an enqueue on the replica:\n%s", r)
	}
}
