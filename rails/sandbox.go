package rails

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"hash/maphash"
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
	// and counting duplicates, and likewise the keys it refused for good:
	// it remembers the most recent Remember of each at least and twice as
	// many at most (0: every one, as tests need). Real
	// rails expire idempotency keys too (after a day or weeks); a long
	// soak needs the bound, or the rail's memory is what it measures.
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
	// or a paid key arriving with different payment details or metadata
	// (an event's body). Must be zero.
	EffectiveDuplicates int64
}

type sandboxPayment struct {
	outboxID  uuid.UUID
	payment   payment.Payment
	metadata  uint64 // the metadata's hash (0 without any): part of what was asked
	reference string
}

// sandboxKey is an idempotency key within its tenant's scope ("" for
// instructions without one). A struct, not the two joined into a string,
// so that a call builds no string to look it up.
type sandboxKey struct{ tenant, key string }

// Sandbox is an in-memory payment rail for tests, demos and benchmarks. It
// honours idempotency keys like a real rail should, and counts the
// duplicates it would have paid. Use [NewSandbox].
type Sandbox struct {
	opts SandboxOptions
	seed maphash.Seed // for metadata hashes

	mu       sync.Mutex
	down     error
	ledger   sandboxLedger       // the payments made (with Remember: the recent ones)
	previous sandboxLedger       // with Remember: the generation before ledger
	rejected map[sandboxKey]bool // keys rejected terminally (stay rejected)
	// rejectedBefore is, with Remember, the generation of rejected keys
	// before rejected.
	rejectedBefore map[sandboxKey]bool
	stats          SandboxStats
	attempts       map[uuid.UUID]struct{} // with RecordAttempts
}

// NewSandbox returns a sandbox transport.
func NewSandbox(opts SandboxOptions) *Sandbox {
	return &Sandbox{
		opts:     opts,
		seed:     maphash.MakeSeed(),
		ledger:   newSandboxLedger(opts.Remember),
		rejected: make(map[sandboxKey]bool),
		attempts: make(map[uuid.UUID]struct{}),
	}
}

// sandboxLedger is one generation of payments, by key and by outbox id.
type sandboxLedger struct {
	byKey    map[sandboxKey]sandboxPayment
	byOutbox map[uuid.UUID]sandboxKey // outbox id -> key it was paid under
}

// newSandboxLedger returns an empty generation with room for size
// payments (a generation holds Remember; 0 lets it grow).
func newSandboxLedger(size int) sandboxLedger {
	return sandboxLedger{byKey: make(map[sandboxKey]sandboxPayment, size), byOutbox: make(map[uuid.UUID]sandboxKey, size)}
}

// paid is the payment made under key, if the sandbox remembers one.
func (s *Sandbox) paid(key sandboxKey) (sandboxPayment, bool) {
	return recall(s.ledger.byKey, s.previous.byKey, key)
}

// paidUnder is the key outbox was paid under, if the sandbox remembers it.
func (s *Sandbox) paidUnder(outbox uuid.UUID) (sandboxKey, bool) {
	return recall(s.ledger.byOutbox, s.previous.byOutbox, outbox)
}

// recall looks k up in the current generation, then in the one before.
func recall[K comparable, V any](current, previous map[K]V, k K) (V, bool) {
	if v, ok := current[k]; ok {
		return v, true
	}
	v, ok := previous[k]
	return v, ok
}

// rotate starts a new generation once the current one holds Remember
// payments, forgetting the one before it: the sandbox then remembers the
// most recent Remember payments at least, and twice as many at most.
// Whole generations are dropped rather than the oldest payment at each new
// one, because that lookup of a long-untouched key missed the processor's
// caches at every payment (in `outbox bench`, where this process is the
// rail, the most expensive line of the rail).
func (s *Sandbox) rotate() {
	if s.opts.Remember <= 0 || len(s.ledger.byKey) < s.opts.Remember {
		return
	}
	s.previous, s.ledger = s.ledger, newSandboxLedger(s.opts.Remember)
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
	_, ok := s.paid(sandboxKey{tenant: tenantID, key: key})
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
	key := sandboxKey{tenant: ins.TenantID, key: ins.IdempotencyKey}
	var p payment.Payment
	if ins.Payment != nil {
		p = *ins.Payment
	}
	outbox := ins.OutboxID
	var meta uint64
	if len(ins.Metadata) > 0 {
		meta = maphash.Bytes(s.seed, ins.Metadata) | 1 // never 0, which means none
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	if prev, ok := s.paid(key); ok {
		if prev.payment != p || prev.outboxID != outbox || prev.metadata != meta {
			// A rail that honours keys would refuse this; ours pays it and
			// counts it, so a test can never miss a key collision.
			s.stats.EffectiveDuplicates++
		}
		s.stats.Replays++
		return Result{Code: SandboxDuplicate, Reference: prev.reference, Message: "idempotent replay"}
	}
	if s.rejected[key] || s.rejectedBefore[key] {
		s.stats.Rejected++
		return Result{Code: SandboxRejected, Message: "sandbox: rejected"}
	}
	if reject {
		if s.opts.Remember > 0 && len(s.rejected) >= s.opts.Remember {
			s.rejectedBefore, s.rejected = s.rejected, make(map[sandboxKey]bool)
		}
		s.rejected[key] = true
		s.stats.Rejected++
		return Result{Code: SandboxRejected, Message: "sandbox: rejected"}
	}
	// Instructions without an outbox id (called outside a relayer) all
	// have uuid.Nil: they are not the same outbox row, so they are neither
	// checked nor recorded by outbox id.
	hasOutbox := outbox != uuid.Nil
	if prevKey, ok := s.paidUnder(outbox); hasOutbox && ok && prevKey != key {
		s.stats.EffectiveDuplicates++
	}
	s.stats.Payments++
	// Not fmt.Sprintf: in `outbox bench` this process is the rail too, and
	// Sprintf here took about a tenth of the process's CPU (and grew the
	// stack of every dispatch goroutine), which belongs to the engine there.
	ref := "sbx_" + strconv.FormatInt(s.stats.Payments, 10)
	s.rotate()
	s.ledger.byKey[key] = sandboxPayment{outboxID: outbox, payment: p, metadata: meta, reference: ref}
	if hasOutbox {
		s.ledger.byOutbox[outbox] = key
	}
	return Result{Code: SandboxAccepted, Reference: ref}
}
