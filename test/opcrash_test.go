package test

// Crash tests of the operator's and the producer's commands: each command
// that writes runs as a real process, is killed with SIGKILL in the middle
// of its work (at a point the test holds it at with a lock or an open
// transaction of its own, or after a random delay), and then the database
// must be consistent (Verify), hold everything the command had reported
// done, show nothing half-done, keep no lock, advisory lock or prepared
// transaction of the dead process, and the same command run again must
// finish the job exactly once.

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/internal/testdb"
)

// crashDB gives a crash test its database and the test's own pool on it.
// The tests are light (one command process at a time), so they do not
// take a heavy slot; they need the binary, which -short does not build.
func crashDB(t *testing.T) (string, *pgxpool.Pool) {
	t.Helper()
	if testing.Short() {
		t.Skip("crash test of a command process: skipped with -short (the binary is not built)")
	}
	t.Parallel()
	dbURL := testdb.URL(t)
	return dbURL, openPool(t, dbURL)
}

// opRun is a command process the test kills; its stdout goes to a file.
type opRun struct {
	*proc
	stdoutPath string
}

// startOp starts an outbox command with stdin (may be empty).
func startOp(t *testing.T, name, stdin string, args ...string) *opRun {
	t.Helper()
	dir := t.TempDir()
	in := filepath.Join(dir, "stdin")
	if err := os.WriteFile(in, []byte(stdin), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(in)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	out := filepath.Join(dir, "stdout")
	return &opRun{proc: startProcIn(t, name, out, f, args...), stdoutPath: out}
}

// lines returns the complete lines the process wrote to stdout (a killed
// process may have left half a line: it is not one).
func (o *opRun) lines(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(o.stdoutPath)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	} else {
		return nil
	}
	return strings.Split(s, "\n")
}

// killSettled kills the command and waits until the server has ended its
// sessions (a session that was waiting for a lock ends once it notices),
// then checks that it left nothing behind: no advisory lock, no prepared
// transaction, no session of it.
func (o *opRun) killSettled(t *testing.T, pool *pgxpool.Pool, app string) {
	t.Helper()
	o.kill(t)
	waitBackendsGone(t, pool, app)
	v := mustInts(t, pool, `SELECT
		(SELECT count(*) FROM pg_locks l WHERE l.locktype = 'advisory'
		   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())),
		(SELECT count(*) FROM pg_prepared_xacts WHERE database = current_database())`)
	if v[0] != 0 || v[1] != 0 {
		t.Fatalf("the killed %s left %d advisory locks and %d prepared transactions", o.name, v[0], v[1])
	}
}

// holdTx opens a transaction on a connection of its own, runs stmts in it
// and keeps it open until release (or the test's end): what it locks
// holds a command at a known point. release rolls it back.
func holdTx(t *testing.T, pool *pgxpool.Pool, stmts ...string) (release func()) {
	t.Helper()
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		conn.Release()
		t.Fatal(err)
	}
	for _, s := range stmts {
		if _, err := tx.Exec(ctx, s); err != nil {
			_ = tx.Rollback(ctx)
			conn.Release()
			t.Fatalf("%s: %v", s, err)
		}
	}
	done := false
	release = func() {
		if !done {
			done = true
			_ = tx.Rollback(ctx)
			conn.Release()
		}
	}
	t.Cleanup(release)
	return release
}

// waitLockWait waits until a session of app in this database waits for
// a lock: the command is held where the test wants to kill it.
func waitLockWait(t *testing.T, pool *pgxpool.Pool, o *opRun, app string) {
	t.Helper()
	poll(t, 30*time.Second, o.name+" to wait for the lock the test holds", func() (bool, string) {
		if o.exited() {
			t.Fatalf("%s ended before it waited (%s):\n%s", o.name, o.exitState(), o.tail(20))
		}
		v, err := queryInts(pool, `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = $1 AND datname = current_database() AND wait_event_type = 'Lock'`, app)
		if err != nil {
			return false, err.Error()
		}
		return v[0] > 0, backendReport(pool, app)
	})
}

// waitFor polls cond (a count query) until it returns more than zero,
// failing if the command ended first.
func waitFor(t *testing.T, pool *pgxpool.Pool, o *opRun, what, query string, args ...any) {
	t.Helper()
	poll(t, 30*time.Second, what, func() (bool, string) {
		if o.exited() {
			t.Fatalf("%s ended before %s (%s):\n%s", o.name, what, o.exitState(), o.tail(20))
		}
		v, err := queryInts(pool, query, args...)
		if err != nil {
			return false, err.Error()
		}
		return v[0] > 0, ""
	})
}

// enqueueInput is n JSON input lines of `outbox enqueue` (keys k-0..),
// spread over 20 participants.
func enqueueInput(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, `{"instruction_id":"ins-%d","participant_id":"p%d","idempotency_key":"k-%d","rail":"sandbox","amount_minor":%d,"currency":"USD","destination":"acct-1"}`+"\n",
			i, i%20, i, 100+i)
	}
	return b.String()
}

// enqueueReceipt is one output line of `outbox enqueue`.
type enqueueReceipt struct {
	OutboxID   string `json:"outbox_id"`
	SequenceID int64  `json:"sequence_id"`
	Duplicate  bool   `json:"duplicate"`
	Error      *struct {
		Code string `json:"code"`
	} `json:"error"`
}

func decodeReceipts(t *testing.T, lines []string) []enqueueReceipt {
	t.Helper()
	out := make([]enqueueReceipt, len(lines))
	for i, l := range lines {
		if err := json.Unmarshal([]byte(l), &out[i]); err != nil || out[i].OutboxID == "" {
			t.Fatalf("output line %d %q is not a receipt (%v)", i, l, err)
		}
	}
	return out
}

// checkReceiptsKept fails unless every receipt printed for input line i
// (key k-i) is in the queue under that key, and the queue holds no more
// than a batch beyond them, in whole batches.
func checkReceiptsKept(t *testing.T, pool *pgxpool.Pool, printed []enqueueReceipt, batch int) int64 {
	t.Helper()
	ids, keys := make([]string, len(printed)), make([]string, len(printed))
	for i, r := range printed {
		ids[i], keys[i] = r.OutboxID, fmt.Sprintf("k-%d", i)
	}
	v := mustInts(t, pool, `SELECT
		(SELECT count(*) FROM unnest($1::uuid[], $2::text[]) AS r(id, key)
		  WHERE NOT EXISTS (SELECT 1 FROM outbox.pending p WHERE p.outbox_id = r.id AND p.idempotency_key = r.key)),
		(SELECT count(*) FROM outbox.pending),
		(SELECT count(*) FROM outbox.idempotency_keys)`, ids, keys)
	if v[0] != 0 {
		t.Fatalf("%d of the %d receipts printed before the kill are not in the queue under their key", v[0], len(printed))
	}
	if v[1] != v[2] {
		t.Fatalf("%d pending instructions but %d keys", v[1], v[2])
	}
	// A batch commits whole or not at all: the queue holds whole batches,
	// the printed ones and at most the one whose commit was not printed.
	if v[1]%int64(batch) != 0 || v[1] < int64(len(printed)) || v[1] > int64(len(printed)+batch) {
		t.Fatalf("%d instructions enqueued, %d receipts printed: not the printed batches and at most one more of %d", v[1], len(printed), batch)
	}
	return v[1]
}

// TestCrashEnqueueBatch: `outbox enqueue --batch` killed in the middle of
// its input, once while a batch waits on a key the test holds (the batches
// before it committed and printed, that one not), then after random
// delays. Every receipt printed is in the queue, a batch is in whole or
// not at all, and the same input sent again enqueues every line exactly
// once: the lines that had committed answer with their original receipt,
// marked duplicate.
func TestCrashEnqueueBatch(t *testing.T) {
	dbURL, pool := crashDB(t)
	const n, batch = 2000, 250
	input := enqueueInput(n)
	args := []string{"enqueue", "--database-url", dbURL, "--batch", fmt.Sprint(batch)}
	const app = "outbox-producer"

	// Held at the third batch: the test's own uncommitted row of key
	// k-600 makes its insert wait.
	release := holdTx(t, pool, `INSERT INTO outbox.idempotency_keys (instruction_id, idempotency_key, outbox_id, participant_id, sequence_id, payload_hash)
		VALUES ('held', 'k-600', gen_random_uuid(), 'held', 1, '\x00')`)
	o := startOp(t, "enqueue-held", input, args...)
	waitLockWait(t, pool, o, app)
	o.killSettled(t, pool, app)
	release()
	printed := decodeReceipts(t, o.lines(t))
	if len(printed) != 2*batch {
		t.Fatalf("printed %d receipts before the held batch, want %d", len(printed), 2*batch)
	}
	if got := checkReceiptsKept(t, pool, printed, batch); got != 2*batch {
		t.Fatalf("%d instructions enqueued with the third batch held, want the %d of the first two", got, 2*batch)
	}
	verifyNow(t, pool, "after enqueue was killed on a held batch")
	first := map[int]string{}
	for i, r := range printed {
		first[i] = r.OutboxID
	}

	rng := rand.New(rand.NewPCG(seedFor(t, 58), 1))
	for round := range 3 {
		o := startOp(t, fmt.Sprintf("enqueue-%d", round), input, args...)
		time.Sleep(time.Duration(50+rng.IntN(600)) * time.Millisecond)
		o.killSettled(t, pool, app)
		printed := decodeReceipts(t, o.lines(t))
		checkReceiptsKept(t, pool, printed, batch)
		for i, r := range printed {
			if id, ok := first[i]; ok && id != r.OutboxID {
				t.Fatalf("line %d: receipt %s, earlier %s", i, r.OutboxID, id)
			}
			first[i] = r.OutboxID
		}
		verifyNow(t, pool, fmt.Sprintf("after enqueue was killed (round %d)", round))
	}

	code, stdout, stderr := runOutbox(t, input, args...)
	if code != 0 {
		t.Fatalf("enqueue again: exit %d\n%s\n%s", code, stdout, stderr)
	}
	all := decodeReceipts(t, strings.Split(strings.TrimSuffix(stdout, "\n"), "\n"))
	if len(all) != n {
		t.Fatalf("enqueue again printed %d receipts, want %d", len(all), n)
	}
	for i, r := range all {
		if id, ok := first[i]; ok && (id != r.OutboxID || !r.Duplicate) {
			t.Fatalf("line %d: receipt %+v, but it had committed as %s before: want that one, marked duplicate", i, r, id)
		}
	}
	v := mustInts(t, pool, `SELECT count(*), count(DISTINCT idempotency_key) FROM outbox.pending`)
	if v[0] != n || v[1] != n {
		t.Fatalf("%d instructions (%d keys) enqueued, want each of the %d lines once", v[0], v[1], n)
	}
	verifyNow(t, pool, "after enqueue ran again")
}
