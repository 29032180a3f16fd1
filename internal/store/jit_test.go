package store_test

import (
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
	for _, q := range []string{`SET jit = on`, `SET jit_above_cost = 0`, `SET plan_cache_mode = force_generic_plan`,
		`PREPARE claim AS ` + st.HotPath().Claim} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
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
