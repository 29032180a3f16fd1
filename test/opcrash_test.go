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
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/migrations"
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

// killSettled kills the command, then ends what held it (release: the
// test's transaction, rolled back; nil for none), waits until the server
// has ended the command's sessions, and checks that it left nothing
// behind: no advisory lock, no prepared transaction, no session. Released
// after the kill, a statement the command had sent goes on (PostgreSQL
// notices a client gone only when it next reads from it): a statement
// that is a whole action commits, one inside a transaction ends with the
// transaction rolled back. What follows the kill must be whole either way.
func (o *opRun) killSettled(t *testing.T, pool *pgxpool.Pool, app string, release func()) {
	t.Helper()
	o.kill(t)
	if release != nil {
		release()
	}
	waitBackendsGone(t, pool, app)
	v := mustInts(t, pool, `SELECT
		(SELECT count(*) FROM pg_locks l WHERE l.locktype = 'advisory'
		   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())),
		(SELECT count(*) FROM pg_prepared_xacts WHERE database = current_database())`)
	if v[0] != 0 || v[1] != 0 {
		t.Fatalf("the killed %s left %d advisory locks and %d prepared transactions", o.name, v[0], v[1])
	}
}

// holdTx opens a transaction on a connection of its own, runs stmt (with
// args) in it and keeps it open until release (or the test's end): what
// it locks holds a command at a known point. release rolls it back.
func holdTx(t *testing.T, pool *pgxpool.Pool, stmt string, args ...any) (release func()) {
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
	if _, err := tx.Exec(ctx, stmt, args...); err != nil {
		_ = tx.Rollback(ctx)
		conn.Release()
		t.Fatalf("%s: %v", stmt, err)
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

// waitFor polls query (a count) until it returns more than zero, failing
// if the command ended first.
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
}

// decodeReceipts decodes output lines that must all be receipts.
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
// (key k-i) is in the queue under that key, and the queue holds whole
// batches: those enqueued before this run (prev instructions), the ones
// it printed, and at most one more whose commit it did not print (a run
// sends the lines enqueued before again first, printing them duplicate,
// so one killed among them has printed fewer than prev). It returns how
// many instructions the queue holds.
func checkReceiptsKept(t *testing.T, pool *pgxpool.Pool, printed []enqueueReceipt, batch int, prev int64) int64 {
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
	// A batch commits whole or not at all.
	if n := v[1]; n%int64(batch) != 0 || n < prev || n < int64(len(printed)) || n > max(prev, int64(len(printed)+batch)) {
		t.Fatalf("%d instructions enqueued (%d before this run), %d receipts printed: not whole batches, at most one of %d beyond those printed or enqueued before",
			n, prev, len(printed), batch)
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
	o.killSettled(t, pool, app, release)
	printed := decodeReceipts(t, o.lines(t))
	if len(printed) != 2*batch {
		t.Fatalf("printed %d receipts before the held batch, want %d", len(printed), 2*batch)
	}
	enqueued := checkReceiptsKept(t, pool, printed, batch, 0)
	if enqueued != 2*batch {
		t.Fatalf("%d instructions enqueued with the third batch held, want the %d of the first two", enqueued, 2*batch)
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
		o.killSettled(t, pool, app, nil)
		printed := decodeReceipts(t, o.lines(t))
		enqueued = checkReceiptsKept(t, pool, printed, batch, enqueued)
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

// schemaFingerprint describes what a schema holds (tables and their
// columns, constraints, indexes and whether they are valid, functions
// with their security and settings, triggers, policies, views, partition
// bounds, privileges, the migration version), one line per object, sorted,
// with the schema's name as S: two schemas migrated to the same version
// have the same fingerprint.
func schemaFingerprint(t *testing.T, pool *pgxpool.Pool, schema string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var fp string
	if err := pool.QueryRow(ctx, `
		WITH ns AS (SELECT oid FROM pg_namespace WHERE nspname = $1),
		lines AS (
		  SELECT format('rel %s %s %s persistence=%s options=%s acl=%s rls=%s bound=%s', c.relname, c.relkind,
		                c.relispartition, c.relpersistence, c.reloptions, c.relacl, c.relrowsecurity,
		                pg_get_expr(c.relpartbound, c.oid)) AS l
		  FROM pg_class c WHERE c.relnamespace = (SELECT oid FROM ns)
		  UNION ALL
		  SELECT format('col %s.%s %s notnull=%s default=%s', c.relname, a.attname, format_type(a.atttypid, a.atttypmod),
		                a.attnotnull, pg_get_expr(d.adbin, d.adrelid))
		  FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
		  LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
		  WHERE c.relnamespace = (SELECT oid FROM ns) AND a.attnum > 0 AND NOT a.attisdropped
		  UNION ALL
		  SELECT format('con %s %s %s valid=%s', conrelid::regclass, conname, pg_get_constraintdef(oid), convalidated)
		  FROM pg_constraint WHERE connamespace = (SELECT oid FROM ns)
		  UNION ALL
		  SELECT format('idx %s valid=%s', pg_get_indexdef(i.indexrelid), i.indisvalid)
		  FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relnamespace = (SELECT oid FROM ns)
		  UNION ALL
		  SELECT format('fn %s secdef=%s config=%s acl=%s', pg_get_functiondef(p.oid), p.prosecdef, p.proconfig, p.proacl)
		  FROM pg_proc p WHERE p.pronamespace = (SELECT oid FROM ns)
		  UNION ALL
		  SELECT format('trg %s enabled=%s', pg_get_triggerdef(g.oid), g.tgenabled)
		  FROM pg_trigger g JOIN pg_class c ON c.oid = g.tgrelid WHERE c.relnamespace = (SELECT oid FROM ns) AND NOT g.tgisinternal
		  UNION ALL
		  SELECT format('pol %s.%s %s %s %s %s', tablename, policyname, cmd, roles, qual, with_check)
		  FROM pg_policies WHERE schemaname = $1
		  UNION ALL
		  SELECT format('view %s %s', c.relname, pg_get_viewdef(c.oid))
		  FROM pg_class c WHERE c.relnamespace = (SELECT oid FROM ns) AND c.relkind IN ('v', 'm')
		)
		SELECT coalesce(string_agg(replace(l, $1, 'S'), E'\n' ORDER BY replace(l, $1, 'S')), '') FROM lines`, schema).Scan(&fp); err != nil {
		t.Fatalf("fingerprint of %s: %v", schema, err)
	}
	return fp + fmt.Sprintf("\nversion %d", schemaVersion(t, pool, schema))
}

// schemaVersion is a schema's migration version (0: none applied).
func schemaVersion(t *testing.T, pool *pgxpool.Pool, schema string) int32 {
	t.Helper()
	st, err := migrations.GetStatus(context.Background(), pool, schema)
	if err != nil {
		t.Fatalf("status of %s: %v", schema, err)
	}
	return st.Current
}

// sameSchema fails unless schema holds what a schema migrated to the same
// version without a crash holds (ref, migrated there now).
func sameSchema(t *testing.T, pool *pgxpool.Pool, schema, ref string) {
	t.Helper()
	v := schemaVersion(t, pool, schema)
	if v == 0 {
		// Not even the first migration committed: the schema may exist,
		// with tern's version table, and nothing else.
		left := mustInts(t, pool, `SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname = $1 AND c.relname NOT IN ('schema_version')`, schema)
		if left[0] != 0 {
			t.Fatalf("%s is at version 0 but holds %d relations", schema, left[0])
		}
		return
	}
	if err := migrations.MigrateWith(context.Background(), pool, migrations.Options{Schema: ref, TargetVersion: v}); err != nil {
		t.Fatalf("migrate the reference %s to %d: %v", ref, v, err)
	}
	got, want := schemaFingerprint(t, pool, schema), schemaFingerprint(t, pool, ref)
	if got != want {
		t.Fatalf("%s at version %d differs from a schema migrated there without a crash:\n%s", schema, v, lineDiff(got, want))
	}
}

// lineDiff lists the lines only in a (-) and only in b (+).
func lineDiff(a, b string) string {
	in := func(s string) map[string]bool {
		m := map[string]bool{}
		for _, l := range strings.Split(s, "\n") {
			m[l] = true
		}
		return m
	}
	ma, mb := in(a), in(b)
	var out []string
	for l := range ma {
		if !mb[l] {
			out = append(out, "- "+l)
		}
	}
	for l := range mb {
		if !ma[l] {
			out = append(out, "+ "+l)
		}
	}
	return strings.Join(out, "\n")
}

// TestCrashMigrate: `outbox migrate` killed while it brings a new schema
// up (after random delays) and while it upgrades one from version 44 (held
// at 045, whose index waits for the test's lock on dead_letters). After
// each kill the schema is exactly what a migration to its recorded version
// makes, the migration lock is not left held, and migrate run again
// reaches the latest version, the same schema as one migrated without a
// crash.
func TestCrashMigrate(t *testing.T) {
	dbURL, pool := crashDB(t)
	const app = "outbox-migrate"
	migrate := func(schema string) []string {
		return []string{"migrate", "--database-url", dbURL, "--schema", schema}
	}

	// The upgrade, held at 045.
	if err := migrations.MigrateWith(context.Background(), pool, migrations.Options{Schema: "crash_up", TargetVersion: 44}); err != nil {
		t.Fatal(err)
	}
	release := holdTx(t, pool, `LOCK TABLE crash_up.dead_letters IN ROW EXCLUSIVE MODE`)
	o := startOp(t, "migrate-held", "", migrate("crash_up")...)
	waitLockWait(t, pool, o, app)
	o.killSettled(t, pool, app, release)
	if v := schemaVersion(t, pool, "crash_up"); v != 44 {
		t.Fatalf("the upgrade killed while 045 waited is at version %d, want 44", v)
	}
	sameSchema(t, pool, "crash_up", "crash_ref_up")

	// A new schema, killed at random points.
	rng := rand.New(rand.NewPCG(seedFor(t, 59), 2))
	for round := range 4 {
		o := startOp(t, fmt.Sprintf("migrate-%d", round), "", migrate("crash_new")...)
		// From its first session on (the process's start takes a while on
		// a busy machine): the whole migration takes about half a second.
		poll(t, 30*time.Second, "the migration's session", func() (bool, string) {
			v, err := queryInts(pool, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database()`, app)
			return o.exited() || err == nil && v[0] > 0, fmt.Sprint(err)
		})
		time.Sleep(time.Duration(rng.IntN(400)) * time.Millisecond)
		o.killSettled(t, pool, app, nil)
		t.Logf("round %d: killed at version %d", round, schemaVersion(t, pool, "crash_new"))
		sameSchema(t, pool, "crash_new", fmt.Sprintf("crash_ref_%d", round))
	}

	for _, schema := range []string{"crash_up", "crash_new"} {
		code, stdout, stderr := runOutbox(t, "", migrate(schema)...)
		if code != 0 || !strings.Contains(stdout, fmt.Sprintf("version %d of %d", migrations.Latest(), migrations.Latest())) {
			t.Fatalf("migrate %s again: exit %d\n%s\n%s", schema, code, stdout, stderr)
		}
		sameSchema(t, pool, schema, "crash_ref_latest")
	}
}

// forgeOldMonths gives the archive the months 2020-01 to 2020-<months>,
// each with perMonth cancelled instructions of participant old-p (keys
// old-k1..., sequence ids 1..), written as `outbox cancel` writes them
// (hashed, under their keys) but stamped in their month, and takes the
// checkpoints that cover them: months a detach can move, whose keys it
// retires. The archive's chain is made to begin before them. Without
// partitions, their rows are in the default partition; without
// checkpoint, the checkpoints are left to the test.
func forgeOldMonths(t *testing.T, dbURL string, pool *pgxpool.Pool, months, perMonth int, partitions, checkpoint bool) {
	t.Helper()
	ctx := context.Background()
	stmts := []string{`UPDATE outbox.settings SET chained_since = '2019-12-01 00:00Z'`}
	for m := 1; m <= months && partitions; m++ {
		stmts = append(stmts, fmt.Sprintf(`CREATE TABLE outbox.attempts_2020_%02d PARTITION OF outbox.attempts
			FOR VALUES FROM ('2020-%02d-01 00:00Z') TO ('2020-%02d-01 00:00Z')`, m, m, m+1))
	}
	stmts = append(stmts, fmt.Sprintf(`
		WITH g AS (
		  SELECT g, ('00000000-0000-7000-8000-' || lpad(to_hex(g), 12, '0'))::uuid AS oid, gen_random_uuid() AS aid,
		         make_timestamptz(2020, 1 + (g - 1) / %[1]d, 10, 0, 0, 0, 'UTC') + g * interval '1 second' AS at,
		         '{"currency": "USD", "destination": "acct-1", "amount_minor": 100}'::jsonb AS payload
		  FROM generate_series(1, %[1]d * %[2]d) g
		), k AS (
		  INSERT INTO outbox.idempotency_keys (instruction_id, idempotency_key, outbox_id, participant_id, sequence_id, payload_hash, created_at)
		  SELECT 'old-' || g, 'old-k' || g, oid, 'old-p', g, sha256(payload::text::bytea), at FROM g
		)
		INSERT INTO outbox.attempts (attempt_id, outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
		  tenant_id, correlation_id, payload, attempt_no, state, relayer_id, claimed_at, completed_at, error_message, created_at, hash)
		SELECT aid, oid, 'old-' || g, 'old-p', g, 'old-k' || g, 'sandbox', '', '', payload, 1, 'CANCELLED', 'forged', at, at,
		  'cancelled by forged: old', at + interval '1 ms',
		  outbox.attempt_hash(NULL, aid, oid, 'old-' || g, 'old-p', g::bigint, 'old-k' || g, 'sandbox', '', '', payload, 1,
		    'CANCELLED', 'forged', NULL, at, at, NULL, NULL, NULL, NULL, 'cancelled by forged: old', NULL, false, at + interval '1 ms')
		FROM g`, perMonth, months),
		fmt.Sprintf(`INSERT INTO outbox.sequences (participant_id, next_sequence_id, queued) VALUES ('old-p', %d, 0)`, months*perMonth+1))
	for _, s := range stmts {
		if _, err := pool.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	if !checkpoint {
		return
	}
	time.Sleep(5 * time.Millisecond) // the checkpoint's period ends before now
	if code, stdout, stderr := runOutbox(t, "", "audit", "--database-url", dbURL, "--settle", "1ms", "checkpoint"); code != 0 {
		t.Fatalf("checkpoint: exit %d\n%s\n%s", code, stdout, stderr)
	}
	verifyNow(t, pool, "with the forged months")
}

// archiveParents maps each of the archive's 2020 months to the table it
// is a partition of (attempts or attempts_detached).
func archiveParents(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	var s string
	if err := pool.QueryRow(context.Background(), `SELECT string_agg(c.relname || '<' || p.relname, ' ' ORDER BY c.relname)
		FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent
		WHERE c.relname LIKE 'attempts_2020_%' AND c.relkind = 'r'`).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestCrashArchiveDetach: `outbox archive detach` killed while the
// second of three months waits for its lock (the first moved, the others
// not, no key retired yet), then in that month's move (taken out of
// attempts, not yet into attempts_detached), then while the key retirement waits for a
// transaction of the test's (the first month's digests committed, its
// keys still live beside them: an enqueue of one is refused as retired).
// Run again, it finishes: every month detached, every key retired once,
// each month's pass recorded once.
func TestCrashArchiveDetach(t *testing.T) {
	dbURL, pool := crashDB(t)
	const app, per = "outbox-audit", 200
	forgeOldMonths(t, dbURL, pool, 3, per, true, true)
	detach := []string{"archive", "--database-url", dbURL, "--before", "2020-04", "--detach-lock-timeout", "30s", "detach"}
	counts := func() []int64 {
		return mustInts(t, pool, `SELECT (SELECT count(*) FROM outbox.idempotency_keys WHERE participant_id = 'old-p'),
			(SELECT count(*) FROM outbox.retired_keys), (SELECT count(*) FROM outbox.key_retirements),
			(SELECT coalesce(sum(retired_keys), 0) FROM outbox.key_retirements)`)
	}

	release := holdTx(t, pool, `LOCK TABLE outbox.attempts_2020_02 IN ACCESS SHARE MODE`)
	o := startOp(t, "detach-held", "", detach...)
	waitLockWait(t, pool, o, app)
	o.killSettled(t, pool, app, release)
	if p := archiveParents(t, pool); p != "attempts_2020_01<attempts_detached attempts_2020_02<attempts attempts_2020_03<attempts" {
		t.Fatalf("detach killed at the second month: %s", p)
	}
	if c := counts(); c[0] != 3*per || c[1] != 0 || c[2] != 0 {
		t.Fatalf("detach killed before the keys' retirement: live keys, digests, passes: %v", c)
	}
	verifyNow(t, pool, "after detach was killed at the second month")

	// Again, held in the second month's move (its bounds, which the
	// statement let go on after the kill added, are there now): the move's
	// transaction waits to take it out of attempts.
	release = holdTx(t, pool, `LOCK TABLE outbox.attempts_2020_02 IN ACCESS SHARE MODE`)
	o = startOp(t, "detach-moving", "", detach...)
	waitFor(t, pool, o, "the move of the second month", `SELECT count(*) FROM pg_stat_activity
		WHERE application_name = $1 AND datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%DETACH PARTITION%'`, app)
	o.killSettled(t, pool, app, release)
	if p := archiveParents(t, pool); p != "attempts_2020_01<attempts_detached attempts_2020_02<attempts attempts_2020_03<attempts" {
		t.Fatalf("detach killed in the second month's move: %s", p)
	}
	verifyNow(t, pool, "after detach was killed in a month's move")

	release = holdTx(t, pool, `SELECT 1`)
	o = startOp(t, "detach-retiring", "", detach...)
	waitFor(t, pool, o, "the first month's digests", `SELECT count(*) FROM outbox.retired_keys`)
	o.killSettled(t, pool, app, release)
	if p := archiveParents(t, pool); p != "attempts_2020_01<attempts_detached attempts_2020_02<attempts_detached attempts_2020_03<attempts_detached" {
		t.Fatalf("detach killed in the retirement: %s", p)
	}
	if c := counts(); c[0] != 3*per || c[1] != per || c[2] != 0 {
		t.Fatalf("detach killed while the retirement waited: live keys, digests, passes: %v (want %d, %d, 0)", c, 3*per, per)
	}
	verifyNow(t, pool, "after detach was killed in the retirement")
	line := `{"instruction_id":"old-1","participant_id":"old-p","idempotency_key":"old-k1","rail":"sandbox","amount_minor":100,"currency":"USD","destination":"acct-1"}`
	if code, stdout, _ := runOutbox(t, line, "enqueue", "--database-url", dbURL); code != 1 || !strings.Contains(stdout, `"KEY_RETIRED"`) {
		t.Fatalf("enqueue of a key whose digest committed beside it: exit %d %s, want KEY_RETIRED", code, stdout)
	}

	// Again, killed after the first month's keys went (their digests were
	// committed above), before its pass was recorded: held by a
	// transaction of the test's that the pass waits for, then, once it
	// waits, by a lock on retired_keys its next statement waits for.
	release = holdTx(t, pool, `SELECT 1`)
	o = startOp(t, "detach-dropping", "", detach...)
	waitFor(t, pool, o, "the retirement to wait for the test's transaction", `SELECT count(*) FROM pg_stat_activity
		WHERE application_name = $1 AND datname = current_database() AND query LIKE '%virtualtransaction = ANY%'`, app)
	releaseKeys := holdTx(t, pool, `LOCK TABLE outbox.retired_keys IN SHARE MODE`)
	release()
	waitLockWait(t, pool, o, app)
	o.killSettled(t, pool, app, releaseKeys)
	if c := counts(); c[0] != 2*per || c[1] != per || c[2] != 0 {
		t.Fatalf("detach killed after the first month's keys went: live keys, digests, passes: %v (want %d, %d, 0)", c, 2*per, per)
	}
	verifyNow(t, pool, "after detach was killed after a month's keys went")

	type result struct {
		Detached    []string `json:"detached"`
		RetiredKeys int64    `json:"retired_keys"`
		OK          bool     `json:"ok"`
	}
	for i, want := range []int64{2 * per, 0} {
		code, stdout, stderr := runOutbox(t, "", detach...)
		var r result
		if code != 0 || json.Unmarshal([]byte(stdout), &r) != nil || !r.OK || len(r.Detached) != 0 || r.RetiredKeys != want {
			t.Fatalf("detach run again (%d): exit %d\n%s\n%s\nwant nothing left to move and %d keys retired", i, code, stdout, stderr, want)
		}
	}
	// Each month's pass counts the keys it retired, also those a run cut
	// short had retired: `archive list` shows them.
	if c := counts(); c[0] != 0 || c[1] != 3*per || c[2] != 3 || c[3] != 3*per {
		t.Fatalf("after the detach finished: live keys, digests, passes, keys the passes count: %v (want 0, %d, 3, %d)", c, 3*per, 3*per)
	}
	verifyNow(t, pool, "after detach finished")
	if v := mustInts(t, pool, `SELECT count(*) FROM outbox.pending`); v[0] != 0 {
		t.Fatalf("%d instructions pending: the refused enqueue wrote one", v[0])
	}
}

// readPair reads an export and its checksum file ("" for one absent).
func readPair(t *testing.T, out string) (data, sum string) {
	t.Helper()
	read := func(p string) string {
		b, err := os.ReadFile(p)
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		return string(b)
	}
	return read(out), read(out + ".sha256")
}

// checkPair fails if the checksum file beside an export is not the
// export's own.
func checkPair(t *testing.T, out, when string) (data, sum string) {
	t.Helper()
	data, sum = readPair(t, out)
	h := sha256.Sum256([]byte(data))
	if sum != "" && sum != hex.EncodeToString(h[:])+"  "+filepath.Base(out)+"\n" {
		t.Fatalf("%s: the checksum file %q is not the export's (%d bytes)", when, sum, len(data))
	}
	return data, sum
}

// TestCrashArchiveExport: `outbox archive export` to a file that holds an
// earlier export, killed while its query waits for the test's lock on the
// month, and (under strace, which kills it at a system call) just before
// it removes the earlier checksum, before it renames the export over the
// earlier one, and before it renames the checksum: the file holds the
// earlier export or the new one, whole, and a checksum beside it is
// always its own (at worst it has none until a re-run). Run again, it
// writes the export and its checksum. Needs strace for the three
// system-call points (OUTBOX_REQUIRE_STRACE=1 makes its absence a
// failure).
func TestCrashArchiveExport(t *testing.T) {
	dbURL, pool := crashDB(t)
	const app = "outbox-audit"
	forgeOldMonths(t, dbURL, pool, 1, 2000, true, true)
	out := filepath.Join(t.TempDir(), "month.csv")
	exportOf := func(partition string) []string {
		return []string{"archive", "--database-url", dbURL, "--partition", partition, "--out", out, "export"}
	}
	// The earlier export at --out: this month's (no rows), so that the
	// earlier and the new export differ.
	current := "attempts_" + dbNow(t, pool).UTC().Format("2006_01")
	if code, stdout, stderr := runOutbox(t, "", exportOf(current)...); code != 0 {
		t.Fatalf("the earlier export: exit %d\n%s\n%s", code, stdout, stderr)
	}
	earlier, earlierSum := checkPair(t, out, "the earlier export")
	export := exportOf("attempts_2020_01")

	release := holdTx(t, pool, `LOCK TABLE outbox.attempts_2020_01 IN ACCESS EXCLUSIVE MODE`)
	o := startOp(t, "export-held", "", export...)
	waitLockWait(t, pool, o, app)
	o.killSettled(t, pool, app, release)
	if d, s := checkPair(t, out, "killed while its query waited"); d != earlier || s != earlierSum {
		t.Fatalf("an export killed while its query waited changed the earlier one: %d bytes, checksum %q", len(d), s)
	}

	var states []string // what each kill under strace left: the data
	strace, err := exec.LookPath("strace")
	switch {
	case err == nil:
		for _, point := range []struct{ path, calls, what string }{
			{out + ".sha256", "unlink,unlinkat", "the earlier checksum's removal"},
			{out, "rename,renameat,renameat2", "the export's rename"},
			{out + ".sha256", "rename,renameat,renameat2", "the checksum's rename"},
		} {
			cmd := exec.Command(strace, append([]string{"-f", "-qq", "-o", os.DevNull, "-P", point.path,
				"-e", "trace=" + point.calls, "-e", "inject=" + point.calls + ":signal=KILL", "--", outboxBin}, export...)...)
			cmd.Env = childEnv()
			output, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the export under strace was not killed at %s:\n%s", point.what, output)
			}
			d, s := checkPair(t, out, "killed at "+point.what)
			if point.what == "the earlier checksum's removal" && (d != earlier || s != earlierSum) {
				t.Fatalf("killed before %s, the earlier export changed (%d bytes, checksum %q)", point.what, len(d), s)
			}
			states = append(states, d)
		}
	case os.Getenv("OUTBOX_REQUIRE_STRACE") != "":
		t.Fatal("strace is required (OUTBOX_REQUIRE_STRACE) but not found")
	default:
		t.Log("strace not found: the kills at the export's system calls are skipped")
	}

	code, stdout, stderr := runOutbox(t, "", export...)
	if code != 0 {
		t.Fatalf("export run again: exit %d\n%s\n%s", code, stdout, stderr)
	}
	data, sum := checkPair(t, out, "the export run again")
	if sum == "" || data == earlier || strings.Count(data, "\n") != 2001 {
		t.Fatalf("the export run again: %d lines, checksum %q", strings.Count(data, "\n"), sum)
	}
	for i, d := range states {
		if d != earlier && d != data {
			t.Fatalf("kill %d left a file that is neither the earlier export nor the new one, whole (%d bytes)", i, len(d))
		}
	}
	// A killed export leaves its temporary files (docs/operations.md): hidden, never at --out.
	entries, err := os.ReadDir(filepath.Dir(out))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if n := e.Name(); n != "month.csv" && n != "month.csv.sha256" && !(strings.HasPrefix(n, ".month.csv.") && strings.HasSuffix(n, ".tmp")) {
			t.Fatalf("beside the export: %s", n)
		}
	}
}

// enqueuedIDs enqueues lines k-from..k-to-1 of enqueueInput through
// `outbox enqueue` and returns their outbox ids.
func enqueuedIDs(t *testing.T, dbURL string, from, to int) []string {
	t.Helper()
	lines := strings.Split(enqueueInput(to), "\n")[from:to]
	code, stdout, stderr := runOutbox(t, strings.Join(lines, "\n")+"\n", "enqueue", "--database-url", dbURL)
	if code != 0 {
		t.Fatalf("enqueue: exit %d\n%s\n%s", code, stdout, stderr)
	}
	var ids []string
	for _, r := range decodeReceipts(t, strings.Split(strings.TrimSuffix(stdout, "\n"), "\n")) {
		ids = append(ids, r.OutboxID)
	}
	return ids
}

// deadLetter makes the pending instructions ids dead letters: claimed by
// relayer crash-test, failed RAIL_REJECTED.
func deadLetter(t *testing.T, pool *pgxpool.Pool, ids []string) {
	t.Helper()
	ctx := context.Background()
	st, err := store.New("")
	if err != nil {
		t.Fatal(err)
	}
	claimed, err := st.Claim(ctx, pool, store.ClaimParams{RelayerID: "crash-test", Limit: len(ids), Leases: map[string]time.Duration{"sandbox": time.Hour}})
	if err != nil || len(claimed) != len(ids) {
		t.Fatalf("claim: %d claimed, %v (want %d)", len(claimed), err, len(ids))
	}
	outcomes := make([]store.Outcome, len(claimed))
	for i, c := range claimed {
		attempt, _ := uuid.NewV7()
		outcomes[i] = store.Outcome{Identity: c.Identity, AttemptID: attempt, ClaimAttemptID: c.AttemptID, AttemptNo: c.AttemptNo,
			RelayerID: "crash-test", ClaimedAt: c.ClaimedAt, State: store.Failed, ErrorCode: "RAIL_REJECTED", CountAttempt: true}
	}
	if _, _, err := st.Record(ctx, pool, outcomes, store.HandoffParams{}); err != nil {
		t.Fatal(err)
	}
}

// actionOutput is one line of dlq replay or ack, or cancel.
type actionOutput struct {
	OutboxID string `json:"outbox_id"`
	Done     bool   `json:"done"`
}

// crashAction runs an operator action on four ids, holds it at the third
// (whose row lock the test holds with lockSQL), kills it there and lets
// the third's statement go on: the first two are done once, the third
// once or not at all, the fourth not (rows counts the archive rows of the
// action's state an id has). Run again, it does what was not done (the
// rest are reported not done: exit status 1), and each id has one row of
// the action.
func crashAction(t *testing.T, pool *pgxpool.Pool, name, app, lockSQL, state string, args, ids []string) {
	t.Helper()
	rows := func(id string) int64 {
		return mustInts(t, pool, `SELECT count(*) FROM outbox.attempts WHERE outbox_id = $1 AND state = $2`, id, state)[0]
	}
	release := holdTx(t, pool, lockSQL, ids[2])
	o := startOp(t, name, "", append(args, ids...)...)
	waitLockWait(t, pool, o, app)
	o.killSettled(t, pool, app, release)
	lines := o.lines(t)
	if len(lines) != 2 {
		t.Fatalf("%s killed at the third id printed %d lines, want the two done:\n%s", name, len(lines), strings.Join(lines, "\n"))
	}
	done := make([]bool, len(ids))
	for i, id := range ids {
		n := rows(id)
		if i < 2 {
			var l actionOutput
			if err := json.Unmarshal([]byte(lines[i]), &l); err != nil || l.OutboxID != id || !l.Done {
				t.Fatalf("%s: line %d %q, want %s done", name, i, lines[i], id)
			}
		}
		if n > 1 || i < 2 && n != 1 || i == 3 && n != 0 {
			t.Fatalf("%s killed at the third id: id %d has %d %s rows", name, i, n, state)
		}
		done[i] = n == 1
	}
	verifyNow(t, pool, name+" killed")

	code, stdout, stderr := runOutbox(t, "", append(args, ids...)...)
	if code != 1 {
		t.Fatalf("%s run again: exit %d, want 1 (the ids done before are not actionable any more)\n%s\n%s", name, code, stdout, stderr)
	}
	for i, line := range strings.Split(strings.TrimSuffix(stdout, "\n"), "\n") {
		var l actionOutput
		if err := json.Unmarshal([]byte(line), &l); err != nil || l.OutboxID != ids[i] || l.Done == done[i] {
			t.Fatalf("%s run again: line %d %q, want done %v", name, i, line, !done[i])
		}
	}
	for _, id := range ids {
		if n := rows(id); n != 1 {
			t.Fatalf("%s run again: %s has %d %s rows, want 1", name, id, n, state)
		}
	}
	verifyNow(t, pool, name+" run again")
}

// TestCrashOperatorActions: `outbox dlq replay`, `dlq ack` and `cancel`
// of four ids, each killed while the third waits for its row's lock, and
// `rails pause` killed while it waits for the rail to go quiet (the pause
// committed, its line not printed yet) and `rails resume` killed while it
// waits for the pause's lock: the actions done before the kill are in the
// archive once, the one under way not at all, and the same command run
// again does the rest, none twice.
func TestCrashOperatorActions(t *testing.T) {
	dbURL, pool := crashDB(t)
	dead := enqueuedIDs(t, dbURL, 0, 8)
	deadLetter(t, pool, dead)
	toCancel := enqueuedIDs(t, dbURL, 8, 12)
	dlq := func(action string) []string {
		return []string{"dlq", "--database-url", dbURL, "--operator", "crash-test", "--reason", "crash test", action}
	}
	const lockDeadLetter = `SELECT 1 FROM outbox.dead_letters WHERE outbox_id = $1 FOR UPDATE`
	crashAction(t, pool, "dlq-replay", "outbox-dlq", lockDeadLetter, "REPLAYED", dlq("replay"), dead[:4])
	crashAction(t, pool, "dlq-ack", "outbox-dlq", lockDeadLetter, "ACKNOWLEDGED", dlq("ack"), dead[4:])
	crashAction(t, pool, "cancel", "outbox-cancel", `SELECT 1 FROM outbox.pending WHERE outbox_id = $1 FOR UPDATE`, "CANCELLED",
		[]string{"cancel", "--database-url", dbURL, "--operator", "crash-test", "--reason", "crash test"}, toCancel)

	const app = "outbox-rails"
	rails := func(action string, extra ...string) []string {
		return append([]string{"rails", "--database-url", dbURL, "--operator", "crash-test", "--reason", "crash test"}, append(extra, action, "sandbox")...)
	}
	events := func() string {
		var s string
		if err := pool.QueryRow(context.Background(), `SELECT coalesce(string_agg(action, ' ' ORDER BY at), '') FROM outbox.rail_pause_events`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	// A transaction that read the queue before the pause: the pause waits
	// for it to end.
	release := holdTx(t, pool, `SELECT count(*) FROM outbox.pending`)
	o := startOp(t, "rails-pause", "", rails("pause", "--wait", "30s")...)
	waitFor(t, pool, o, "the pause", `SELECT count(*) FROM outbox.rail_pauses`)
	time.Sleep(200 * time.Millisecond) // in its wait
	if o.exited() {
		t.Fatalf("the pause did not wait:\n%s", o.tail(20))
	}
	o.killSettled(t, pool, app, release)
	if e := events(); e != "PAUSED" {
		t.Fatalf("rails pause killed in its wait: events %q, want one PAUSED", e)
	}
	if code, stdout, stderr := runOutbox(t, "", rails("pause", "--wait", "30s")...); code != 0 || !strings.Contains(stdout, `"done":false`) || !strings.Contains(stdout, `"quiet":true`) {
		t.Fatalf("rails pause run again: exit %d\n%s\n%s\nwant already paused, quiet", code, stdout, stderr)
	}
	release = holdTx(t, pool, `SELECT 1 FROM outbox.rail_pauses WHERE rail_type = 'sandbox' FOR UPDATE`)
	o = startOp(t, "rails-resume", "", rails("resume")...)
	waitLockWait(t, pool, o, app)
	o.killSettled(t, pool, app, release)
	e, v := events(), mustInts(t, pool, `SELECT count(*) FROM outbox.rail_pauses`)
	if !(e == "PAUSED" && v[0] == 1 || e == "PAUSED RESUMED" && v[0] == 0) {
		t.Fatalf("rails resume killed at the pause's lock: events %q, %d pauses in force", e, v[0])
	}
	want := []int{0, 1} // resumed by the run again, then not paused
	if e == "PAUSED RESUMED" {
		want = want[1:]
	}
	for i, want := range want {
		if code, stdout, stderr := runOutbox(t, "", rails("resume")...); code != want {
			t.Fatalf("rails resume run again (%d): exit %d, want %d\n%s\n%s", i, code, want, stdout, stderr)
		}
	}
	if e := events(); e != "PAUSED RESUMED" {
		t.Fatalf("after the resume ran again: events %q, want PAUSED RESUMED", e)
	}
	verifyNow(t, pool, "after the operator actions")

	// A long cancel killed at random points: every line printed done is
	// cancelled, nothing twice, and a run again cancels the rest.
	many := enqueuedIDs(t, dbURL, 12, 212)
	cancel := append([]string{"cancel", "--database-url", dbURL, "--operator", "crash-test", "--reason", "crash test"}, many...)
	cancelled := func() map[string]int64 {
		rows, err := pool.Query(context.Background(), `SELECT outbox_id::text, count(*) FROM outbox.attempts
			WHERE state = 'CANCELLED' AND outbox_id = ANY ($1::uuid[]) GROUP BY outbox_id`, many)
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]int64{}
		for rows.Next() {
			var id string
			var n int64
			if err := rows.Scan(&id, &n); err != nil {
				t.Fatal(err)
			}
			m[id] = n
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return m
	}
	rng := rand.New(rand.NewPCG(seedFor(t, 60), 3))
	for round := range 2 {
		o := startOp(t, fmt.Sprintf("cancel-%d", round), "", cancel...)
		poll(t, 30*time.Second, "the cancel's session", func() (bool, string) {
			v, err := queryInts(pool, `SELECT count(*) FROM pg_stat_activity WHERE application_name = 'outbox-cancel' AND datname = current_database()`)
			return o.exited() || err == nil && v[0] > 0, fmt.Sprint(err)
		})
		time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond)
		o.killSettled(t, pool, "outbox-cancel", nil)
		done := cancelled()
		for _, line := range o.lines(t) {
			var l actionOutput
			if err := json.Unmarshal([]byte(line), &l); err != nil {
				t.Fatalf("cancel line %q: %v", line, err)
			}
			if l.Done && done[l.OutboxID] != 1 {
				t.Fatalf("cancel printed %s done, but it has %d CANCELLED rows", l.OutboxID, done[l.OutboxID])
			}
		}
		for id, n := range done {
			if n != 1 {
				t.Fatalf("%s has %d CANCELLED rows", id, n)
			}
		}
		t.Logf("round %d: killed with %d of %d cancelled", round, len(done), len(many))
		verifyNow(t, pool, fmt.Sprintf("after cancel was killed (round %d)", round))
	}
	if code, stdout, stderr := runOutbox(t, "", cancel...); code != 0 && code != 1 {
		t.Fatalf("cancel run again: exit %d\n%s\n%s", code, stdout, stderr)
	}
	if done := cancelled(); len(done) != len(many) {
		t.Fatalf("cancel run again: %d of %d cancelled", len(done), len(many))
	} else {
		for id, n := range done {
			if n != 1 {
				t.Fatalf("%s has %d CANCELLED rows", id, n)
			}
		}
	}
	verifyNow(t, pool, "after the long cancel ran again")
}

// TestCrashArchiveMoveDefault: `outbox archive move-default`, two months
// in the default partition, killed while its transaction waits to attach
// the first month's new partition (its rows copied in the transaction):
// nothing moved, no partition made. Run again, it moves both months whole,
// the archive verifying as before.
func TestCrashArchiveMoveDefault(t *testing.T) {
	dbURL, pool := crashDB(t)
	const app, per = "outbox-audit", 300
	forgeOldMonths(t, dbURL, pool, 2, per, false, true)
	move := []string{"archive", "--database-url", dbURL, "--detach-lock-timeout", "30s", "move-default"}
	where := func() []int64 {
		return mustInts(t, pool, `SELECT (SELECT count(*) FROM outbox.attempts_default),
			(SELECT count(*) FROM pg_class WHERE relname LIKE 'attempts_2020_%' AND relkind = 'r'),
			(SELECT count(*) FROM outbox.attempts WHERE participant_id = 'old-p')`)
	}
	release := holdTx(t, pool, `LOCK TABLE ONLY outbox.attempts IN SHARE UPDATE EXCLUSIVE MODE`)
	o := startOp(t, "move-default", "", move...)
	waitLockWait(t, pool, o, app)
	o.killSettled(t, pool, app, release)
	if w := where(); w[0] != 2*per || w[1] != 0 || w[2] != 2*per {
		t.Fatalf("move-default killed in its transaction: %d rows in the default partition, %d months made, %d rows; want %d, 0, %d",
			w[0], w[1], w[2], 2*per, 2*per)
	}
	verifyNow(t, pool, "after move-default was killed")

	type month struct {
		Partition string `json:"partition"`
		Rows      int64  `json:"rows"`
	}
	var r struct {
		Moved []month `json:"moved"`
		OK    bool    `json:"ok"`
	}
	code, stdout, stderr := runOutbox(t, "", move...)
	if code != 0 || json.Unmarshal([]byte(stdout), &r) != nil || !r.OK || len(r.Moved) != 2 || r.Moved[0].Rows != per || r.Moved[1].Rows != per {
		t.Fatalf("move-default run again: exit %d\n%s\n%s", code, stdout, stderr)
	}
	if w := where(); w[0] != 0 || w[1] != 2 || w[2] != 2*per {
		t.Fatalf("after move-default: %d rows in the default partition, %d months made, %d rows", w[0], w[1], w[2])
	}
	verifyNow(t, pool, "after move-default ran again")
}

// TestCrashAuditCheckpoint: `outbox audit checkpoint` killed at random
// points of a backlog (a checkpoint a month since 2019-12, each its own
// statement), and while the checkpoint waits for a transaction that was
// running when it began (the test's, which then ends: the checkpoint's
// statement goes on and commits or not, whole). The archive verifies
// after each kill, and the command run again takes the next checkpoints,
// chained to the last, covering every archive row once.
func TestCrashAuditCheckpoint(t *testing.T) {
	dbURL, pool := crashDB(t)
	const app = "outbox-audit"
	forgeOldMonths(t, dbURL, pool, 2, 100, true, false)
	// A longer backlog: a checkpoint for every month since 2000.
	if _, err := pool.Exec(context.Background(), `UPDATE outbox.settings SET chained_since = '2000-01-01 00:00Z'`); err != nil {
		t.Fatal(err)
	}
	backlog := []string{"audit", "--database-url", dbURL, "--settle", "1ms", "checkpoint"}
	rng := rand.New(rand.NewPCG(seedFor(t, 61), 4))
	for round := range 3 {
		o := startOp(t, fmt.Sprintf("checkpoint-backlog-%d", round), "", backlog...)
		poll(t, 30*time.Second, "the checkpoint's session", func() (bool, string) {
			v, err := queryInts(pool, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database()`, app)
			return o.exited() || err == nil && v[0] > 0, fmt.Sprint(err)
		})
		time.Sleep(time.Duration(rng.IntN(100)) * time.Millisecond)
		o.killSettled(t, pool, app, nil)
		t.Logf("round %d: killed with %d checkpoints taken", round, mustInts(t, pool, `SELECT count(*) FROM outbox.checkpoints`)[0])
		verifyNow(t, pool, fmt.Sprintf("after checkpoint was killed in a backlog (round %d)", round))
	}
	ids := enqueuedIDs(t, dbURL, 0, 5)
	if code, stdout, stderr := runOutbox(t, "", append([]string{"cancel", "--database-url", dbURL, "--reason", "crash test"}, ids...)...); code != 0 {
		t.Fatalf("cancel: exit %d\n%s\n%s", code, stdout, stderr)
	}
	time.Sleep(5 * time.Millisecond)
	checkpoint := []string{"audit", "--database-url", dbURL, "--settle", "1ms", "checkpoint"}
	// A transaction with an id and a lock on the archive, as a writer of
	// it has: a checkpoint waits for it.
	release := holdTx(t, pool, `SELECT pg_current_xact_id(), (SELECT count(*) FROM outbox.attempts)`)
	o := startOp(t, "checkpoint", "", checkpoint...)
	waitFor(t, pool, o, "the checkpoint to wait", `SELECT count(*) FROM pg_stat_activity
		WHERE application_name = $1 AND datname = current_database() AND state = 'active'
		  AND query LIKE '%take_checkpoint%' AND now() - query_start > interval '200 milliseconds'`, app)
	o.killSettled(t, pool, app, release)
	verifyNow(t, pool, "after checkpoint was killed")
	taken := mustInts(t, pool, `SELECT count(*) FROM outbox.checkpoints`)[0]

	// The archive's next rows, and the checkpoint run again.
	more := enqueuedIDs(t, dbURL, 5, 6)
	if code, stdout, stderr := runOutbox(t, "", "cancel", "--database-url", dbURL, "--reason", "crash test", more[0]); code != 0 {
		t.Fatalf("cancel: exit %d\n%s\n%s", code, stdout, stderr)
	}
	time.Sleep(5 * time.Millisecond)
	if code, stdout, stderr := runOutbox(t, "", checkpoint...); code != 0 || stdout == "" {
		t.Fatalf("checkpoint run again: exit %d\n%s\n%s", code, stdout, stderr)
	}
	v := mustInts(t, pool, `SELECT count(*),
		(SELECT count(*) FROM outbox.attempts WHERE created_at >= (SELECT min(period_start) FROM outbox.checkpoints)
		   AND created_at < (SELECT max(period_end) FROM outbox.checkpoints)),
		sum(row_count) FROM outbox.checkpoints`)
	if v[0] <= taken || v[1] != 206 || v[2] != 206 {
		t.Fatalf("after checkpoint ran again: %d checkpoints (%d before), covering %d archive rows and counting %d; want more, 206 and 206", v[0], taken, v[1], v[2])
	}
	verifyNow(t, pool, "after checkpoint ran again")
}
