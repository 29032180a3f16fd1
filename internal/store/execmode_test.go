package store_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/reaper"
)

// Every statement of the store works whatever exec mode the caller's pool
// uses: behind PgBouncer in transaction mode pgx runs QueryExecModeExec,
// which takes a parameter's type from its Go type alone, and a producer's
// transaction may come from a pool configured any way at all.
func TestEveryQueryExecMode(t *testing.T) {
	t.Parallel()
	modes := map[string]pgx.QueryExecMode{
		"cache_statement": pgx.QueryExecModeCacheStatement,
		"cache_describe":  pgx.QueryExecModeCacheDescribe,
		"describe_exec":   pgx.QueryExecModeDescribeExec,
		"exec":            pgx.QueryExecModeExec,
		"simple_protocol": pgx.QueryExecModeSimpleProtocol,
	}
	for name, mode := range modes {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setupRecord(t)
			cfg := b.pool.Config().Copy()
			cfg.ConnConfig.DefaultQueryExecMode = mode
			pool, err := pgxpool.NewWithConfig(b.ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			b.pool = pool
			if b.reaper, err = reaper.New(pool, reaper.Config{ReaperID: "test-reaper"}); err != nil {
				t.Fatal(err)
			}

			// A zombie first: its lease runs out, the reaper requeues it, and
			// its late outcome withdraws the requeued copy.
			zombie := b.enqueue(t, "p-2", "k-3")
			late := b.claimOne(t, "r-0", shortLease)
			b.reap(t, late)
			first := b.enqueue(t, "p-1", "k-1")
			second := b.enqueue(t, "p-1", "k-2")
			rows, err := b.st.ListPending(b.ctx, pool, store.PendingFilter{Limit: 10})
			if err != nil || len(rows) != 3 {
				t.Fatalf("pending: %d rows, %v", len(rows), err)
			}
			if rec := b.record(t, recordOutcome(t, late, "r-0", store.Dispatched)); !rec[0].Late {
				t.Fatalf("zombie's outcome %+v, want late", rec[0])
			}
			if w := b.where(t, zombie); w.pending || w.inflight != nil {
				t.Fatalf("zombie's copy not withdrawn: %+v", w)
			}
			c := b.claimOne(t, "r-0", longLease)
			if c.OutboxID != first {
				t.Fatalf("claimed %s, want the head %s", c.OutboxID, first)
			}

			// The head's outcome hands its successor straight to dispatch.
			rec, next, err := b.st.Record(b.ctx, pool, []store.Outcome{recordOutcome(t, c, "r-0", store.Dispatched)},
				store.HandoffParams{RelayerID: "r-0", Limit: 10, Leases: map[string]time.Duration{"sandbox": longLease}})
			if err != nil || len(rec) != 1 || rec[0].Late {
				t.Fatalf("record: %+v, %v", rec, err)
			}
			if len(next) != 1 || next[0].OutboxID != second {
				t.Fatalf("hand-off: %+v, want %s", next, second)
			}
			b.record(t, recordOutcome(t, next[0], "r-0", store.Failed))
			got, _ := b.trail(t, zombie)
			wantTrail(t, got, "DISPATCHING#1", "ZOMBIE_REQUEUE#1", "DISPATCHED#1+late")
			if _, err := b.st.TrailByInstruction(b.ctx, pool, "ins-k-1"); err != nil {
				t.Error(err)
			}
			dead, err := b.st.DeadLetters(b.ctx, pool, true, 10)
			if err != nil || len(dead) != 1 {
				t.Fatalf("dead letters: %+v, %v", dead, err)
			}
			if ok, err := b.st.Replay(b.ctx, pool, second, "ops", "test"); err != nil || !ok {
				t.Fatalf("replay: %v, %v", ok, err)
			}
			if _, err := b.st.Snapshot(b.ctx, pool); err != nil {
				t.Error(err)
			}
			b.verifyOK(t)
		})
	}
}
