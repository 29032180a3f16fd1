package pending_test

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/migrations"
	"github.com/ledgerline/outbox/pending"
)

// BenchmarkEnqueueBatch1000 measures one transaction of 1,000 instructions
// for 1,000 participants. Report ns/op / 1000 as the per-instruction cost.
func BenchmarkEnqueueBatch1000(b *testing.B) {
	pool := setupBench(b)
	producer, _ := pending.NewProducer(pending.Config{})
	ctx := b.Context()
	n := 0
	for b.Loop() {
		ins := make([]pending.Instruction, 1000)
		for i := range ins {
			n++
			ins[i] = payout(fmt.Sprintf("p%d", i), fmt.Sprintf("b%d", n))
		}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := producer.EnqueueBatch(ctx, tx, ins)
			return err
		}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*1000)/b.Elapsed().Seconds(), "instructions/s")
}

// BenchmarkEnqueueParallel16 measures single-instruction enqueue throughput
// (one transaction each) with 16 concurrent producers, under the three
// NOTIFY regimes (docs/architecture.md): trigger off, trigger on with no idle relayer,
// trigger on with an idle relayer registered (every commit notifies). Run
// with OUTBOX_TEST_FSYNC=on (make bench): the NOTIFY cost is a commit cost.
func BenchmarkEnqueueParallel16(b *testing.B) {
	for _, mode := range []string{"trigger-off", "trigger-on-busy", "trigger-on-idle"} {
		b.Run(mode, func(b *testing.B) {
			pool := setupBench(b)
			ctx := b.Context()
			switch mode {
			case "trigger-off":
				if err := migrations.SetNotify(ctx, pool, "", false); err != nil {
					b.Fatal(err)
				}
			case "trigger-on-idle":
				// Keep the registration fresh for the whole run.
				if _, err := pool.Exec(ctx, `INSERT INTO outbox.relayer_idle VALUES ('bench', now() + interval '1 hour')`); err != nil {
					b.Fatal(err)
				}
			}
			producer, _ := pending.NewProducer(pending.Config{})
			var n atomic.Int64
			b.SetParallelism(max(1, 16/max(1, testingProcs())))
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					i := n.Add(1)
					if _, err := producer.Enqueue(ctx, pool, payout(fmt.Sprintf("p%d", i%1000), fmt.Sprintf("s%d", i))); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "enqueues/s")
		})
	}
}

func testingProcs() int { return runtime.GOMAXPROCS(0) }

func setupBench(b *testing.B) *pgxpool.Pool {
	b.Helper()
	return testdb.NewWithConfig(b, func(c *pgxpool.Config) { c.MaxConns = 20 })
}
