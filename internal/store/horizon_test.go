package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/internal/pglocal"
	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/internal/testdb"
)

// horizonBundle is a fresh database and the store.
type horizonBundle struct {
	ctx  context.Context
	url  string
	pool *pgxpool.Pool // as the tests' role
	// reader is the database as the administrative role, which sees every
	// session's details (and so tells autovacuum workers, which may visit
	// the database at any moment, from sessions).
	reader *pgxpool.Pool
	st     *store.Store
}

func setupHorizon(t *testing.T) *horizonBundle {
	t.Helper()
	url := testdb.URL(t)
	pool, err := pgxpool.New(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	reader, err := pgxpool.New(t.Context(), testdb.AsAdmin(t, url))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reader.Close)
	st, err := store.New("")
	if err != nil {
		t.Fatal(err)
	}
	return &horizonBundle{ctx: t.Context(), url: url, pool: pool, reader: reader, st: st}
}

// connect opens a connection of its own, named application.
func (b *horizonBundle) connect(t *testing.T, url, application string) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["application_name"] = application
	conn, err := pgx.ConnectConfig(b.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// connectAsAdmin opens a connection of its own to the test's database as
// the server's administrative role, named application.
func (b *horizonBundle) connectAsAdmin(t *testing.T, application string) *pgx.Conn {
	t.Helper()
	return b.connect(t, testdb.AsAdmin(t, b.url), application)
}

// horizon reads the horizon of db; the snapshot must report the same.
func (b *horizonBundle) horizon(t *testing.T, db store.Querier) store.Horizon {
	t.Helper()
	h, err := b.st.VacuumHorizon(b.ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	snap, err := b.st.Snapshot(b.ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	if (snap.VacuumHorizon == nil) != (h.Oldest == nil) || snap.VacuumHorizonPartial == h.SeesAll {
		t.Errorf("snapshot's horizon %+v (partial %v), VacuumHorizon's %+v (sees all %v)",
			snap.VacuumHorizon, snap.VacuumHorizonPartial, h.Oldest, h.SeesAll)
	}
	return h
}

// writes runs n transactions that each take a transaction id.
func (b *horizonBundle) writes(t *testing.T, n int) {
	t.Helper()
	for range n {
		if _, err := b.pool.Exec(b.ctx, `SELECT txid_current()`); err != nil {
			t.Fatal(err)
		}
	}
}

// TestVacuumHorizonNamesAnOldSession: a session that keeps a REPEATABLE
// READ transaction open holds the horizon; VacuumHorizon names it (pid,
// application, state, since when, how many transaction ids old), and
// nothing once it commits. A session of another database does not count.
func TestVacuumHorizonNamesAnOldSession(t *testing.T) {
	t.Parallel()
	b := setupHorizon(t)
	if h := b.horizon(t, b.reader); h.Oldest != nil {
		t.Fatalf("a fresh database's horizon is held by %+v", h.Oldest)
	}

	// Another database's old transaction holds back only its own tables.
	other := b.connect(t, testdb.URL(t), "other-database")
	if _, err := other.Exec(b.ctx, `BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1`); err != nil {
		t.Fatal(err)
	}
	if h := b.horizon(t, b.reader); h.Oldest != nil {
		t.Fatalf("another database's session holds this one's horizon: %+v", h.Oldest)
	}

	holder := b.connect(t, b.url, "report-job")
	var started time.Time
	if _, err := holder.Exec(b.ctx, `BEGIN ISOLATION LEVEL REPEATABLE READ`); err != nil {
		t.Fatal(err)
	}
	if err := holder.QueryRow(b.ctx, `SELECT now()`).Scan(&started); err != nil {
		t.Fatal(err)
	}
	b.writes(t, 5)
	h := b.horizon(t, b.reader).Oldest
	if h == nil {
		t.Fatal("an open REPEATABLE READ transaction holds no horizon")
	}
	want := fmt.Sprint(holder.PgConn().PID())
	if h.Kind != "session" || h.ID != want || h.Application != "report-job" || h.State != "idle in transaction" {
		t.Errorf("holder %+v, want session %s of report-job, idle in transaction", h, want)
	}
	if h.Since == nil || !h.Since.Equal(started) || h.AgeSeconds <= 0 {
		t.Errorf("holder since %v (age %.3f s), want %v", h.Since, h.AgeSeconds, started)
	}
	if h.XIDAge < 5 {
		t.Errorf("holder is %d transaction ids old after 5 writes", h.XIDAge)
	}
	if _, err := holder.Exec(b.ctx, `COMMIT`); err != nil {
		t.Fatal(err)
	}
	if h := b.horizon(t, b.reader); h.Oldest != nil {
		t.Fatalf("after the commit the horizon is held by %+v", h.Oldest)
	}

	// The tests' role is no superuser: another role's session is found,
	// without its details, and the role is told so (roles.sql gives the
	// schema's roles the details: TestVacuumHorizonAsEachRole).
	other2 := b.connectAsAdmin(t, "superuser-job")
	if _, err := other2.Exec(b.ctx, `BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1`); err != nil {
		t.Fatal(err)
	}
	b.writes(t, 1)
	pid := fmt.Sprint(other2.PgConn().PID())
	partial, err := b.st.VacuumHorizon(b.ctx, b.pool)
	if err != nil {
		t.Fatal(err)
	}
	if h := partial.Oldest; partial.SeesAll || h == nil || h.ID != pid || h.Since != nil || h.State != "" {
		t.Fatalf("the tests' role sees %+v (sees all %v), want session %s without its details", h, partial.SeesAll, pid)
	}
	switch h := b.horizon(t, b.reader); {
	case !h.SeesAll:
		t.Logf("the administrative role does not see every session's details (%s names no superuser)", testdb.EnvURL)
	case h.Oldest == nil || h.Oldest.ID != pid || h.Oldest.Since == nil || h.Oldest.Application != "superuser-job":
		t.Fatalf("the administrative role sees every session's details, and %+v, want session %s with its details", h.Oldest, pid)
	}
}

// TestVacuumHorizonNamesAPreparedTransaction: a prepared transaction holds
// the horizon until it is committed or rolled back, with no session left
// to show it.
func TestVacuumHorizonNamesAPreparedTransaction(t *testing.T) {
	t.Parallel()
	b := setupHorizon(t)
	var max int
	if err := b.pool.QueryRow(b.ctx, `SELECT current_setting('max_prepared_transactions')::int`).Scan(&max); err != nil {
		t.Fatal(err)
	}
	if max == 0 {
		t.Skip("the server does not allow prepared transactions (max_prepared_transactions = 0); the throwaway cluster does")
	}
	gid := fmt.Sprintf("outbox-test-%d", time.Now().UnixNano())
	conn := b.connect(t, b.url, "two-phase")
	if _, err := conn.Exec(b.ctx, `BEGIN; SELECT txid_current(); PREPARE TRANSACTION '`+gid+`'`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = b.pool.Exec(context.Background(), `ROLLBACK PREPARED '`+gid+`'`) })
	conn.Close(b.ctx)
	b.writes(t, 3)
	h := b.horizon(t, b.reader).Oldest
	if h == nil || h.Kind != "prepared transaction" || h.ID != gid || h.Since == nil || h.XIDAge < 3 {
		t.Fatalf("holder %+v, want prepared transaction %s", h, gid)
	}
	if _, err := b.pool.Exec(b.ctx, `ROLLBACK PREPARED '`+gid+`'`); err != nil {
		t.Fatal(err)
	}
	if h := b.horizon(t, b.reader).Oldest; h != nil {
		t.Fatalf("after ROLLBACK PREPARED the horizon is held by %+v", h)
	}
}

// TestVacuumHorizonNamesAStandbysSlot: a real streaming standby with
// hot_standby_feedback and a replication slot, running a long query: the
// primary's horizon is held by the slot; once the standby is gone the
// inactive slot still holds it, until it is dropped. This is how an
// abandoned standby slows a queue down for good.
func TestVacuumHorizonNamesAStandbysSlot(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	primary, pool := testdb.OwnCluster(t)
	// The cluster's own superuser reads as it writes.
	b := &horizonBundle{ctx: ctx, url: primary.ConnString("postgres"), pool: pool, reader: pool}
	var err error
	if b.st, err = store.New(""); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `SELECT pg_create_physical_replication_slot('auditors')`); err != nil {
		t.Fatal(err)
	}
	starting, cancel := testdb.Starting(ctx)
	defer cancel()
	standby, err := primary.StartReplica(starting, pglocal.Options{TCP: true, Settings: map[string]string{
		"primary_slot_name": "auditors", "hot_standby_feedback": "on", "wal_receiver_status_interval": "1s"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = standby.Stop(context.Background()) }) // a second Stop does nothing
	reader := b.connect(t, standby.ConnString("postgres"), "auditor")
	if _, err := reader.Exec(ctx, `BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM outbox.attempts`); err != nil {
		t.Fatal(err)
	}
	b.writes(t, 10)
	h := waitForHolder(t, b, "replication slot")
	if h.ID != "auditors" || h.State != "active" || h.Since != nil || h.XIDAge < 10 {
		t.Errorf("holder %+v, want the active slot auditors, 10 or more transaction ids old", h)
	}

	if err := standby.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	b.writes(t, 10)
	h = waitForHolder(t, b, "replication slot")
	if h.ID != "auditors" || h.State != "inactive" || h.XIDAge < 20 {
		t.Errorf("holder %+v, want the inactive slot auditors, 20 or more transaction ids old", h)
	}
	if _, err := b.pool.Exec(ctx, `SELECT pg_drop_replication_slot('auditors')`); err != nil {
		t.Fatal(err)
	}
	if h := b.horizon(t, b.reader).Oldest; h != nil {
		t.Fatalf("after the slot was dropped the horizon is held by %+v", h)
	}
}

// waitForHolder waits until the horizon's holder is of kind (a standby's
// feedback arrives every wal_receiver_status_interval).
func waitForHolder(t *testing.T, b *horizonBundle, kind string) *store.HorizonHolder {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		// Not horizon: the holder may change between its two reads.
		found, err := b.st.VacuumHorizon(b.ctx, b.reader)
		if err != nil {
			t.Fatal(err)
		}
		h := found.Oldest
		if h != nil && h.Kind == kind {
			return h
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s holds the horizon after 15 s; the holder is %+v", kind, h)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
