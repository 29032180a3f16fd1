package store_test

import (
	"context"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/internal/store"
)

// TestVerifyWorkersShareOneSnapshot: a transaction that imports the first
// one's snapshot does not see what committed after it was taken, so a
// verify whose checks run on several connections reports one instant.
func TestVerifyWorkersShareOneSnapshot(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	b.enqueue(t, "p1", "k1")
	first, err := store.BeginVerify(b.ctx, b.pool, "")
	if err != nil {
		t.Fatal(err)
	}
	defer first.Rollback(b.ctx)
	var snapshot string
	if err := first.QueryRow(b.ctx, `SELECT pg_export_snapshot()`).Scan(&snapshot); err != nil {
		t.Fatal(err)
	}
	b.enqueue(t, "p1", "k2") // commits after the snapshot
	worker, err := store.BeginVerify(b.ctx, b.pool, snapshot)
	if err != nil {
		t.Fatal(err)
	}
	defer worker.Rollback(b.ctx)
	var seen, now int
	if err := worker.QueryRow(b.ctx, `SELECT count(*) FROM outbox.pending`).Scan(&seen); err != nil {
		t.Fatal(err)
	}
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox.pending`).Scan(&now); err != nil {
		t.Fatal(err)
	}
	if seen != 1 || now != 2 {
		t.Fatalf("the worker sees %d pending instructions, the database %d; want 1 (the snapshot's) and 2", seen, now)
	}
	if _, err := store.BeginVerify(b.ctx, b.pool, "00000003-0000001B-1'; DROP TABLE outbox.pending; --"); err == nil {
		t.Fatal("a snapshot id that is not one was taken")
	}
}

// TestVerifyOnSeveralConnectionsReportsOneInstant: Verify with workers
// reports the instant its first transaction began, although an
// instruction is lost (its pending row deleted) after that, just before
// the worker begins its transaction: the worker reads the first
// transaction's snapshot, not its own. The first transaction holds back
// its own checks until the worker has run every check it could take, so
// the worker surely reads (TestVerifyWorkersShareOneSnapshot shows the
// import itself; this, that Verify's workers use it).
func TestVerifyOnSeveralConnectionsReportsOneInstant(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	lost := b.enqueue(t, "p1", "k1")
	b.enqueue(t, "p2", "k2")
	before := b.verifyOK(t)
	db := &startingWorkers{pool: b.pool, workerDone: make(chan struct{}), beforeWorker: func(ctx context.Context) error {
		_, err := b.pool.Exec(ctx, `DELETE FROM outbox.pending WHERE outbox_id = $1`, lost)
		return err
	}}
	r, err := b.st.Verify(b.ctx, db, store.VerifyOptions{Ordered: true, Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	if db.workers != 1 || db.workerQueries == 0 {
		t.Fatalf("%d workers began, %d of their queries ran: nothing was read beside the first transaction", db.workers, db.workerQueries)
	}
	r.Duration, before.Duration = 0, 0
	if !reflect.DeepEqual(r, before) {
		t.Fatalf("verify on two connections reported a later state than its first transaction's:\n%+v\nwant\n%+v", r, before)
	}
	now, err := b.st.Verify(b.ctx, b.pool, store.VerifyOptions{Ordered: true})
	if err != nil {
		t.Fatal(err)
	}
	if now.OK() {
		t.Fatal("the lost instruction is not reported now: the deletion the workers must not see did not happen")
	}
}

// startingWorkers opens Verify's transactions on pool. Before the second
// (a worker's), it runs beforeWorker; the first transaction's queries,
// after its snapshot is exported, wait until the worker's transaction has
// ended.
type startingWorkers struct {
	pool          *pgxpool.Pool
	beforeWorker  func(context.Context) error
	workerDone    chan struct{}
	mu            sync.Mutex
	began         int
	workers       int
	workerQueries int
}

func (s *startingWorkers) BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error) {
	s.mu.Lock()
	s.began++
	first := s.began == 1
	if !first {
		s.workers++
	}
	s.mu.Unlock()
	if !first {
		if err := s.beforeWorker(ctx); err != nil {
			return nil, err
		}
	}
	tx, err := s.pool.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	if first {
		return &heldTx{Tx: tx, until: s.workerDone}, nil
	}
	return &workerTx{Tx: tx, s: s}, nil
}

// heldTx is the first transaction: its checks wait for the worker, once
// (the transaction's queries run one at a time).
type heldTx struct {
	pgx.Tx
	until  chan struct{}
	waited bool
}

func (h *heldTx) wait(ctx context.Context, sql string) {
	if h.waited || sql == "SELECT pg_export_snapshot()" {
		return
	}
	h.waited = true
	select {
	case <-h.until:
	case <-ctx.Done():
	case <-time.After(10 * time.Second): // no worker: the test fails on its count
	}
}

func (h *heldTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	h.wait(ctx, sql)
	return h.Tx.Query(ctx, sql, args...)
}

func (h *heldTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	h.wait(ctx, sql)
	return h.Tx.QueryRow(ctx, sql, args...)
}

// workerTx is a worker's transaction: it counts its queries and, when it
// ends, lets the first transaction go on.
type workerTx struct {
	pgx.Tx
	s *startingWorkers
}

func (w *workerTx) count() {
	w.s.mu.Lock()
	w.s.workerQueries++
	w.s.mu.Unlock()
}

func (w *workerTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	w.count()
	return w.Tx.Query(ctx, sql, args...)
}

func (w *workerTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	w.count()
	return w.Tx.QueryRow(ctx, sql, args...)
}

func (w *workerTx) Rollback(ctx context.Context) error {
	err := w.Tx.Rollback(ctx)
	close(w.s.workerDone)
	return err
}
