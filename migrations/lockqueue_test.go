package migrations_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/migrations"
	"github.com/ledgerline/outbox/pending"
)

// lockQueueFixture is a schema at version 38 with a producer's transaction
// open on it: an enqueue not committed yet, holding pending's ROW
// EXCLUSIVE lock, which migration 039 (a column added to pending) must
// wait for.
type lockQueueFixture struct {
	b        *testBundle
	schema   string
	producer *pending.Producer
}

func newLockQueueFixture(t *testing.T, b *testBundle, schema string) *lockQueueFixture {
	t.Helper()
	if err := migrations.MigrateWith(b.ctx, b.pool, migrations.Options{Schema: schema, TargetVersion: 38}); err != nil {
		t.Fatal(err)
	}
	producer, err := pending.NewProducer(pending.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	return &lockQueueFixture{b: b, schema: schema, producer: producer}
}

func (f *lockQueueFixture) enqueue(ctx context.Context, db pending.DBTX, key string) error {
	_, err := f.producer.Enqueue(ctx, db, pending.Instruction{
		InstructionID: "ins-" + key, ParticipantID: "p-" + key, IdempotencyKey: key,
		RailType: "sandbox", AmountMinor: 100, Currency: "USD", Destination: "acct-1",
	})
	return err
}

// newDefaultFixture is a fixture on the default schema, migrated for the
// test, with a producer of it.
func newDefaultFixture(t *testing.T, b *testBundle) *lockQueueFixture {
	t.Helper()
	producer, err := pending.NewProducer(pending.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return &lockQueueFixture{b: b, schema: "outbox", producer: producer}
}

// slowEnqueue begins a transaction on db and enqueues in it without
// committing: the producer's open transaction the tests wait behind
// (rolled back at the test's end unless the test commits it).
func (f *lockQueueFixture) slowEnqueue(t *testing.T, db *pgxpool.Pool) pgx.Tx {
	t.Helper()
	slow, err := db.Begin(f.b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = slow.Rollback(context.Background()) })
	if err := f.enqueue(f.b.ctx, slow, "slow"); err != nil {
		t.Fatal(err)
	}
	return slow
}

// enqueueWhileItWaits enqueues key with f while what (done gives its
// result) waits for the locks slow holds, and fails the test unless the
// enqueue completes within 20 s, a bound far above a try and far below the
// whole wait (what is asserted is that it does not wait for slow's end),
// with what still waiting; then it commits slow and wants what to succeed.
func enqueueWhileItWaits(t *testing.T, f *lockQueueFixture, key, what string, done <-chan error, slow pgx.Tx) {
	t.Helper()
	ctx, cancel := context.WithTimeout(f.b.ctx, 20*time.Second)
	defer cancel()
	if err := f.enqueue(ctx, f.b.pool, key); err != nil {
		t.Fatalf("an enqueue while %s waits for its locks: %v (the slow transaction is still open)", what, err)
	}
	select {
	case err := <-done:
		t.Fatalf("%s returned while the slow transaction held its tables: %v", what, err)
	default:
	}
	if err := slow.Commit(f.b.ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("%s once the slow transaction committed: %v", what, err)
	}
}

// namedPool is a pool whose sessions carry application_name, to find them
// in pg_stat_activity.
func namedPool(t *testing.T, b *testBundle, application string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(b.url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = application
	pool, err := pgxpool.NewWithConfig(b.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// superuserPool is a pool logged in as a superuser, as setupRoles's,
// whose sessions carry application_name.
func superuserPool(t *testing.T, b *testBundle, application string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(b.url)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := pgx.ParseConfig(testdb.AdminURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User, cfg.ConnConfig.Password = admin.User, admin.Password
	cfg.ConnConfig.RuntimeParams["application_name"] = application
	pool, err := pgxpool.NewWithConfig(b.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// waitForLockWait returns once a session named application waits for a
// lock, as db sees it (a session of another role shows its wait only to
// a superuser).
func waitForLockWait(t *testing.T, b *testBundle, db *pgxpool.Pool, application string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var waiting bool
		if err := db.QueryRow(b.ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE application_name = $1 AND wait_event_type = 'Lock')`, application).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no session %s waits for a lock", application)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestMigrateLetsEnqueuesThroughWhileItWaits: a migration that needs an
// exclusive lock on pending waits behind a producer's open transaction,
// and every enqueue that comes after queues behind that wait. Before the
// fix the migration waited in one go for the whole lock timeout (a minute
// by default): for that minute no producer could enqueue (a producer's own
// lock_timeout, 5 s by default, failed each enqueue), a payment outage
// caused by an upgrade that ends with the same migration failing. The
// migration must wait in short tries instead, letting the traffic queued
// behind each try through before the next: an enqueue made while the
// migration waits completes while the slow transaction is still open, and
// the migration is applied once that transaction ends.
func TestMigrateLetsEnqueuesThroughWhileItWaits(t *testing.T) {
	t.Parallel()
	b := setup(t)
	f := newLockQueueFixture(t, b, "lockq")
	slow := f.slowEnqueue(t, b.pool)

	migrator := namedPool(t, b, "lockq-migrate")
	done := make(chan error, 1)
	go func() {
		done <- migrations.MigrateWith(b.ctx, migrator, migrations.Options{Schema: f.schema, TargetVersion: 39})
	}()
	waitForLockWait(t, b, b.pool, "lockq-migrate")

	enqueueWhileItWaits(t, f, "while-migrating", "migrate", done, slow)
	var version, rows int
	if err := b.pool.QueryRow(b.ctx, `SELECT (SELECT version FROM lockq.schema_version), (SELECT count(*) FROM lockq.pending)`).Scan(&version, &rows); err != nil {
		t.Fatal(err)
	}
	if version != 39 || rows != 2 {
		t.Fatalf("version %d with %d pending rows, want 39 with 2", version, rows)
	}
}

// TestMigrateGivesUpOnABusyTableNamingTheHolder: a migration that cannot
// get its locks within LockTimeout, tried again and again, fails with a
// *MigrationLockError naming the migration and the session whose
// transaction holds the table, wraps the database's lock timeout, and
// writes nothing of it (the migrations before it stay applied).
func TestMigrateGivesUpOnABusyTableNamingTheHolder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	f := newLockQueueFixture(t, b, "lockq_busy")
	holder := namedPool(t, b, "slow-producer")
	slow := f.slowEnqueue(t, holder)
	var pid int
	if err := slow.QueryRow(b.ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}

	err := migrations.MigrateWith(b.ctx, b.pool, migrations.Options{Schema: f.schema, LockTimeout: time.Second, LockTry: 100 * time.Millisecond})
	var ml *migrations.MigrationLockError
	if !errors.As(err, &ml) {
		t.Fatalf("migrate behind an open transaction on pending: %v, want a *MigrationLockError", err)
	}
	if ml.Version != 39 || ml.Name != "039_retry_time_behind_a_replay.sql" || ml.Schema != f.schema || ml.Tries < 2 || ml.Try != 100*time.Millisecond {
		t.Errorf("the error says migration %d %q of %s, %d tries of %s: want 039 of %s, tried more than once in tries of 100ms",
			ml.Version, ml.Name, ml.Schema, ml.Tries, ml.Try, f.schema)
	}
	i := slices.IndexFunc(ml.Holders, func(h migrations.TableLockHolder) bool { return h.PID == pid })
	if i < 0 || ml.Holders[i].ApplicationName != "slow-producer" || ml.Holders[i].State != "idle in transaction" ||
		!slices.Contains(ml.Holders[i].Locks, f.schema+".pending RowExclusiveLock") {
		t.Errorf("holders %+v, want the slow producer (pid %d) holding %s.pending", ml.Holders, pid, f.schema)
	}
	if !strings.Contains(err.Error(), "039_retry_time_behind_a_replay.sql") || !strings.Contains(err.Error(), "slow-producer") {
		t.Errorf("the error does not name the migration and the holder: %v", err)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "55P03" {
		t.Errorf("the error does not wrap the database's lock timeout: %v", err)
	}
	st, err := migrations.GetStatus(b.ctx, b.pool, f.schema)
	if err != nil || st.Current != 38 {
		t.Fatalf("status %+v, %v: want 038 applied and 039 not", st, err)
	}
	var retryAt bool
	if err := b.pool.QueryRow(b.ctx, `SELECT EXISTS (SELECT 1 FROM pg_attribute
		WHERE attrelid = 'lockq_busy.pending'::regclass AND attname = 'retry_at' AND NOT attisdropped)`).Scan(&retryAt); err != nil || retryAt {
		t.Fatalf("pending has retry_at after the refused migration: %v, %v", retryAt, err)
	}
}

// TestCreateRolesLetsEnqueuesThroughWhileItWaits: `migrate --create-roles`,
// run after every upgrade where roles are in place, changes owners,
// row-level security and policies of pending and the other tables, which
// takes their exclusive locks: behind a producer's open transaction it
// held up every enqueue for the whole lock timeout, as a migration did. It
// must wait in short tries too, and succeed once the transaction ends.
func TestCreateRolesLetsEnqueuesThroughWhileItWaits(t *testing.T) {
	t.Parallel()
	b := setup(t)
	f := newDefaultFixture(t, b)
	slow := f.slowEnqueue(t, b.pool)

	roles := superuserPool(t, b, "lockq-roles")
	done := make(chan error, 1)
	go func() { done <- migrations.CreateRolesWith(b.ctx, roles, migrations.RolesOptions{}) }()
	waitForLockWait(t, b, roles, "lockq-roles")

	// A producer that has not enqueued yet (it reads the schema's
	// version first): it needs a lock on every table the slow
	// transaction holds, whichever of them the script waits for.
	enqueueWhileItWaits(t, newDefaultFixture(t, b), "while-granting", "--create-roles", done, slow)
	var owner string
	if err := roles.QueryRow(b.ctx, `SELECT pg_get_userbyid(relowner) FROM pg_class WHERE oid = 'outbox.pending'::regclass`).Scan(&owner); err != nil || owner != migrations.RoleOwner {
		t.Fatalf("pending belongs to %q (%v), want %s", owner, err, migrations.RoleOwner)
	}
}

// TestCreateRolesGivesUpOnABusyTable: the roles script, its tables' locks
// not taken within LockTimeout in tries, fails with a *MigrationLockError
// naming the session that holds them, and changes nothing.
func TestCreateRolesGivesUpOnABusyTable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	f := newDefaultFixture(t, b)
	f.slowEnqueue(t, namedPool(t, b, "slow-producer"))
	roles := superuserPool(t, b, "lockq-roles")
	err := migrations.CreateRolesWith(b.ctx, roles, migrations.RolesOptions{LockTimeout: time.Second, LockTry: 100 * time.Millisecond})
	var ml *migrations.MigrationLockError
	if !errors.As(err, &ml) {
		t.Fatalf("create roles behind an open transaction: %v, want a *MigrationLockError", err)
	}
	if ml.Op != "create roles" || ml.Version != 0 || ml.Tries < 2 ||
		!slices.ContainsFunc(ml.Holders, func(h migrations.TableLockHolder) bool { return h.ApplicationName == "slow-producer" }) {
		t.Errorf("the error says %s, version %d, %d tries, holders %+v: want create roles, tried more than once, held by the slow producer",
			ml.Op, ml.Version, ml.Tries, ml.Holders)
	}
	if !strings.HasPrefix(err.Error(), "create roles outbox: the roles script could not take its locks") {
		t.Errorf("the error does not say what waited: %v", err)
	}
	var owner string
	if err := roles.QueryRow(b.ctx, `SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = 'outbox'`).Scan(&owner); err != nil || owner == migrations.RoleOwner {
		t.Fatalf("the schema belongs to %q (%v) after the refused script, want it unchanged", owner, err)
	}
}

// TestMigrateLockTimeoutNamesAHolderOfAnotherRole: the session holding the
// migration lock may be another role's (a superuser's migrate left it
// through a pooler, and the owner migrates now), whose state and times
// pg_stat_activity hides from the migrator. Before the fix the look-up of
// the holder failed on those NULLs ("cannot scan NULL"), and the error
// named no holder; it must name the session by its pid, its times unknown.
func TestMigrateLockTimeoutNamesAHolderOfAnotherRole(t *testing.T) {
	t.Parallel()
	b := setup(t)
	holder, err := pgx.Connect(b.ctx, testdb.AsAdmin(t, b.url))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(context.Background())
	if _, err := holder.Exec(b.ctx, "SELECT pg_advisory_lock(hashtext('outbox-migrate:outbox'))"); err != nil {
		t.Fatal(err)
	}
	var superuser bool
	if err := b.pool.QueryRow(b.ctx, "SELECT rolsuper OR pg_has_role('pg_read_all_stats', 'MEMBER') FROM pg_roles WHERE rolname = current_user").Scan(&superuser); err != nil {
		t.Fatal(err)
	}
	if superuser {
		t.Skip("the tests' role sees every session: nothing is hidden from it")
	}
	err = migrations.MigrateWith(b.ctx, b.pool, migrations.Options{LockTimeout: 200 * time.Millisecond})
	var lt *migrations.LockTimeoutError
	if !errors.As(err, &lt) {
		t.Fatalf("MigrateWith with the lock held: %v, want a *LockTimeoutError", err)
	}
	if len(lt.Holders) != 1 || lt.Holders[0].PID != int(holder.PgConn().PID()) || strings.Contains(err.Error(), "looking up") {
		t.Fatalf("holders %+v, want the superuser's session (pid %d): %v", lt.Holders, holder.PgConn().PID(), err)
	}
}

// TestSwitchesLetEnqueuesThroughWhileTheyWait: `outbox migrate
// ordering-on|off` locks sequences, pending and inflight, and `notify-on|off`
// alters pending's trigger; behind a producer's open transaction each held
// up every enqueue after it for as long as that transaction lasted (up to
// migrate's lock timeout, a minute). They must wait in tries too, and
// succeed once the transaction ends.
func TestSwitchesLetEnqueuesThroughWhileTheyWait(t *testing.T) {
	t.Parallel()
	for _, sw := range []struct {
		name string
		run  func(ctx context.Context, pool *pgxpool.Pool) error
	}{
		{"ordering", func(ctx context.Context, pool *pgxpool.Pool) error {
			return migrations.SetOrdered(ctx, pool, "outbox", false)
		}},
		{"notify", func(ctx context.Context, pool *pgxpool.Pool) error {
			return migrations.SetNotify(ctx, pool, "outbox", false)
		}},
	} {
		t.Run(sw.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			f := newDefaultFixture(t, b)
			slow := f.slowEnqueue(t, b.pool)
			application := "lockq-" + sw.name
			switcher := namedPool(t, b, application)
			done := make(chan error, 1)
			go func() { done <- sw.run(b.ctx, switcher) }()
			waitForLockWait(t, b, b.pool, application)

			enqueueWhileItWaits(t, newDefaultFixture(t, b), "while-switching", "the "+sw.name+" switch", done, slow)
		})
	}
}

// TestSetNotifyInACallersTransactionWaitsInTries: SetNotify given the
// caller's transaction (which its doc allows) waits in tries as on a
// pool. Its second try used to run in the transaction the first try's
// lock timeout had aborted: it failed at once with "current transaction
// is aborted" (25P02), an untyped error a second after it began, where
// the switch would have been made once the producer's transaction ended.
func TestSetNotifyInACallersTransactionWaitsInTries(t *testing.T) {
	t.Parallel()
	b := setup(t)
	f := newDefaultFixture(t, b)
	slow := f.slowEnqueue(t, b.pool)
	const application = "lockq-notify-tx"
	switcher := namedPool(t, b, application)
	tx, err := switcher.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	done := make(chan error, 1)
	go func() { done <- migrations.SetNotify(b.ctx, tx, "outbox", false) }()
	// The first try waits, then gives up on its lock: the slow
	// transaction ends only after that, for a later try to get it.
	waitForLockWait(t, b, b.pool, application)
	deadline := time.Now().Add(30 * time.Second)
	for {
		var waiting bool
		if err := b.pool.QueryRow(b.ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE application_name = $1 AND wait_event_type = 'Lock')`, application).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if !waiting {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the switch's first try never gave up on its lock")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := slow.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("SetNotify in the caller's transaction, once the slow transaction committed: %v", err)
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	if on, err := migrations.NotifyEnabled(b.ctx, b.pool, "outbox"); err != nil || on {
		t.Fatalf("the notify trigger after the switch committed: enabled %v, %v", on, err)
	}
}
