package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/ledgerline/outbox/engine"
	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/pending"
)

// latencyProducers is the least number of producers the latency workload
// uses: with durable commits of a few milliseconds each, that many keep a
// steady 1,000/s with room to spare.
const latencyProducers = 32

// latencyWarmup is the start of a latency run that is not measured.
const latencyWarmup = 2 * time.Second

// latency runs an open-loop stream of Rate instructions per second for
// Duration, with ordering on, and reports two latencies per instruction,
// both from the moment its producer called Enqueue (before its commit, as
// River's enqueue time is taken): to the rail being called (River's "job
// start") and to the outcome committed. The schedule is fixed in advance
// (one instruction every 1/Rate seconds) and does not wait for slow
// commits, so the rate achieved is the rate measured.
func (r *runner) latency(ctx context.Context) ([]Result, error) {
	schema, drop, err := r.freshSchema(ctx, true)
	if err != nil {
		return nil, err
	}
	defer drop()
	r.settle(ctx)

	var (
		enqueuedAt sync.Map // instruction id -> time.Time
		mu         sync.Mutex
		calls      = newHistogram()
		outcomes   = newHistogram()
		commits    = newHistogram()
		warm       atomic.Bool
		recorded   rate
	)
	// The moments the split of the call latency needs (claimSplit), by
	// instruction id, under mu: its commit returned, its rail first called.
	// Plain maps: a sync.Map, made for keys read often and written once,
	// copies itself as new keys keep coming.
	committedAt, calledAt := map[string]time.Time{}, map[string]time.Time{}
	_, stop, err := r.relayers(ctx, schema,
		func(ins payment.Instruction) {
			if t, ok := enqueuedAt.Load(ins.InstructionID); ok {
				now := time.Now()
				d := now.Sub(t.(time.Time)).Microseconds()
				mu.Lock()
				_ = calls.RecordValue(max(1, d))
				if _, again := calledAt[ins.InstructionID]; !again {
					calledAt[ins.InstructionID] = now
				}
				mu.Unlock()
			}
		},
		func(recs []engine.Recorded) {
			mu.Lock()
			defer mu.Unlock()
			for _, rec := range recs {
				recorded.n.Add(1)
				t, ok := enqueuedAt.LoadAndDelete(rec.InstructionID)
				if ok && rec.State == store.Dispatched {
					_ = outcomes.RecordValue(max(1, rec.RecordedAt.Sub(t.(time.Time)).Microseconds()))
				}
			}
		})
	if err != nil {
		return nil, err
	}
	defer stop()
	producer, err := pending.NewProducer(pending.Config{Schema: schema})
	if err != nil {
		return nil, err
	}
	run := rand.Uint32()
	interval := time.Second / time.Duration(r.cfg.Rate)

	// The pacer hands out instruction numbers on schedule; producers take
	// them. A number nobody could take within a second of its due time
	// counts as missed (the stream fell behind).
	work := make(chan int, r.cfg.Rate)
	var sent, failed, missed atomic.Int64
	var wg sync.WaitGroup
	for range max(r.cfg.Producers, latencyProducers) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				ins := instruction(run, i, r.cfg.Participants)
				if warm.Load() { // only what is enqueued after the warm-up counts
					enqueuedAt.Store(ins.InstructionID, time.Now())
				}
				t0 := time.Now()
				_, err := producer.Enqueue(ctx, r.producerDB, ins)
				if warm.Load() {
					now := time.Now()
					mu.Lock()
					_ = commits.RecordValue(max(1, now.Sub(t0).Microseconds()))
					if err == nil {
						committedAt[ins.InstructionID] = now
					}
					mu.Unlock()
				}
				if err != nil {
					enqueuedAt.Delete(ins.InstructionID)
					failed.Add(1)
					continue
				}
				sent.Add(1)
			}
		}()
	}
	stopProgress := r.progress(func(el time.Duration) string {
		return fmt.Sprintf("latency: %d enqueued, %d outcomes in the last second (%v)", sent.Load(), recorded.since(), el)
	})
	rss := sampleRSS()
	t0 := time.Now()
	var measuredFrom time.Time
	for i := 0; ; i++ {
		due := t0.Add(time.Duration(i) * interval)
		if due.Sub(t0) >= latencyWarmup+r.cfg.Duration || ctx.Err() != nil {
			break
		}
		if due.Sub(t0) >= latencyWarmup && !warm.Load() {
			warm.Store(true)
			measuredFrom = time.Now()
			sent.Store(0)
		}
		if d := time.Until(due); d > 0 {
			time.Sleep(d)
		}
		select {
		case work <- i:
		default:
			missed.Add(1)
		}
	}
	close(work)
	wg.Wait()
	elapsed := time.Since(measuredFrom)
	achieved := float64(sent.Load()) / elapsed.Seconds()
	// Every measured instruction counts, the slowest above all: wait for
	// the tail to be dispatched (bounded; what is left is reported).
	unfinished := 0
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		unfinished = 0
		enqueuedAt.Range(func(_, _ any) bool { unfinished++; return true })
		if unfinished == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
	}
	stopProgress()
	mib := rss.MiB()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	stop()
	if err := r.verify(ctx, schema, true); err != nil {
		return nil, err
	}
	mu.Lock()
	defer mu.Unlock()
	split, err := r.claimSplit(ctx, schema, committedAt, calledAt)
	if err != nil {
		return nil, err
	}
	res := Result{Workload: "latency", Ordered: true, Participants: r.cfg.Participants, Instructions: int(sent.Load()),
		MsgsPerSec: achieved, Rate: ptr(float64(r.cfg.Rate)), AchievedRate: ptr(achieved),
		CallP50: ms(calls, 50), CallP99: ms(calls, 99), CallP999: ms(calls, 99.9),
		P50: ms(outcomes, 50), P99: ms(outcomes, 99), P999: ms(outcomes, 99.9),
		EnqueueP50: ms(commits, 50), EnqueueP99: ms(commits, 99),
		ClaimWaitP50: split.waitP50, ClaimWaitP99: split.waitP99, ClaimToCallP50: split.toCallP50, ClaimToCallP99: split.toCallP99,
		RSSMiB: mib, Seconds: elapsed.Seconds()}
	if achieved < 0.95*float64(r.cfg.Rate) || missed.Load() > 0 || failed.Load() > 0 {
		res.Note = fmt.Sprintf("the producers did not keep up (%d missed, %d failed): percentiles at %.0f/s, not %d/s",
			missed.Load(), failed.Load(), achieved, r.cfg.Rate)
	}
	if unfinished > 0 {
		res.Note = strings.TrimPrefix(res.Note+fmt.Sprintf("; %d measured instructions not dispatched 30 s after the stream ended (not in the percentiles)", unfinished), "; ")
	}
	r.emit(res)
	return []Result{res}, nil
}

// callSplit is the enqueue → rail call latency after the producer's
// commit, in two parts (milliseconds; see Result.ClaimWaitP50).
type callSplit struct {
	waitP50, waitP99, toCallP50, toCallP99 *float64
}

// claimSplit times each measured instruction's claim from the archive:
// the first DISPATCHING row's claimed_at is the start of the transaction
// that claimed it (now()), by the database's clock, which is this
// process's clock when both run on one machine (the benchmark's setting).
// Waits may be negative: a claim can start between the producer's commit
// and the commit's reply reaching it.
func (r *runner) claimSplit(ctx context.Context, schema string, committedAt, calledAt map[string]time.Time) (callSplit, error) {
	rows, err := r.cfg.Pool.Query(ctx, "SELECT instruction_id, min(claimed_at) FROM "+schema+
		".archive WHERE state = 'DISPATCHING' GROUP BY instruction_id")
	if err != nil {
		return callSplit{}, fmt.Errorf("latency: claim times: %w", err)
	}
	var waits, toCalls []time.Duration
	var id string
	var claimed time.Time
	_, err = pgx.ForEachRow(rows, []any{&id, &claimed}, func() error {
		committed, ok1 := committedAt[id]
		called, ok2 := calledAt[id]
		if ok1 && ok2 {
			waits = append(waits, claimed.Sub(committed))
			toCalls = append(toCalls, called.Sub(claimed))
		}
		return nil
	})
	if err != nil {
		return callSplit{}, fmt.Errorf("latency: claim times: %w", err)
	}
	if len(waits) == 0 {
		return callSplit{}, nil
	}
	slices.Sort(waits)
	slices.Sort(toCalls)
	return callSplit{quantileMS(waits, 50), quantileMS(waits, 99), quantileMS(toCalls, 50), quantileMS(toCalls, 99)}, nil
}

// quantileMS is the value at quantile q (percent) of ds, sorted, in
// milliseconds. Unlike the histograms it keeps negative values.
func quantileMS(ds []time.Duration, q float64) *float64 {
	i := min(len(ds)-1, int(float64(len(ds))*q/100))
	return ptr(float64(ds[i].Microseconds()) / 1000)
}
