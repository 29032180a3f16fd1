package test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ledgerline/outbox/migrations"
)

// TestOperatorCommandsThroughPgBouncer runs, through a real PgBouncer in
// transaction mode (--pooler transaction), the operator and auditor
// commands TestThroughPgBouncer does not: rails pause (waiting for the
// rail to go quiet, which reads pg_locks across two transactions that
// PgBouncer may give different server sessions), list and resume, cancel,
// dlq replay and ack of dead letters a relayer made through the pooler,
// audit checkpoint and checkpoints, archive list and export (a COPY), and
// audit verify with four connections sharing one exported snapshot. Each
// must succeed and leave the invariants intact.
func TestOperatorCommandsThroughPgBouncer(t *testing.T) {
	heavy(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cluster := startCluster(ctx, t, "PostgreSQL")
	pool := openPool(t, cluster.ConnString("postgres"))
	if err := migrations.Migrate(ctx, pool); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	bouncer := startOwnPgBouncer(ctx, t, cluster)
	viaBouncer := bouncer.ConnString("postgres", "postgres")
	cmd := func(args ...string) string {
		t.Helper()
		code, out, errOut := runOutbox(t, "", append(args, "--database-url", viaBouncer, "--pooler", "transaction")...)
		if code != 0 {
			t.Fatalf("outbox %s through PgBouncer: exit %d\n%s%s", strings.Join(args, " "), code, out, errOut)
		}
		return out
	}

	const n = 4
	ids := make([]string, n)
	for i := range ids {
		out := cmd("enqueue", "--instruction-id", fmt.Sprintf("op-%d", i), "--participant-id", fmt.Sprintf("op-p%d", i),
			"--idempotency-key", fmt.Sprintf("op-%d", i), "--rail", "sandbox", "--amount-minor", "100", "--currency", "USD", "--destination", "acct-1")
		var r struct {
			OutboxID string `json:"outbox_id"`
		}
		if err := json.Unmarshal([]byte(out), &r); err != nil || r.OutboxID == "" {
			t.Fatalf("enqueue printed %q: %v", out, err)
		}
		ids[i] = r.OutboxID
	}

	cmd("rails", "pause", "sandbox", "--reason", "maintenance window", "--operator", "test")
	if out := cmd("rails", "list"); !strings.Contains(out, `"sandbox"`) {
		t.Fatalf("rails list does not show the pause:\n%s", out)
	}
	if out := cmd("cancel", ids[n-1], "--reason", "recalled", "--operator", "test"); !strings.Contains(out, `"done":true`) {
		t.Fatalf("cancel: %s", out)
	}
	cmd("rails", "resume", "sandbox", "--reason", "maintenance over", "--operator", "test")

	// Dead letters made by a relayer through the pooler: the rail refuses
	// every payment for good.
	sb := startSandbox(t, sandboxFlags{seed: 1, terminalRate: 1})
	f := newFleet(t, writeRailsConfig(t, sb.url), func(int) string { return viaBouncer })
	f.extraArgs = []string{"--pooler", "transaction"}
	f.start(1)
	poll(t, 30*time.Second, "the dead letters", func() (bool, string) {
		v, err := queryInts(pool, `SELECT count(*) FROM outbox.dead_letters`)
		if err != nil {
			return false, err.Error()
		}
		return v[0] == n-1, fmt.Sprintf("%d of %d", v[0], n-1)
	})
	f.stopAll()
	if out := cmd("dlq", "list"); strings.Count(out, `"outbox_id"`) != n-1 {
		t.Fatalf("dlq list: want %d dead letters:\n%s", n-1, out)
	}
	cmd("dlq", "replay", ids[0], "--reason", "the bank fixed it", "--operator", "test")
	cmd("dlq", "ack", ids[1], "--reason", "paid by hand", "--operator", "test")

	cmd("audit", "checkpoint")
	if out := cmd("audit", "checkpoints"); !strings.Contains(out, "checkpoint") {
		t.Fatalf("audit checkpoints:\n%s", out)
	}
	var partition string
	for _, line := range strings.Split(strings.TrimSpace(cmd("archive", "list")), "\n") {
		var p struct {
			Partition string `json:"partition"`
			State     string `json:"state"`
		}
		if err := json.Unmarshal([]byte(line), &p); err != nil {
			t.Fatalf("archive list line %q: %v", line, err)
		}
		if p.State == "attached" && time.Now().UTC().Format("2006_01") == p.Partition[len(p.Partition)-7:] {
			partition = p.Partition
		}
	}
	if partition == "" {
		t.Fatal("archive list shows no partition for this month")
	}
	csv := filepath.Join(t.TempDir(), "month.csv")
	cmd("archive", "export", "--partition", partition, "--out", csv)
	if out := cmd("audit", "verify", "--workers", "4"); !strings.Contains(out, `"ok":true`) {
		t.Fatalf("audit verify:\n%s", out)
	}
	v := mustInts(t, pool, `SELECT
		(SELECT count(*) FROM outbox.pending), (SELECT count(*) FROM outbox.dead_letters WHERE acknowledged_at IS NULL),
		(SELECT count(*) FROM outbox.attempts WHERE state = 'CANCELLED'), (SELECT count(*) FROM outbox.attempts WHERE state = 'REPLAYED')`)
	if v[0] != 1 || v[1] != 1 || v[2] != 1 || v[3] != 1 {
		t.Fatalf("pending %d, unacknowledged dead letters %d, cancelled %d, replayed %d: want 1 each", v[0], v[1], v[2], v[3])
	}
}
