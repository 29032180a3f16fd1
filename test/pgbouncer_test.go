package test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ledgerline/outbox/internal/pglocal"
	"github.com/ledgerline/outbox/internal/testdb"
)

// startPgBouncer starts a real PgBouncer (pool_mode = transaction) in front
// of the test cluster. Without the binary the test is skipped, unless
// OUTBOX_REQUIRE_PGBOUNCER is set (make test sets it and installs
// pgbouncer), then it fails.
func startPgBouncer(t *testing.T, users ...string) *pglocal.PgBouncer {
	t.Helper()
	cluster := testdb.Cluster(t)
	if cluster == nil {
		t.Skip("tests run against OUTBOX_TEST_DATABASE_URL: no local cluster to put PgBouncer in front of")
	}
	b, err := pglocal.StartPgBouncer(t.Context(), cluster, pglocal.PgBouncerOptions{Users: users, PoolSize: 10})
	if errors.Is(err, pglocal.ErrNoPgBouncer) && os.Getenv("OUTBOX_REQUIRE_PGBOUNCER") == "" {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Stop)
	return b
}

// runOutbox runs one outbox command to completion and returns its exit
// status, stdout and stderr.
func runOutbox(t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, outboxBin, args...)
	cmd.Env = childEnv()
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0, stdout.String(), stderr.String()
	case errors.As(err, &exit):
		return exit.ExitCode(), stdout.String(), stderr.String()
	}
	t.Fatalf("outbox %v: %v", args, err)
	return 0, "", ""
}

// TestThroughPgBouncer: every command works through a real PgBouncer in
// transaction mode with --pooler transaction (the mode PgBouncer's own
// prepared statement names collided in, and claims failed for good);
// migrate refuses to run through it; two relayers drain a few thousand
// instructions through it with the invariants intact and no payment made
// twice.
func TestThroughPgBouncer(t *testing.T) {
	heavy(t)
	dbURL := testdb.URL(t)
	pool := openPool(t, dbURL)
	user := strings.SplitN(strings.TrimPrefix(dbURL, "postgres://"), ":", 2)[0]
	bouncer := startPgBouncer(t, user, "postgres")
	viaBouncer, err := bouncer.Rewrite(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	db := []string{"--database-url", viaBouncer, "--pooler", "transaction"}
	cmd := func(stdin string, args ...string) (int, string, string) {
		t.Helper()
		return runOutbox(t, stdin, append(args, db...)...)
	}

	// Read-only and operator commands.
	if code, out, errOut := cmd("", "migrate", "status"); code != 0 || !strings.Contains(out, "version") {
		t.Fatalf("migrate status: exit %d\n%s%s", code, out, errOut)
	}
	if code, _, errOut := cmd("", "migrate"); code != 2 || !strings.Contains(errOut, "direct database URL") {
		t.Fatalf("migrate up through the pooler: exit %d, want 2 and a pointer to a direct URL:\n%s", code, errOut)
	}

	// Enqueue: from flags, twice in a row (the second used to collide on a
	// prepared statement), then JSON lines.
	for _, key := range []string{"flag-1", "flag-2"} {
		code, out, errOut := cmd("", "enqueue", "--instruction-id", key, "--participant-id", "flags",
			"--idempotency-key", key, "--rail", "sandbox", "--amount-minor", "100", "--currency", "USD", "--destination", "acct-1")
		if code != 0 || !strings.Contains(out, `"outbox_id"`) {
			t.Fatalf("enqueue %s: exit %d\n%s%s", key, code, out, errOut)
		}
	}
	const n, participants = 3000, 300
	var lines strings.Builder
	for i := range n {
		fmt.Fprintf(&lines, `{"instruction_id":"pgb-%d","participant_id":"p-%03d","idempotency_key":"pgb-%d","rail":"sandbox","amount_minor":%d,"currency":"USD","destination":"acct-%d"}`+"\n",
			i, i%participants, i, 100+i, i)
	}
	if code, _, errOut := cmd(lines.String(), "enqueue", "--batch", "100"); code != 0 {
		t.Fatalf("enqueue from stdin: exit %d\n%s", code, errOut)
	}
	total := int64(n + 2)
	if c, err := counts(pool); err != nil || c.keys != total {
		t.Fatalf("after enqueue: %v, %v; want %d instructions", c, err, total)
	}

	for _, args := range [][]string{{"stats"}, {"dlq", "list"}, {"reap"}} {
		if code, out, errOut := cmd("", args...); code != 0 {
			t.Fatalf("%v: exit %d\n%s%s", args, code, out, errOut)
		}
	}

	// Two relayers drain it through the pooler (polling: no LISTEN there).
	sb := startSandbox(t, sandboxFlags{seed: 7})
	f := newFleet(t, writeRailsConfig(t, sb.url), func(int) string { return viaBouncer })
	f.extraArgs = []string{"--pooler", "transaction", "--log-level", "info"}
	f.start(0)
	f.start(1)
	waitDrained(t, pool, f, total, 3*time.Minute)
	f.stopAll()
	for _, p := range f.all {
		if log := p.log(); !strings.Contains(log, "polling only") {
			t.Errorf("%s did not say it polls only behind the pooler", p.name)
		}
	}

	code, out, errOut := cmd("", "audit", "verify")
	if code != 0 {
		t.Fatalf("audit verify through the pooler: exit %d\n%s%s", code, out, errOut)
	}
	var rep struct {
		OK         bool  `json:"ok"`
		Dispatched int64 `json:"dispatched"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || !rep.OK || rep.Dispatched != total {
		t.Fatalf("audit verify: %s (%v): want ok and %d dispatched", out, err, total)
	}
	var outboxID string
	if err := pool.QueryRow(t.Context(), "SELECT outbox_id::text FROM outbox.idempotency_keys LIMIT 1").Scan(&outboxID); err != nil {
		t.Fatal(err)
	}
	if code, out, errOut := cmd("", "audit", "trail", outboxID); code != 0 || !strings.Contains(out, "DISPATCHED") {
		t.Fatalf("audit trail: exit %d\n%s%s", code, out, errOut)
	}
	if st := sb.stats(t); st.Payments != total || st.EffectiveDuplicates != 0 {
		t.Fatalf("sandbox %+v: want %d payments, no duplicates", st, total)
	}
	checkNoOverlappingClaims(t, pool)

	// The traffic did go through the pooler: at least a transaction per
	// claim batch and per outcome batch of a few thousand instructions.
	u, _ := url.Parse(dbURL)
	xacts, err := bouncer.Transactions(t.Context(), strings.TrimPrefix(u.Path, "/"))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d transactions through PgBouncer", xacts)
	if xacts < 100 {
		t.Fatalf("only %d transactions went through PgBouncer", xacts)
	}
}
