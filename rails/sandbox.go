package rails

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gofrs/uuid/v5"

	"github.com/ledgerline/outbox/payment"
)

// Sandbox answer codes.
const (
	SandboxAccepted    = "ACCEPTED"
	SandboxDuplicate   = "DUPLICATE" // same idempotency key seen before: the original payment stands
	SandboxUnavailable = "TEMPORARILY_UNAVAILABLE"
	SandboxRejected    = "REJECTED"
	SandboxRateLimited = "RATE_LIMITED"
)

// SandboxCodes is the sandbox's code table.
var SandboxCodes = CodeTable{
	SandboxAccepted:    {Outcome: Dispatched},
	SandboxDuplicate:   {Outcome: Dispatched},
	SandboxUnavailable: {Outcome: Retryable, Error: CodeRailUnavailable},
	SandboxRateLimited: {Outcome: Retryable, Error: CodeRateLimited},
	SandboxRejected:    {Outcome: Failed, Error: CodeRailRejected},
}

// SandboxOptions configure a [Sandbox]. Every random choice is a pure
// function of (Seed, idempotency key, attempt number), so a run is
// reproducible whatever the concurrency.
type SandboxOptions struct {
	Seed int64 `json:"seed,omitempty"`
	// LatencyMin and LatencyMax: each call takes a uniform time in between.
	LatencyMin time.Duration `json:"latency_min,omitempty"`
	LatencyMax time.Duration `json:"latency_max,omitempty"`
	// SlowRate of calls take SlowLatency instead (a latency tail).
	SlowRate    float64       `json:"slow_rate,omitempty"`
	SlowLatency time.Duration `json:"slow_latency,omitempty"`
	// RetryableRate of calls answer TEMPORARILY_UNAVAILABLE without paying.
	RetryableRate float64 `json:"retryable_rate,omitempty"`
	// TerminalRate of first-time payments are REJECTED.
	TerminalRate float64 `json:"terminal_rate,omitempty"`
	// TimeoutRate of calls pay and then never answer (until the caller's
	// deadline): the rail acted but the relayer cannot know.
	TimeoutRate float64 `json:"timeout_rate,omitempty"`
	// HangRate of calls never answer and do not pay.
	HangRate float64 `json:"hang_rate,omitempty"`
	// CrashKeys are idempotency keys whose call ends the calling process
	// at once (exit status SandboxCrashExit), as a relayer killed in the
	// middle of the call would end: poison instructions, for tests of the
	// reaper's zombie limit. Only an in-process sandbox transport can do
	// this; never configure it on a process that serves anything else.
	CrashKeys []string `json:"crash_keys,omitempty"`
	// Remember bounds the payments the sandbox keeps for answering replays
	// and counting duplicates to the most recent Remember (0: every one,
	// as tests need). Real rails expire idempotency keys too (after a day
	// or weeks); a long soak needs the bound, or the rail's memory is
	// what it measures.
	Remember int `json:"remember,omitempty"`
	// RecordAttempts keeps the id of every attempt the sandbox was called
	// for ([payment.Instruction].AttemptID; [Sandbox.AttemptIDs], GET
	// /attempts of the HTTP server), so that a test can check that the
	// outbox's archive holds every attempt that reached the rail. Its
	// memory grows with every attempt.
	RecordAttempts bool `json:"record_attempts,omitempty"`
}

// SandboxCrashExit is the exit status of a process a CrashKeys call ended.
const SandboxCrashExit = 70

// SandboxStats counts what a sandbox saw.
type SandboxStats struct {
	Calls     int64 // every Send
	Payments  int64 // distinct payments made (first acceptance of a key)
	Replays   int64 // calls with an already-paid key, answered DUPLICATE
	Rejected  int64
	Retryable int64
	Timeouts  int64 // paid, then no answer
	Hangs     int64 // no answer, not paid
	// EffectiveDuplicates counts payments the sandbox would have made twice:
	// an already-paid outbox id arriving under a different idempotency key,
	// or a paid key arriving with different payment details. Must be zero.
	EffectiveDuplicates int64
}

type sandboxPayment struct {
	outboxID  string
	payment   payment.Payment
	reference string
}

// Sandbox is an in-memory payment rail for tests, demos and benchmarks. It
// honours idempotency keys like a real rail should, and counts the
// duplicates it would have paid. Use [NewSandbox].
type Sandbox struct {
	opts SandboxOptions

	mu       sync.Mutex
	down     error
	byKey    map[string]sandboxPayment
	byOutbox map[string]string // outbox id -> key it was paid under
	rejected map[string]bool   // keys rejected terminally (stay rejected)
	recent   []string          // with Remember: the last Remember keys paid, a ring
	next     int               // the ring's oldest entry
	stats    SandboxStats
	attempts map[uuid.UUID]struct{} // with RecordAttempts
}

// NewSandbox returns a sandbox transport.
func NewSandbox(opts SandboxOptions) *Sandbox {
	return &Sandbox{
		opts:     opts,
		byKey:    make(map[string]sandboxPayment),
		byOutbox: make(map[string]string),
		rejected: make(map[string]bool),
		attempts: make(map[uuid.UUID]struct{}),
	}
}

// forgetOldest adds key to the ring of remembered payments and, once the
// ring is full, forgets the oldest one (Remember).
func (s *Sandbox) forgetOldest(key string) {
	if s.opts.Remember <= 0 {
		return
	}
	if len(s.recent) < s.opts.Remember {
		s.recent = append(s.recent, key)
		return
	}
	old := s.recent[s.next]
	if prev, ok := s.byKey[old]; ok {
		delete(s.byOutbox, prev.outboxID)
		delete(s.byKey, old)
	}
	s.recent[s.next] = key
	s.next = (s.next + 1) % len(s.recent)
}

// Codes implements [CodeProvider].
func (s *Sandbox) Codes() CodeTable { return SandboxCodes }

// SetDown makes every call fail with err before anything is sent (nil
// brings the rail back). Used to exercise circuit breakers.
func (s *Sandbox) SetDown(err error) {
	s.mu.Lock()
	s.down = err
	s.mu.Unlock()
}

// Stats returns a snapshot of the counters.
func (s *Sandbox) Stats() SandboxStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// AttemptIDs returns the ids of the attempts the sandbox was called for,
// in no particular order: every one since it started with
// RecordAttempts, none without.
func (s *Sandbox) AttemptIDs() []uuid.UUID {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := make([]uuid.UUID, 0, len(s.attempts))
	for id := range s.attempts {
		ids = append(ids, id)
	}
	return ids
}

// Paid reports whether a payment was made under a tenant's idempotency key
// (tenantID is empty for instructions without one). Keys are scoped per
// tenant, as in [Sandbox.Pay].
func (s *Sandbox) Paid(tenantID, key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.byKey[tenantID+"\x00"+key]
	return ok
}

// roll returns a deterministic number in [0,1) for a call and a purpose.
func (s *Sandbox) roll(ins payment.Instruction, purpose string) float64 {
	h := fnv.New64a()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(s.opts.Seed))
	h.Write(b[:])
	binary.LittleEndian.PutUint64(b[:], uint64(ins.AttemptNo))
	h.Write(b[:])
	h.Write([]byte(ins.TenantID + "\x00" + ins.IdempotencyKey + "\x00" + purpose))
	return float64(h.Sum64()>>11) / float64(1<<53)
}

func (s *Sandbox) latency(ins payment.Instruction) time.Duration {
	if s.opts.SlowRate > 0 && s.roll(ins, "slow") < s.opts.SlowRate {
		return s.opts.SlowLatency
	}
	d := s.opts.LatencyMin
	if s.opts.LatencyMax > d {
		d += time.Duration(s.roll(ins, "latency") * float64(s.opts.LatencyMax-d))
	}
	return d
}

// Send implements [Transport].
func (s *Sandbox) Send(ctx context.Context, ins payment.Instruction) (Result, error) {
	s.mu.Lock()
	s.stats.Calls++
	if s.opts.RecordAttempts && ins.AttemptID != uuid.Nil {
		s.attempts[ins.AttemptID] = struct{}{}
	}
	down := s.down
	s.mu.Unlock()
	if down != nil {
		return Result{}, fmt.Errorf("sandbox: %w", down)
	}
	if d := s.latency(ins); d > 0 {
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return Result{}, ctx.Err()
		case <-t.C:
		}
	}
	if slices.Contains(s.opts.CrashKeys, ins.IdempotencyKey) {
		fmt.Fprintf(os.Stderr, "sandbox: crash key %q: ending the process\n", ins.IdempotencyKey)
		os.Exit(SandboxCrashExit)
	}
	if s.opts.HangRate > 0 && s.roll(ins, "hang") < s.opts.HangRate {
		s.count(func(st *SandboxStats) { st.Hangs++ })
		<-ctx.Done()
		return Result{}, ctx.Err()
	}
	if err := payable(ins); err != nil {
		// A real rail refuses a request it could not pay, whoever signed
		// it; it neither pays nor remembers the key.
		s.count(func(st *SandboxStats) { st.Rejected++ })
		return Result{Code: SandboxRejected, Message: "sandbox: cannot pay: " + err.Error()}, nil
	}
	if s.opts.RetryableRate > 0 && s.roll(ins, "retryable") < s.opts.RetryableRate {
		s.count(func(st *SandboxStats) { st.Retryable++ })
		return Result{Code: SandboxUnavailable, Message: "sandbox: try again later"}, nil
	}
	res := s.Pay(ins, s.opts.TerminalRate > 0 && s.roll(ins, "terminal") < s.opts.TerminalRate)
	if res.Code == SandboxAccepted && s.opts.TimeoutRate > 0 && s.roll(ins, "timeout") < s.opts.TimeoutRate {
		s.count(func(st *SandboxStats) { st.Timeouts++ })
		<-ctx.Done()
		return Result{}, ctx.Err()
	}
	return res, nil
}

// payable checks what any rail checks before moving money: a payment has a
// positive amount within [payment.MaxAmountMinor], an active ISO 4217 currency and
// a destination; an instruction without a payment is an event and must
// carry one (its metadata). Callers outside a relayer (the HTTP server's
// clients) are not trusted to have validated anything.
func payable(ins payment.Instruction) error {
	if p := ins.Payment; p != nil {
		if err := payment.ValidateAmount(p.AmountMinor); err != nil {
			return err
		}
		if err := payment.ValidateCurrency(p.Currency); err != nil {
			return err
		}
		if strings.TrimSpace(p.Destination) == "" {
			return payment.Invalid(payment.FieldDestination, payment.ReasonRequired, "destination is required")
		}
		return nil
	}
	if len(bytes.TrimSpace(ins.Metadata)) == 0 {
		return payment.Invalid(payment.FieldAmount, payment.ReasonRequired, "neither a payment nor an event: nothing to pay or deliver")
	}
	return nil
}

func (s *Sandbox) count(f func(*SandboxStats)) {
	s.mu.Lock()
	f(&s.stats)
	s.mu.Unlock()
}

// Pay is the sandbox's ledger: it pays an instruction once per idempotency
// key, answers DUPLICATE for a paid key, and keeps a terminal rejection
// (reject=true on first sight) for the key's lifetime. Exported so the HTTP
// sandbox server shares the same ledger logic.
func (s *Sandbox) Pay(ins payment.Instruction, reject bool) Result {
	key := ins.TenantID + "\x00" + ins.IdempotencyKey
	var p payment.Payment
	if ins.Payment != nil {
		p = *ins.Payment
	}
	outbox := ins.OutboxID.String()

	s.mu.Lock()
	defer s.mu.Unlock()
	if prev, ok := s.byKey[key]; ok {
		if prev.payment != p || prev.outboxID != outbox {
			// A rail that honours keys would refuse this; ours pays it and
			// counts it, so a test can never miss a key collision.
			s.stats.EffectiveDuplicates++
		}
		s.stats.Replays++
		return Result{Code: SandboxDuplicate, Reference: prev.reference, Message: "idempotent replay"}
	}
	if s.rejected[key] {
		s.stats.Rejected++
		return Result{Code: SandboxRejected, Message: "sandbox: rejected"}
	}
	if reject {
		s.rejected[key] = true
		s.stats.Rejected++
		return Result{Code: SandboxRejected, Message: "sandbox: rejected"}
	}
	// Instructions without an outbox id (called outside a relayer) all
	// have uuid.Nil: they are not the same outbox row, so they are neither
	// checked nor recorded by outbox id.
	hasOutbox := ins.OutboxID != uuid.Nil
	if prevKey, ok := s.byOutbox[outbox]; hasOutbox && ok && prevKey != key {
		s.stats.EffectiveDuplicates++
	}
	s.stats.Payments++
	// Not fmt.Sprintf: in `outbox bench` this process is the rail too, and
	// Sprintf here took about a tenth of the process's CPU (and grew the
	// stack of every dispatch goroutine), which belongs to the engine there.
	ref := "sbx_" + strconv.FormatInt(s.stats.Payments, 10)
	s.byKey[key] = sandboxPayment{outboxID: outbox, payment: p, reference: ref}
	if hasOutbox {
		s.byOutbox[outbox] = key
	}
	s.forgetOldest(key)
	return Result{Code: SandboxAccepted, Reference: ref}
}
