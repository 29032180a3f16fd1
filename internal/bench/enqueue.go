package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ledgerline/outbox/migrations"
	"github.com/ledgerline/outbox/pending"
)

// enqueue measures producers alone: Producers goroutines, each enqueueing
// one instruction per transaction (the pool's, so the producer's three
// statements go in one round trip) for Duration, ordering on, no relayer
// running (so nobody is registered idle and the trigger notifies no one).
// This is what the ceiling's enqueue line runs through pgbench.
func (r *runner) enqueue(ctx context.Context) ([]Result, error) {
	schema, drop, err := r.freshSchema(ctx, true)
	if err != nil {
		return nil, err
	}
	defer drop()
	r.settle(ctx)
	rss := sampleRSS()
	n, elapsed, err := r.produce(ctx, schema, "enqueue")
	mib := rss.MiB()
	if err != nil {
		return nil, err
	}
	res := Result{Workload: "enqueue", Ordered: true, Participants: r.cfg.Participants, Instructions: int(n),
		MsgsPerSec: float64(n) / elapsed.Seconds(), RSSMiB: mib, Seconds: elapsed.Seconds(),
		Note: fmt.Sprintf("%d producers, one instruction per transaction", r.cfg.Producers)}
	r.emit(res)
	return []Result{res}, nil
}

// produce runs Producers producers on schema for Duration and returns how
// many instructions they committed.
func (r *runner) produce(ctx context.Context, schema, what string) (int64, time.Duration, error) {
	producer, err := pending.NewProducer(pending.Config{Schema: schema})
	if err != nil {
		return 0, 0, err
	}
	pctx, cancel := context.WithTimeout(ctx, r.cfg.Duration)
	defer cancel()
	run := rand.Uint32()
	var next atomic.Int64
	var done rate
	var wg sync.WaitGroup
	errs := make(chan error, r.cfg.Producers)
	stopProgress := r.progress(func(el time.Duration) string {
		return fmt.Sprintf("%s: %d committed, %d/s in the last second (%v)", what, done.n.Load(), done.since(), el)
	})
	t0 := time.Now()
	for range r.cfg.Producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for pctx.Err() == nil {
				i := next.Add(1)
				if _, err := producer.Enqueue(pctx, r.producerDB, instruction(run, int(i), r.cfg.Participants)); err != nil {
					if pctx.Err() == nil {
						errs <- err
					}
					return
				}
				done.n.Add(1)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(t0)
	stopProgress()
	close(errs)
	if err := errors.Join(ctx.Err(), <-errs); err != nil {
		return 0, 0, err
	}
	return done.n.Load(), elapsed, nil
}

// notify compares producers with the NOTIFY trigger on and off while the
// relayers drain, in Pairs on/off pairs (alternating which goes first,
// each on a fresh schema after a CHECKPOINT): commit latency dominates
// and drifts, so only the ratio within a pair means anything.
func (r *runner) notify(ctx context.Context) ([]Result, error) {
	var out []Result
	for pair := range r.cfg.Pairs {
		for _, trigger := range []bool{pair%2 == 0, pair%2 != 0} {
			res, err := r.notifyRun(ctx, trigger)
			if err != nil {
				return out, err
			}
			r.emit(res)
			out = append(out, res)
		}
	}
	return out, nil
}

func (r *runner) notifyRun(ctx context.Context, trigger bool) (Result, error) {
	schema, drop, err := r.freshSchema(ctx, true)
	if err != nil {
		return Result{}, err
	}
	defer drop()
	if err := migrations.SetNotify(ctx, r.cfg.Pool, schema, trigger); err != nil {
		return Result{}, err
	}
	r.settle(ctx)
	rs, stop, err := r.relayers(ctx, schema, nil, nil)
	if err != nil {
		return Result{}, err
	}
	rss := sampleRSS()
	n, elapsed, err := r.produce(ctx, schema, fmt.Sprintf("notify trigger=%v", trigger))
	mib := rss.MiB()
	stop()
	if err != nil {
		return Result{}, err
	}
	var notified int64
	for _, rl := range rs {
		notified += rl.Stats().Notifications
	}
	return Result{Workload: "notify", Ordered: true, Participants: r.cfg.Participants, Instructions: int(n),
		MsgsPerSec: float64(n) / elapsed.Seconds(), RSSMiB: mib, Seconds: elapsed.Seconds(),
		Trigger: ptr(trigger), Notified: notified,
		Note: fmt.Sprintf("%d producers, one instruction per transaction, relayers draining", r.cfg.Producers)}, nil
}
