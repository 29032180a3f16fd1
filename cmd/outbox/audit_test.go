package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"

	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/pending"
)

// TestAuditCheckpointsExportAndVerify: an auditor takes a checkpoint,
// exports the checkpoints to a file of their own, and verifies against it;
// once the owner has rewritten the checkpoints, the database alone still
// verifies, the export does not.
func TestAuditCheckpointsExportAndVerify(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	b.settle(t, store.Dispatched, "k1", "k2", "k3")
	time.Sleep(5 * time.Millisecond)

	r := b.cli(t, "", "audit", "--settle", "1ms", "checkpoint")
	requireExit(t, r, 0)
	var cp store.Checkpoint
	if err := json.Unmarshal([]byte(r.stdout), &cp); err != nil || cp.Rows != 6 {
		t.Fatalf("checkpoint %+v (%v), want 6 rows\n%s", cp, err, r)
	}
	r = b.cli(t, "", "audit", "checkpoints")
	requireExit(t, r, 0)
	export := filepath.Join(t.TempDir(), "checkpoints.jsonl")
	if err := os.WriteFile(export, []byte(r.stdout), 0o600); err != nil {
		t.Fatal(err)
	}
	verify := func(args ...string) (int, map[string]any) {
		r := b.cli(t, "", "audit", append(args, "verify")...)
		var rep map[string]any
		if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
			t.Fatalf("verify output: %v\n%s", err, r)
		}
		return r.code, rep
	}
	if code, rep := verify("--checkpoints", export); code != 0 || rep["exported_checkpoints"] != 1.0 || rep["chained_rows"] != 6.0 {
		t.Fatalf("verify against a fresh export: exit %d %v", code, rep)
	}
	if code, rep := verify("--checkpoints", export, "--workers", "1"); code != 0 || rep["exported_checkpoints"] != 1.0 || rep["chained_rows"] != 6.0 {
		t.Fatalf("verify on one connection: exit %d %v", code, rep)
	}
	requireExit(t, b.cli(t, "", "audit", "--workers", "0", "verify"), 2)
	// The export cut short at a line's end (its end line lost) is refused,
	// not taken for an export of fewer checkpoints.
	whole, err := os.ReadFile(export)
	if err != nil {
		t.Fatal(err)
	}
	cut := filepath.Join(t.TempDir(), "cut.jsonl")
	lines := strings.SplitAfter(strings.TrimSuffix(string(whole), "\n"), "\n")
	if err := os.WriteFile(cut, []byte(strings.Join(lines[:len(lines)-1], "")), 0o600); err != nil {
		t.Fatal(err)
	}
	r = b.cli(t, "", "audit", "--checkpoints", cut, "verify")
	requireExit(t, r, 2)
	if !strings.Contains(r.stderr, "cut short") {
		t.Fatalf("verify against an export cut short:\n%s", r)
	}

	// The owner replaces the checkpoints with new ones of its own.
	for _, q := range []string{
		`ALTER TABLE outbox.checkpoints DISABLE TRIGGER checkpoints_append_only`,
		`DELETE FROM outbox.checkpoints`,
		`ALTER TABLE outbox.checkpoints ENABLE TRIGGER checkpoints_append_only`,
		`SELECT outbox.take_checkpoint(clock_timestamp())`,
	} {
		if _, err := b.pool.Exec(b.ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if code, rep := verify(); code != 0 {
		t.Fatalf("the database alone: exit %d %v", code, rep)
	}
	code, rep := verify("--checkpoints", export)
	if code != 1 || !strings.Contains(strings.Join(anyStrings(rep["violations"]), "\n"), "exported checkpoints") {
		t.Fatalf("against the export: exit %d %v", code, rep)
	}

	r = b.cli(t, "", "audit", "--checkpoints", filepath.Join(t.TempDir(), "missing"), "verify")
	requireExit(t, r, 2)
}

func anyStrings(v any) []string {
	var out []string
	for _, x := range v.([]any) {
		out = append(out, x.(string))
	}
	return out
}

// settle enqueues an instruction per key (participant "p-"+key), claims
// them all and records state for each, as a relayer would (a rail
// reference when dispatched, RAIL_REJECTED when failed); it returns the
// claims.
func (b *cliBundle) settle(t *testing.T, state store.State, keys ...string) []store.Claimed {
	t.Helper()
	producer, err := pending.NewProducer(pending.Config{})
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.New("")
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range keys {
		if _, err := producer.Enqueue(b.ctx, b.pool, pending.Instruction{
			InstructionID: "ins-" + key, ParticipantID: "p-" + key, IdempotencyKey: key,
			RailType: "sandbox", AmountMinor: 100, Currency: "USD", Destination: "acct-1",
		}); err != nil {
			t.Fatal(err)
		}
	}
	claimed, err := st.Claim(b.ctx, b.pool, store.ClaimParams{RelayerID: "r1", Limit: len(keys) + 1, Leases: map[string]time.Duration{"sandbox": time.Hour}})
	if err != nil || len(claimed) != len(keys) {
		t.Fatalf("claimed %d of %d: %v", len(claimed), len(keys), err)
	}
	var outcomes []store.Outcome
	for i, c := range claimed {
		o := store.Outcome{Identity: c.Identity, AttemptID: uuidV7(t), ClaimAttemptID: c.AttemptID,
			AttemptNo: c.AttemptNo, RelayerID: "r1", ClaimedAt: c.ClaimedAt, State: state, CountAttempt: true}
		switch state {
		case store.Dispatched:
			o.RailReference = "ref-" + string(rune('a'+i))
		case store.Failed:
			o.ErrorCode = "RAIL_REJECTED"
		}
		outcomes = append(outcomes, o)
	}
	if _, _, err := st.Record(b.ctx, b.pool, outcomes, store.HandoffParams{}); err != nil {
		t.Fatal(err)
	}
	return claimed
}

func uuidV7(t *testing.T) uuid.UUID {
	t.Helper()
	id, err := uuid.NewV7()
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// TestReapTakesTheFleetsZombieLimit: a manual `outbox reap` pass takes
// --zombie-limit as the relayers do. It had none, and dead-lettered at
// the default (3) what a fleet running a higher limit, or none, would
// have requeued.
func TestReapTakesTheFleetsZombieLimit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		dead bool
	}{{nil, true}, {[]string{"--zombie-limit", "5"}, false}, {[]string{"--zombie-limit", "-1"}, false}} {
		b := setupCLI(t)
		producer, err := pending.NewProducer(pending.Config{})
		if err != nil {
			t.Fatal(err)
		}
		st, err := store.New("")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := producer.Enqueue(b.ctx, b.pool, pending.Instruction{InstructionID: "ins-1", ParticipantID: "p1",
			IdempotencyKey: "k1", RailType: "sandbox", AmountMinor: 100, Currency: "USD", Destination: "acct-1"}); err != nil {
			t.Fatal(err)
		}
		if c, err := st.Claim(b.ctx, b.pool, store.ClaimParams{RelayerID: "r1", Limit: 1,
			Leases: map[string]time.Duration{"sandbox": time.Hour}}); err != nil || len(c) != 1 {
			t.Fatalf("claim: %v %v", c, err)
		}
		// Its relayer died, as its two before it did.
		if _, err := b.pool.Exec(b.ctx, `UPDATE outbox.inflight SET zombie_count = 3, lease_until = now() - interval '1 second'`); err != nil {
			t.Fatal(err)
		}
		requireExit(t, b.cli(t, "", "reap", tc.args...), 0)
		if dead := b.count(t, "dead_letters") == 1; dead != tc.dead || b.count(t, "pending")+b.count(t, "dead_letters") != 1 {
			t.Errorf("reap %v: dead-lettered %v, want %v (pending %d, dead letters %d)", tc.args, dead, tc.dead,
				b.count(t, "pending"), b.count(t, "dead_letters"))
		}
	}
}

// TestReapRefusesArgumentsAndSaysWhenItFailed: `outbox reap once` ran a
// pass, the argument silently ignored (an alert's runbook even said so);
// it is a usage error (exit 2) now. A pass that fails (here, on a schema
// never migrated) no longer prints "requeued 0 zombie instruction(s)"
// before its error, as if it had run.
func TestReapRefusesArgumentsAndSaysWhenItFailed(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	r := b.cli(t, "", "reap", "once")
	requireExit(t, r, 2)
	if !strings.Contains(r.stderr, "reap takes no arguments") {
		t.Errorf("reap once: stderr %q", r.stderr)
	}
	r = b.cli(t, "", "reap", "--schema", "never_migrated")
	requireExit(t, r, 1)
	if strings.Contains(r.stderr, "requeued 0") {
		t.Errorf("a failed pass says it requeued: %q", r.stderr)
	}
}
