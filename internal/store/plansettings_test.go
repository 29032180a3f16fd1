package store_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/internal/testdb"
)

// TestHotStatementsAreNotJITCompiled: the hand-off's and the claim's
// generic plans can be costed over jit_above_cost (their batch size is a
// parameter), and PostgreSQL then compiles them with LLVM at every
// execution: about 100 ms of processor for a statement that runs in one or
// two. With JIT on and a threshold every plan crosses, the claim is
// compiled (so the test can fail), and not after the settings the store
// sends at the head of its batches.
func TestHotStatementsAreNotJITCompiled(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := t.Context()
	var available bool
	if err := pool.QueryRow(ctx, `SELECT pg_jit_available()`).Scan(&available); err != nil {
		t.Fatal(err)
	}
	if !available {
		t.Skip("this server has no JIT provider: nothing to turn off")
	}
	st, err := store.New("")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	execAll(t, conn, `SET jit = on`, `SET jit_above_cost = 0`, `SET plan_cache_mode = force_generic_plan`,
		`PREPARE claim AS `+st.HotPath().Claim)
	jitted := func(settings bool) bool {
		t.Helper()
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if settings {
			if _, err := tx.Exec(ctx, store.GenericPlansSQL); err != nil {
				t.Fatal(err)
			}
		}
		var plan string
		if err := tx.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE claim('r', 10, '{sandbox}', '{60000}')`).Scan(&plan); err != nil {
			t.Fatal(err)
		}
		return strings.Contains(plan, `"JIT"`)
	}
	if !jitted(false) {
		t.Fatal("the claim was not JIT-compiled with JIT on and jit_above_cost 0: the check below proves nothing")
	}
	if jitted(true) {
		t.Fatal("the claim was JIT-compiled after the store's settings")
	}
}

// TestClaimReadsTheDueIndexInOrder: with few due instructions in
// pending's statistics (a queue at a steady rate), the claim's generic
// plan could read a rail's due range with a bitmap scan and sort it. A
// bitmap scan never marks the index entries of deleted rows dead (an
// ordered index scan does, as it meets them), so every claim walked every
// entry deleted since the last vacuum: at 1,000/s, claims of 4 to 17 ms
// and an enqueue-to-rail-call p50 of 3.2-4.9 ms instead of 2.1-2.4. After
// the settings the store sends before a claim, the due range is read in
// index order.
func TestClaimReadsTheDueIndexInOrder(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := t.Context()
	st, err := store.New("")
	if err != nil {
		t.Fatal(err)
	}
	execAll(t, pool,
		`INSERT INTO outbox.pending (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type, payload, next_attempt_at, created_at)
		 SELECT gen_random_uuid(), 'i' || n, 'p' || (n % 1000), n, 'k' || n, 'sandbox', '{}',
		        CASE WHEN n <= 3 THEN now() - interval '1 minute' ELSE 'infinity' END, now() - interval '1 minute'
		 FROM generate_series(1, 20000) n`,
		`ANALYZE outbox.pending`,
	)
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	// plan prepares the claim afresh (a cached generic plan is kept
	// whatever the settings of later executions: the store's settings
	// head every batch, so its connections plan with them) and explains
	// it after settings.
	prepared := 0
	plan := func(settings string) string {
		t.Helper()
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		prepared++
		name := fmt.Sprintf("claim%d", prepared)
		execAll(t, tx, settings, `PREPARE `+name+` AS `+st.HotPath().Claim)
		var plan string
		if err := tx.QueryRow(ctx, `EXPLAIN (FORMAT JSON) EXECUTE `+name+`('r', 10, '{sandbox}', '{60000}')`).Scan(&plan); err != nil {
			t.Fatal(err)
		}
		return plan
	}
	const bitmap = `"Node Type": "Bitmap Heap Scan"`
	if p := plan(`SELECT set_config('plan_cache_mode', 'force_generic_plan', true)`); !strings.Contains(p, bitmap) {
		t.Fatalf("the generic plan without the store's settings reads no bitmap: the check below proves nothing\n%s", p)
	}
	if p := plan(store.ClaimPlansSQL); strings.Contains(p, bitmap) || !strings.Contains(p, `"Index Name": "pending_rail_due_idx"`) {
		t.Fatalf("after the store's settings the claim does not read the due index in order\n%s", p)
	}
}

// batchRecorder records the statements of every batch its pool sends.
type batchRecorder struct {
	mu      sync.Mutex
	batches [][]string
}

func (r *batchRecorder) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (r *batchRecorder) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (r *batchRecorder) TraceBatchStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	var sqls []string
	for _, q := range data.Batch.QueuedQueries {
		sqls = append(sqls, q.SQL)
	}
	r.mu.Lock()
	r.batches = append(r.batches, sqls)
	r.mu.Unlock()
	return ctx
}

func (r *batchRecorder) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (r *batchRecorder) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// TestOverviewReadsPlanWithoutJIT: the overview's reads of the archive's
// last minutes (RailActivity, LiveRelayers) cost every attached month's
// partition in their plans, which at a year's size crossed jit_above_cost:
// PostgreSQL compiled them with LLVM at each read, about 200 ms of a read
// of a few hundred buffers. Each is now sent after a setting that turns
// JIT off for it alone (same batch, same implicit transaction), which this
// test sees, on a pool that would compile every statement otherwise; and
// the setting is shown to keep a plan from being compiled.
func TestOverviewReadsPlanWithoutJIT(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	var available bool
	if err := b.pool.QueryRow(b.ctx, `SELECT pg_jit_available()`).Scan(&available); err != nil {
		t.Fatal(err)
	}
	if !available {
		t.Skip("this server cannot compile with JIT: nothing to turn off")
	}
	rec := &batchRecorder{}
	cfg := b.pool.Config().Copy()
	cfg.ConnConfig.RuntimeParams["jit"] = "on"
	cfg.ConnConfig.RuntimeParams["jit_above_cost"] = "0"
	cfg.ConnConfig.Tracer = rec
	pool, err := pgxpool.NewWithConfig(b.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	if _, err := b.st.RailActivity(b.ctx, pool, 5*time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := b.st.LiveRelayers(b.ctx, pool, 5*time.Minute); err != nil {
		t.Fatal(err)
	}
	rec.mu.Lock()
	batches := rec.batches
	rec.mu.Unlock()
	if len(batches) != 2 {
		t.Fatalf("batches sent %q: want one for each read", batches)
	}
	for i, sqls := range batches {
		if len(sqls) != 2 || sqls[0] != store.NoJITSQL || !strings.Contains(sqls[1], ".attempts") {
			t.Errorf("read %d sent %q: want the JIT setting, then the read of the archive", i, sqls)
		}
	}

	// What the setting does, on the same pool: the read of the archive's
	// recent rows compiled without it, not with it.
	const explain = `EXPLAIN (ANALYZE, FORMAT JSON) SELECT count(*) FROM outbox.attempts WHERE created_at > now() - interval '5 minutes'`
	compiled := func(rows pgx.Rows, err error) bool {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		plan, err := pgx.CollectExactlyOneRow(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return strings.Contains(plan, `"JIT"`)
	}
	if !compiled(pool.Query(b.ctx, explain)) {
		t.Fatal("the pool's plain read was not compiled: this test shows nothing")
	}
	if compiled(store.QueryNoJIT(b.ctx, pool, explain)) {
		t.Fatal("the read after the setting was compiled with JIT")
	}
}
