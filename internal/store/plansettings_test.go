package store_test

import (
	"fmt"
	"strings"
	"testing"

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
