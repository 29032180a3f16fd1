package bench

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/ledgerline/outbox/engine"
	"github.com/ledgerline/outbox/internal/store"
)

// drain queues Instructions over Participants, then measures how fast the
// relayers empty the queue: from their start to the last outcome
// committed. Once per ordering mode.
func (r *runner) drain(ctx context.Context) ([]Result, error) {
	var out []Result
	modes := slices.Clone(r.cfg.Ordered)
	if r.round%2 == 0 { // every other round, the other mode first
		slices.Reverse(modes)
	}
	for _, ordered := range modes {
		res, err := r.drainOnce(ctx, ordered)
		if err != nil {
			return out, err
		}
		r.emit(res)
		out = append(out, res)
	}
	return out, nil
}

func (r *runner) drainOnce(ctx context.Context, ordered bool) (Result, error) {
	schema, drop, err := r.queued(ctx, ordered)
	if err != nil {
		return Result{}, err
	}
	defer drop()
	n := r.cfg.Instructions

	var done rate
	finished := make(chan struct{})
	var once sync.Once
	rss := sampleRSS()
	cpu0 := processCPU()
	t0 := time.Now()
	rs, stop, err := r.relayers(ctx, schema, nil, func(recs []engine.Recorded) {
		for _, rec := range recs {
			if rec.State == store.Dispatched && done.n.Add(1) == int64(n) {
				once.Do(func() { close(finished) })
			}
		}
	})
	if err != nil {
		rss.MiB()
		return Result{}, err
	}
	stopProgress := r.progress(func(el time.Duration) string {
		return fmt.Sprintf("drain ordered=%v: %d/%d dispatched, %d msgs/s in the last second (%v)",
			ordered, done.n.Load(), n, done.since(), el)
	})
	select {
	case <-finished:
	case <-ctx.Done():
	}
	elapsed := time.Since(t0)
	cpu := processCPU() - cpu0
	stopProgress()
	stop()
	mib := rss.MiB()
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	if err := r.verify(ctx, schema, ordered); err != nil {
		return Result{}, err
	}
	res := Result{Workload: "drain", Ordered: ordered, Participants: r.cfg.Participants, Instructions: n,
		MsgsPerSec: float64(n) / elapsed.Seconds(), RSSMiB: mib, Seconds: elapsed.Seconds()}
	if cpu > 0 {
		res.ProcessCPUPerMsg = ptr(float64(cpu.Microseconds()) / float64(n))
	}
	writes(&res, rs)
	return res, nil
}

// writes adds the relayers' outcome writes to a drain's result.
func writes(res *Result, rs []*engine.Relayer) {
	var recorded int64
	var took time.Duration
	for _, rl := range rs {
		st := rl.Stats()
		res.OutcomeWrites += st.OutcomeWrites
		recorded += st.Dispatched + st.Retried + st.Dead + st.Released + st.Late
		took += st.OutcomeWriteTime
	}
	if res.OutcomeWrites == 0 {
		return
	}
	perWrite := float64(recorded) / float64(res.OutcomeWrites)
	ms := took.Seconds() * 1000 / float64(res.OutcomeWrites)
	res.OutcomesPerWrite, res.WriteMS = &perWrite, &ms
	if res.Ordered && ms > 0 {
		bound := float64(res.Participants) * 1000 / ms
		res.ParticipantBound = &bound
	}
}
