package engine

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/rails"
)

// suspectsTracer counts the relayer's checks for due suspects
// (store.SuspectsDue's statement), in a round trip of their own and inside
// a pipelined batch (a claim's).
type suspectsTracer struct{ alone, inBatch atomic.Int64 }

// isSuspectsCheck tells the suspects check from the claims, which never
// bound zombie_count from above.
func isSuspectsCheck(sql string) bool { return strings.Contains(sql, "zombie_count < 2147483647") }

func (s *suspectsTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if isSuspectsCheck(d.SQL) {
		s.alone.Add(1)
	}
	return ctx
}

func (s *suspectsTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (s *suspectsTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (s *suspectsTracer) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	if isSuspectsCheck(d.SQL) {
		s.inBatch.Add(1)
	}
}

func (s *suspectsTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// TestSuspectsCheckRidesTheClaim: a relayer asks four times a second
// whether suspects are due. Asked in a round trip of its own before a
// claim, the question held up every instruction that claim took by that
// round trip: at a steady 1,000/s, 1.3% of the instructions, and a fifth
// of those slower than the p99 of enqueue → rail call (a trace of slow
// instructions, docs/performance.md). The question now rides the claim's
// own pipelined batch: the relayer never sends it alone, and still asks.
func TestSuspectsCheckRidesTheClaim(t *testing.T) {
	t.Parallel()
	tracer := &suspectsTracer{}
	b := setupOn(t, testdb.NewWithConfig(t, func(c *pgxpool.Config) {
		c.MaxConns = 8
		c.ConnConfig.Tracer = tracer
	}), rails.SandboxOptions{Seed: 1})
	r := b.start(t, b.config("r-suspects"))
	// A trickle of instructions over a second and a half: claims keep
	// coming, and the check is due about six times.
	for i := range 30 {
		if _, err := b.producer.Enqueue(b.ctx, b.pool, instruction("p-suspects", i)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	statsOnceDispatched(t, r, 30)
	alone, inBatch := tracer.alone.Load(), tracer.inBatch.Load()
	t.Logf("suspects checks: %d alone, %d in a claim's batch", alone, inBatch)
	if alone > 0 {
		t.Errorf("the relayer asked for suspects %d times in a round trip of its own, want 0 (in the claim's batch)", alone)
	}
	if inBatch == 0 {
		t.Error("the relayer never asked for suspects")
	}
}
