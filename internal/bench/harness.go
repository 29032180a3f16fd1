package bench

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/jackc/pgx/v5"

	"github.com/ledgerline/outbox/engine"
	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/pending"
	"github.com/ledgerline/outbox/rails"
)

// instruction is the n-th instruction of a run: a sandbox payment of
// participant n mod participants.
func instruction(run uint32, n, participants int) pending.Instruction {
	id := fmt.Sprintf("bench-%x-%d", run, n)
	return pending.Instruction{
		InstructionID: id, ParticipantID: fmt.Sprintf("p%05d", n%participants), IdempotencyKey: id,
		RailType: "sandbox", AmountMinor: 1000, Currency: "USD", Destination: "acct-1",
	}
}

// fill enqueues n instructions over the configured participants, 1,000 per
// transaction.
func (r *runner) fill(ctx context.Context, schema string, n int) error {
	run := rand.Uint32()
	producer, err := pending.NewProducer(pending.Config{Schema: schema})
	if err != nil {
		return err
	}
	for start := 0; start < n; start += 1000 {
		batch := make([]pending.Instruction, 0, 1000)
		for i := start; i < min(start+1000, n); i++ {
			batch = append(batch, instruction(run, i, r.cfg.Participants))
		}
		if err := pgx.BeginFunc(ctx, r.cfg.Pool, func(tx pgx.Tx) error {
			_, err := producer.EnqueueBatch(ctx, tx, batch)
			return err
		}); err != nil {
			return err
		}
	}
	return nil
}

// calledTransport is the sandbox rail, telling onCall of every call first.
type calledTransport struct {
	*rails.Sandbox
	onCall func(payment.Instruction)
}

func (t calledTransport) Send(ctx context.Context, ins payment.Instruction) (rails.Result, error) {
	if t.onCall != nil {
		t.onCall(ins)
	}
	return t.Sandbox.Send(ctx, ins)
}

// sandboxRemember is how many recent payments the bench's sandbox rail
// keeps at least to answer replays (twice as many at most): 5 s at
// 1,000/s, more than any instruction waits between its attempts in a run
// (no workload makes the rail fail). Small, so that a soak's rail reaches
// its size in its first seconds: TestSoakStaysBounded reads a live heap
// that steps up after 20 s as growth.
const sandboxRemember = 5_000

// relayers starts the run's relayers on schema. onCall sees every rail
// call, observe every recorded outcome; stop stops them all.
func (r *runner) relayers(ctx context.Context, schema string, onCall func(payment.Instruction),
	observe func([]engine.Recorded)) (rs []*engine.Relayer, stop func(), err error) {
	// The rail remembers the last sandboxRemember payments, not all: a
	// soak's RSS is then the engine's, not the fake rail's ledger.
	sbx := rails.NewSandbox(rails.SandboxOptions{LatencyMin: r.cfg.RailLatency, LatencyMax: r.cfg.RailLatency,
		Remember: sandboxRemember})
	conc := r.cfg.MaxConcurrency
	if conc <= 0 {
		conc = engine.DefaultMaxConcurrency
	}
	set, err := rails.NewSet(rails.Options{Type: "sandbox", Profile: payment.Generic{},
		Transport: calledTransport{Sandbox: sbx, onCall: onCall}, MaxConcurrency: conc})
	if err != nil {
		return nil, nil, err
	}
	stop = func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, r := range rs {
			_ = r.Stop(sctx)
		}
	}
	for i := range r.cfg.Relayers {
		rl, err := engine.New(r.relayerDB, engine.Config{Schema: schema, RelayerID: fmt.Sprintf("bench-%d", i), Rails: set,
			MaxConcurrency: r.cfg.MaxConcurrency, BatchSize: r.cfg.BatchSize, FlushSize: r.cfg.FlushSize, OnRecorded: observe})
		if err != nil {
			stop()
			return nil, nil, err
		}
		if err := rl.Start(ctx); err != nil {
			stop()
			return nil, nil, err
		}
		rs = append(rs, rl)
	}
	return rs, stop, nil
}

// rssSampler keeps the largest resident set of this process seen since
// it started, sampling every 100 ms.
type rssSampler struct {
	max  atomic.Int64 // bytes
	stop chan struct{}
	done chan struct{}
}

func sampleRSS() *rssSampler {
	s := &rssSampler{stop: make(chan struct{}), done: make(chan struct{})}
	s.sample()
	go func() {
		defer close(s.done)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-s.stop:
				s.sample()
				return
			case <-t.C:
				s.sample()
			}
		}
	}()
	return s
}

func (s *rssSampler) sample() {
	if b := currentRSS(); b > s.max.Load() {
		s.max.Store(b)
	}
}

// MiB stops sampling and returns the largest resident set seen, in MiB.
func (s *rssSampler) MiB() float64 {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
	return float64(s.max.Load()) / (1 << 20)
}

// processCPU is the processor time (user and system) this process has
// used so far; zero where getrusage cannot say.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// currentRSS is this process's resident set in bytes (0 where /proc is not
// there to say).
func currentRSS() int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}

// progress prints, once a second until stop is called, what line returns.
func (r *runner) progress(line func(elapsed time.Duration) string) (stop func()) {
	if r.cfg.Progress == nil {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	start := time.Now()
	go func() {
		defer wg.Done()
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				fmt.Fprintln(r.cfg.Progress, line(time.Since(start).Round(time.Second)))
			}
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(done); wg.Wait() }) }
}

// rate counts events and tells how many happened since the last call.
type rate struct {
	n    atomic.Int64
	last int64
}

func (c *rate) since() int64 {
	n := c.n.Load()
	d := n - c.last
	c.last = n
	return d
}

// newHistogram records latencies in microseconds, up to an hour, with
// three significant digits.
func newHistogram() *hdrhistogram.Histogram {
	return hdrhistogram.New(1, int64(time.Hour/time.Microsecond), 3)
}

// ms is the value at quantile q of h (microseconds) in milliseconds.
func ms(h *hdrhistogram.Histogram, q float64) *float64 {
	v := float64(h.ValueAtQuantile(q)) / 1000
	return &v
}

func ptr[T any](v T) *T { return &v }

// streamRun is an open-loop stream under way (see runner.stream).
type streamRun struct {
	done   chan struct{} // closed once the schedule ended and every producer returned
	missed atomic.Int64  // numbers nobody could take on schedule
	ctx    context.Context
}

// err is the context's error, if the stream ended because of it.
func (s *streamRun) err() error { return s.ctx.Err() }

// stream hands out instruction numbers 0, 1, 2, ... on a fixed schedule of
// Rate per second for d to at least latencyProducers producers calling
// produce; a number nobody can take when due counts as missed (the stream
// fell behind), so the rate achieved is the rate measured.
func (r *runner) stream(ctx context.Context, d time.Duration, produce func(i int)) *streamRun {
	s := &streamRun{done: make(chan struct{}), ctx: ctx}
	work := make(chan int, r.cfg.Rate)
	var wg sync.WaitGroup
	for range max(r.cfg.Producers, latencyProducers) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				produce(i)
			}
		}()
	}
	interval := time.Second / time.Duration(r.cfg.Rate)
	go func() {
		defer close(s.done)
		defer wg.Wait()
		defer close(work)
		t0 := time.Now()
		for i := 0; ; i++ {
			due := t0.Add(time.Duration(i) * interval)
			if due.Sub(t0) >= d || ctx.Err() != nil {
				return
			}
			if w := time.Until(due); w > 0 {
				time.Sleep(w)
			}
			select {
			case work <- i:
			default:
				s.missed.Add(1)
			}
		}
	}()
	return s
}
