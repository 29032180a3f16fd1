package migrations_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/migrations"
)

func TestMain(m *testing.M) { testdb.Main(m) }

type testBundle struct {
	ctx  context.Context
	pool *pgxpool.Pool
	url  string
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	url := testdb.URL(t)
	pool, err := pgxpool.New(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return &testBundle{ctx: t.Context(), pool: pool, url: url}
}

func TestConcurrentMigratorsEndAtLatest(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const migrators = 8
	var wg sync.WaitGroup
	errs := make([]error, migrators)
	start := make(chan struct{})
	for i := range migrators {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Each migrator is its own "process": its own pool.
			pool, err := pgxpool.New(b.ctx, b.url)
			if err != nil {
				errs[i] = err
				return
			}
			defer pool.Close()
			<-start
			errs[i] = migrations.MigrateWith(b.ctx, pool, migrations.Options{Schema: "fresh_schema"})
		}()
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("migrator %d: %v", i, err)
		}
	}
	st, err := migrations.GetStatus(b.ctx, b.pool, "fresh_schema")
	if err != nil {
		t.Fatal(err)
	}
	if st.Current != migrations.Latest() || st.Latest < 1 {
		t.Fatalf("status = %+v, want current = latest", st)
	}
	var tables int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = 'fresh_schema'
		AND tablename IN ('sequences','idempotency_keys','pending','inflight','attempts','dead_letters','relayer_idle')`).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if tables != 7 {
		t.Fatalf("found %d of the 7 tables in fresh_schema", tables)
	}
	// Migrating again is a no-op.
	if err := migrations.MigrateWith(b.ctx, b.pool, migrations.Options{Schema: "fresh_schema"}); err != nil {
		t.Fatal(err)
	}
}

func TestInvalidSchemaRejected(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"Outbox", "out-box", "1x", "a;drop table x", `"q"`,
		"select", "user", "table", "order", "public", "information_schema", "pg_catalog", "pg_temp", "pg_x"} {
		if err := migrations.ValidateSchema(s); !errors.Is(err, migrations.ErrInvalidSchema) {
			t.Errorf("ValidateSchema(%q) = %v", s, err)
		}
	}
	if err := migrations.ValidateSchema(""); err != nil {
		t.Errorf("empty schema (the default) rejected: %v", err)
	}
}

// TestSchemaKeywordsMatchServer checks the keyword list against the server
// the tests run on: every word that is not unreserved there must be
// refused (a newer server knowing more keywords fails this test), and a
// name that is refused only for being a keyword must really be one.
func TestSchemaKeywordsMatchServer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rows, err := b.pool.Query(b.ctx, `SELECT word, catcode FROM pg_get_keywords()`)
	if err != nil {
		t.Fatal(err)
	}
	words, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct {
		Word, Cat string
	}])
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range words {
		err := migrations.ValidateSchema(w.Word)
		if w.Cat != "U" && !errors.Is(err, migrations.ErrInvalidSchema) {
			t.Errorf("keyword %q (category %s) accepted as a schema name", w.Word, w.Cat)
		}
		if w.Cat == "U" && err != nil {
			t.Errorf("unreserved keyword %q refused: %v", w.Word, err)
		}
	}
}

// TestUnreservedKeywordSchemaMigrates: names next to the refused ones work
// end to end (an unreserved keyword, a name containing a reserved one).
func TestUnreservedKeywordSchemaMigrates(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, schema := range []string{"action", "select_x"} {
		if err := migrations.MigrateWith(b.ctx, b.pool, migrations.Options{Schema: schema}); err != nil {
			t.Fatalf("migrate %q: %v", schema, err)
		}
		if st, err := migrations.GetStatus(b.ctx, b.pool, schema); err != nil || st.Current != st.Latest {
			t.Fatalf("status of %q = %+v, %v", schema, st, err)
		}
	}
}

func TestStatusOfUnmigratedSchema(t *testing.T) {
	t.Parallel()
	b := setup(t)
	st, err := migrations.GetStatus(b.ctx, b.pool, "never_migrated")
	if err != nil || st.Current != 0 {
		t.Fatalf("status = %+v, %v", st, err)
	}
}

const insertAttempt = `INSERT INTO outbox.attempts (outbox_id, instruction_id, participant_id, sequence_id,
	idempotency_key, rail_type, attempt_no, state, claimed_at)
	VALUES ('01900000-0000-7000-8000-000000000001', 'i', 'p', 1, 'k', 'sandbox', 1, 'DISPATCHING', now())`

func TestAttemptsAreAppendOnly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.pool.Exec(b.ctx, insertAttempt); err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{
		`UPDATE outbox.attempts SET state = 'DISPATCHED'`,
		`DELETE FROM outbox.attempts`,
		`TRUNCATE outbox.attempts`,
		// Through a partition directly: still rejected.
		`DELETE FROM outbox.` + currentPartition(),
		`UPDATE outbox.` + currentPartition() + ` SET error_code = 'x'`,
		`TRUNCATE outbox.` + currentPartition(),
		`TRUNCATE outbox.attempts_default`,
	} {
		_, err := b.pool.Exec(b.ctx, stmt)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
			t.Errorf("%s: err = %v, want insufficient_privilege", stmt, err)
		}
	}
	var n int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox.attempts WHERE state = 'DISPATCHING'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("attempt rows = %d, %v; want the one row untouched", n, err)
	}
}

func currentPartition() string {
	return "attempts_" + time.Now().UTC().Format("2006_01")
}

func TestAttemptsLandInMonthlyPartition(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.pool.Exec(b.ctx, insertAttempt); err != nil {
		t.Fatal(err)
	}
	var part string
	if err := b.pool.QueryRow(b.ctx, `SELECT tableoid::regclass::text FROM outbox.attempts`).Scan(&part); err != nil {
		t.Fatal(err)
	}
	if part != "outbox."+currentPartition() {
		t.Fatalf("row landed in %s, want outbox.%s", part, currentPartition())
	}
}

// TestPartitionUpkeepSkipsBlockedMonth: when upkeep fell behind and the
// default partition already holds rows of a month, that month's partition
// cannot be created; the months after it still are, so new rows stop
// landing in the default partition. (Migration 001's version aborted the
// whole call on the blocked month.)
func TestPartitionUpkeepSkipsBlockedMonth(t *testing.T) {
	t.Parallel()
	b := setup(t)
	month := func(ahead int) time.Time {
		now := time.Now().UTC()
		return time.Date(now.Year(), now.Month()+time.Month(ahead), 1, 12, 0, 0, 0, time.UTC)
	}
	name := func(ahead int) string { return "attempts_" + month(ahead).Format("2006_01") }
	// Migrate created this month and the next 3; a row 5 months ahead goes
	// to the default partition.
	if _, err := b.pool.Exec(b.ctx, `INSERT INTO outbox.attempts (outbox_id, instruction_id, participant_id, sequence_id,
		idempotency_key, rail_type, attempt_no, state, claimed_at, created_at)
		VALUES (gen_random_uuid(), 'i', 'p', 1, 'k', 'sandbox', 1, 'DISPATCHING', $1, $1)`, month(5)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(b.ctx, `SELECT outbox.ensure_attempt_partitions(6)`); err != nil {
		t.Fatalf("partition upkeep failed on the blocked month: %v", err)
	}
	exists := func(ahead int) bool {
		var ok bool
		if err := b.pool.QueryRow(b.ctx, `SELECT to_regclass('outbox.' || $1) IS NOT NULL`, name(ahead)).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}
	for ahead, want := range map[int]bool{4: true, 5: false, 6: true} {
		if got := exists(ahead); got != want {
			t.Errorf("partition %s exists: %v, want %v", name(ahead), got, want)
		}
	}
}

// listen opens a LISTEN connection on the pending channel.
func (b *testBundle) listen(t *testing.T) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(b.ctx, b.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	if _, err := conn.Exec(b.ctx, "LISTEN "+migrations.NotifyChannel); err != nil {
		t.Fatal(err)
	}
	return conn
}

var seq int

func (b *testBundle) insertPending(t *testing.T) {
	t.Helper()
	seq++
	_, err := b.pool.Exec(b.ctx, `INSERT INTO outbox.pending (outbox_id, instruction_id, participant_id, sequence_id,
		idempotency_key, rail_type, payload) VALUES (gen_random_uuid(), 'i', 'p', $1, 'k', 'sandbox', '{}')`, seq)
	if err != nil {
		t.Fatal(err)
	}
}

// nextNotification returns the payload of the next notification. Silence
// is proven without clocks: the test sends its own sentinel after the
// insert, and notifications arrive in commit order, so if the sentinel comes
// first the insert notified nobody.
func nextNotification(t *testing.T, conn *pgx.Conn) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	n, err := conn.WaitForNotification(ctx)
	if err != nil {
		t.Fatalf("waiting for notification: %v", err)
	}
	return n.Payload
}

func (b *testBundle) sentinel(t *testing.T) {
	t.Helper()
	if _, err := b.pool.Exec(b.ctx, `SELECT pg_notify($1, 'sentinel')`, migrations.NotifyChannel); err != nil {
		t.Fatal(err)
	}
}

func TestNotifyTrigger(t *testing.T) {
	t.Parallel()
	b := setup(t)
	conn := b.listen(t)

	// No idle relayer: silent.
	b.insertPending(t)
	b.sentinel(t)
	if got := nextNotification(t, conn); got != "sentinel" {
		t.Fatalf("with no idle relayer the insert notified (%q)", got)
	}

	// A stale registration (a dead relayer): silent.
	if _, err := b.pool.Exec(b.ctx, `INSERT INTO outbox.relayer_idle VALUES ('dead', now() - interval '1 minute')`); err != nil {
		t.Fatal(err)
	}
	b.insertPending(t)
	b.sentinel(t)
	if got := nextNotification(t, conn); got != "sentinel" {
		t.Fatalf("with a stale registration the insert notified (%q)", got)
	}

	// A fresh registration: notified.
	if _, err := b.pool.Exec(b.ctx, `INSERT INTO outbox.relayer_idle VALUES ('idle-1', clock_timestamp())`); err != nil {
		t.Fatal(err)
	}
	b.insertPending(t)
	b.sentinel(t)
	if got := nextNotification(t, conn); got != "" {
		t.Fatalf("with an idle relayer the first notification is %q, want the trigger's", got)
	}
	if got := nextNotification(t, conn); got != "sentinel" {
		t.Fatalf("then %q, want the sentinel", got)
	}

	// Turned off: silent even with an idle relayer.
	if err := migrations.SetNotify(b.ctx, b.pool, "", false); err != nil {
		t.Fatal(err)
	}
	if on, err := migrations.NotifyEnabled(b.ctx, b.pool, ""); err != nil || on {
		t.Fatalf("NotifyEnabled = %v, %v after turning it off", on, err)
	}
	b.insertPending(t)
	b.sentinel(t)
	if got := nextNotification(t, conn); got != "sentinel" {
		t.Fatalf("with the trigger off the insert notified (%q)", got)
	}
	if err := migrations.SetNotify(b.ctx, b.pool, "", true); err != nil {
		t.Fatal(err)
	}
	b.insertPending(t)
	if got := nextNotification(t, conn); got != "" {
		t.Fatalf("after turning it back on: %q", got)
	}
}

// TestResumeRailWakesRelayers: resuming a paused rail notifies the
// relayers' channel (its instructions are due, and idle relayers would
// otherwise wait for their fallback poll); a pause, or a resume of a rail
// that was not paused, notifies nobody.
func TestResumeRailWakesRelayers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	conn := b.listen(t)
	for _, q := range []string{`SELECT outbox.pause_rail('sandbox', 'olga', 'maintenance')`,
		`SELECT outbox.resume_rail('event', 'olga', 'not paused')`} {
		if _, err := b.pool.Exec(b.ctx, q); err != nil {
			t.Fatal(err)
		}
		b.sentinel(t)
		if got := nextNotification(t, conn); got != "sentinel" {
			t.Fatalf("%s notified (%q)", q, got)
		}
	}
	if _, err := b.pool.Exec(b.ctx, `SELECT outbox.resume_rail('sandbox', 'olga', 'maintenance over')`); err != nil {
		t.Fatal(err)
	}
	if got := nextNotification(t, conn); got != "" {
		t.Fatalf("the resume's notification is %q, want the relayers' wake", got)
	}
}

// TestNoSingleSequenceAllocator: nothing in the schema hands out a
// sequence id without an instruction behind it (bump_sequence went in
// migration 4; allocate_sequences, which replaced bump_sequences in
// migration 5, and allocate_sequence, its one-participant form of
// migration 13, are only called by the enqueue statements, for the
// instructions they insert).
func TestNoSingleSequenceAllocator(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var single, old, batch bool
	if err := b.pool.QueryRow(b.ctx, `SELECT to_regprocedure('outbox.bump_sequence(text)') IS NOT NULL,
		to_regprocedure('outbox.bump_sequences(text[], int[])') IS NOT NULL,
		to_regprocedure('outbox.allocate_sequences(text[], int[])') IS NOT NULL`).Scan(&single, &old, &batch); err != nil {
		t.Fatal(err)
	}
	if single || old || !batch {
		t.Fatalf("bump_sequence present %v (want false), bump_sequences %v (want false), allocate_sequences %v (want true)", single, old, batch)
	}
}

// TestMigrateLockTimeoutNamesTheHolder: a session that holds the migration
// lock (another migrator, or a session a transaction pooler left with it)
// makes MigrateWith fail after the bound with a typed error naming that
// session, instead of hanging; once it lets go, migrating works.
func TestMigrateLockTimeoutNamesTheHolder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	holder := holdMigrationLock(t, b, "stuck-migrator")

	err := migrations.MigrateWith(b.ctx, b.pool, migrations.Options{LockTimeout: 200 * time.Millisecond})
	var lt *migrations.LockTimeoutError
	if !errors.As(err, &lt) {
		t.Fatalf("MigrateWith with the lock held: %v, want a *LockTimeoutError", err)
	}
	if len(lt.Holders) != 1 || lt.Holders[0].ApplicationName != "stuck-migrator" || lt.Holders[0].PID != int(holder.PgConn().PID()) {
		t.Fatalf("holders %+v, want the stuck-migrator session (pid %d)", lt.Holders, holder.PgConn().PID())
	}
	if !strings.Contains(err.Error(), "pg_terminate_backend") || !strings.HasPrefix(err.Error(), "migrate outbox: ") || lt.Op != "migrate" {
		t.Errorf("the error does not say what waited and what to do: %v", err)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "55P03" {
		t.Errorf("the error does not wrap the database's lock timeout: %v", err)
	}

	if _, err := holder.Exec(b.ctx, "SELECT pg_advisory_unlock(hashtext('outbox-migrate:outbox'))"); err != nil {
		t.Fatal(err)
	}
	if err := migrations.MigrateWith(b.ctx, b.pool, migrations.Options{LockTimeout: 5 * time.Second}); err != nil {
		t.Fatalf("after the holder let go: %v", err)
	}
	var lockTimeout string
	if err := b.pool.QueryRow(b.ctx, "SHOW lock_timeout").Scan(&lockTimeout); err != nil || lockTimeout != "0" {
		t.Errorf("the pool's sessions kept lock_timeout %q (%v)", lockTimeout, err)
	}
}

// holdMigrationLock connects a session named application (its
// application_name) that takes the migration lock of schema outbox and
// keeps it until it lets go or the test ends.
func holdMigrationLock(t *testing.T, b *testBundle, application string) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(b.url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["application_name"] = application
	holder, err := pgx.ConnectConfig(b.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Close(context.Background()) })
	if _, err := holder.Exec(b.ctx, "SELECT pg_advisory_lock(hashtext('outbox-migrate:outbox'))"); err != nil {
		t.Fatal(err)
	}
	return holder
}
