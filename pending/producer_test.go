package pending_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/attempts"
	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/pending"
)

func TestMain(m *testing.M) { testdb.Main(m) }

type testBundle struct {
	ctx      context.Context
	pool     *pgxpool.Pool
	producer *pending.Producer
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	p, err := pending.NewProducer(pending.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return &testBundle{ctx: t.Context(), pool: testdb.New(t), producer: p}
}

func payout(participant, key string) pending.Instruction {
	return pending.Instruction{
		InstructionID:  "ins-" + key,
		ParticipantID:  participant,
		IdempotencyKey: key,
		RailType:       "sandbox",
		AmountMinor:    1250,
		Currency:       "USD",
		Destination:    "acct-42",
		Metadata:       json.RawMessage(`{"invoice": "INV-1", "lines": [1, 2]}`),
	}
}

// tableCounts is the number of rows in each table an enqueue writes.
type tableCounts struct{ keys, pending, sequences int }

func (b *testBundle) counts(t *testing.T) tableCounts {
	t.Helper()
	var c tableCounts
	err := b.pool.QueryRow(b.ctx, `SELECT (SELECT count(*) FROM outbox.idempotency_keys),
		(SELECT count(*) FROM outbox.pending), (SELECT coalesce(sum(next_sequence_id - 1), 0) FROM outbox.sequences)`).
		Scan(&c.keys, &c.pending, &c.sequences)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (b *testBundle) verify(t *testing.T) attempts.Report {
	t.Helper()
	archive, _ := attempts.New("")
	r, err := archive.Verify(b.ctx, b.pool, attempts.VerifyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range r.Violations {
		t.Error(v)
	}
	return r
}

func TestEnqueueWritesPendingRow(t *testing.T) {
	t.Parallel()
	b := setup(t)

	in := payout("p1", "k1")
	in.TenantID, in.CorrelationID = "tenant-a", "corr-1"
	r, err := b.producer.Enqueue(b.ctx, b.pool, in)
	if err != nil {
		t.Fatal(err)
	}
	if r.Duplicate || r.SequenceID != 1 || r.OutboxID.Version() != uuid.V7 {
		t.Fatalf("receipt = %+v, want fresh, sequence 1, UUIDv7", r)
	}
	var got struct {
		instruction, participant, key, rail, tenant, corr string
		seq                                               int64
		attempts                                          int
		payload                                           payment.Payload
	}
	err = b.pool.QueryRow(b.ctx, `SELECT instruction_id, participant_id, idempotency_key, rail_type, tenant_id,
		correlation_id, sequence_id, attempt_count, payload FROM outbox.pending WHERE outbox_id = $1`, r.OutboxID).
		Scan(&got.instruction, &got.participant, &got.key, &got.rail, &got.tenant, &got.corr, &got.seq, &got.attempts, &got.payload)
	if err != nil {
		t.Fatal(err)
	}
	if got.instruction != in.InstructionID || got.participant != "p1" || got.key != "k1" || got.rail != "sandbox" ||
		got.tenant != "tenant-a" || got.corr != "corr-1" || got.seq != 1 || got.attempts != 0 {
		t.Errorf("pending row = %+v", got)
	}
	var meta map[string]any
	if err := json.Unmarshal(got.payload.Metadata, &meta); err != nil {
		t.Fatal(err)
	}
	if got.payload.AmountMinor != 1250 || got.payload.Currency != "USD" || got.payload.Destination != "acct-42" ||
		meta["invoice"] != "INV-1" || len(meta) != 2 {
		t.Errorf("payload = %+v (metadata %s)", got.payload, got.payload.Metadata)
	}
	b.verify(t)
}

func TestEnqueueDuplicateReturnsOriginalReceipt(t *testing.T) {
	t.Parallel()
	b := setup(t)

	first, err := b.producer.Enqueue(b.ctx, b.pool, payout("p1", "k1"))
	if err != nil {
		t.Fatal(err)
	}
	// Same key, same payload, metadata formatted differently: a duplicate.
	again := payout("p1", "k1")
	again.Metadata = json.RawMessage(`{"lines":[1,2],"invoice":"INV-1"}`)
	again.CorrelationID = "a-new-trace" // not part of what the key promised
	dup, err := b.producer.Enqueue(b.ctx, b.pool, again)
	if err != nil {
		t.Fatal(err)
	}
	if !dup.Duplicate || dup.OutboxID != first.OutboxID || dup.SequenceID != first.SequenceID {
		t.Fatalf("duplicate receipt = %+v, want original %+v with Duplicate", dup, first)
	}
	// The duplicate burned no sequence number.
	next, err := b.producer.Enqueue(b.ctx, b.pool, payout("p1", "k2"))
	if err != nil {
		t.Fatal(err)
	}
	if next.SequenceID != 2 {
		t.Fatalf("next sequence = %d, want 2", next.SequenceID)
	}
	if c := b.counts(t); c != (tableCounts{keys: 2, pending: 2, sequences: 2}) {
		t.Fatalf("counts = %+v", c)
	}
}

func TestEnqueueDuplicateAfterPendingRowIsGone(t *testing.T) {
	t.Parallel()
	b := setup(t)

	first, err := b.producer.Enqueue(b.ctx, b.pool, payout("p1", "k1"))
	if err != nil {
		t.Fatal(err)
	}
	// Dispatch takes the row out of pending; the key must still dedupe.
	if _, err := b.pool.Exec(b.ctx, `DELETE FROM outbox.pending WHERE outbox_id = $1`, first.OutboxID); err != nil {
		t.Fatal(err)
	}
	dup, err := b.producer.Enqueue(b.ctx, b.pool, payout("p1", "k1"))
	if err != nil {
		t.Fatal(err)
	}
	if !dup.Duplicate || dup.OutboxID != first.OutboxID || dup.SequenceID != 1 {
		t.Fatalf("receipt after dispatch = %+v, want duplicate of %+v", dup, first)
	}
	if c := b.counts(t); c.pending != 0 || c.keys != 1 || c.sequences != 1 {
		t.Fatalf("counts = %+v: a replay after dispatch re-enqueued the payment", c)
	}
}

func TestEnqueueMismatchWritesNothingAndKeepsTxUsable(t *testing.T) {
	t.Parallel()
	b := setup(t)

	first, err := b.producer.Enqueue(b.ctx, b.pool, payout("p1", "k1"))
	if err != nil {
		t.Fatal(err)
	}
	before := b.counts(t)

	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(b.ctx)
	changed := payout("p1", "k1")
	changed.AmountMinor = 99999
	_, err = b.producer.Enqueue(b.ctx, tx, changed)
	var mismatch *pending.MismatchError
	if !errors.Is(err, pending.ErrIdempotencyMismatch) || !errors.As(err, &mismatch) || mismatch.OutboxID != first.OutboxID {
		t.Fatalf("err = %v, want ErrIdempotencyMismatch naming %s", err, first.OutboxID)
	}
	// Also a different participant or rail under the same key is a
	// mismatch: each changes what a rail would be asked to do, and neither
	// is in the stored payload, so only the hash of what the key promised
	// (payloadHash) tells them apart.
	moved := payout("p2", "k1")
	if _, err := b.producer.Enqueue(b.ctx, tx, moved); !errors.Is(err, pending.ErrIdempotencyMismatch) {
		t.Fatalf("err = %v, want ErrIdempotencyMismatch", err)
	}
	rails := payment.DefaultCatalog()
	rails["sandbox-eu"] = rails["sandbox"] // the same validation: only the rail differs
	twoRails, err := pending.NewProducer(pending.Config{Rails: rails})
	if err != nil {
		t.Fatal(err)
	}
	rerouted := payout("p1", "k1")
	rerouted.RailType = "sandbox-eu"
	if _, err := twoRails.Enqueue(b.ctx, tx, rerouted); !errors.Is(err, pending.ErrIdempotencyMismatch) {
		t.Fatalf("same key on another rail: err = %v, want ErrIdempotencyMismatch", err)
	}
	// The caller's transaction is still usable.
	if _, err := b.producer.Enqueue(b.ctx, tx, payout("p1", "k2")); err != nil {
		t.Fatalf("transaction unusable after mismatch: %v", err)
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	after := b.counts(t)
	if after != (tableCounts{keys: before.keys + 1, pending: before.pending + 1, sequences: before.sequences + 1}) {
		t.Fatalf("counts %+v -> %+v: the mismatch wrote something", before, after)
	}
	b.verify(t)
}

func TestEnqueueRacingDuplicatesResolveToOneRow(t *testing.T) {
	t.Parallel()
	b := setup(t)

	const racers = 32
	var (
		wg       sync.WaitGroup
		start    = make(chan struct{})
		receipts = make([]pending.Receipt, racers)
		errs     = make([]error, racers)
	)
	for i := range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			receipts[i], errs[i] = b.producer.Enqueue(b.ctx, b.pool, payout("p1", "the-key"))
		}()
	}
	close(start)
	wg.Wait()
	fresh := 0
	for i := range racers {
		if errs[i] != nil {
			t.Fatalf("racer %d: %v", i, errs[i])
		}
		if receipts[i].OutboxID != receipts[0].OutboxID || receipts[i].SequenceID != 1 {
			t.Fatalf("racer %d got %+v, racer 0 got %+v", i, receipts[i], receipts[0])
		}
		if !receipts[i].Duplicate {
			fresh++
		}
	}
	if fresh != 1 {
		t.Fatalf("%d racers got a fresh receipt, want exactly 1", fresh)
	}
	if c := b.counts(t); c != (tableCounts{keys: 1, pending: 1, sequences: 1}) {
		t.Fatalf("counts = %+v", c)
	}
}

func TestEnqueueTenantScopesKeys(t *testing.T) {
	t.Parallel()
	b := setup(t)

	a, b2 := payout("p1", "k1"), payout("p1", "k1")
	a.TenantID, b2.TenantID = "tenant-a", "tenant-b"
	ra, err := b.producer.Enqueue(b.ctx, b.pool, a)
	if err != nil {
		t.Fatal(err)
	}
	rb, err := b.producer.Enqueue(b.ctx, b.pool, b2)
	if err != nil {
		t.Fatal(err)
	}
	rn, err := b.producer.Enqueue(b.ctx, b.pool, payout("p1", "k1")) // no tenant: its own scope
	if err != nil {
		t.Fatal(err)
	}
	if ra.Duplicate || rb.Duplicate || rn.Duplicate || ra.OutboxID == rb.OutboxID || rn.OutboxID == ra.OutboxID {
		t.Fatalf("receipts %+v %+v %+v: tenants must not share keys", ra, rb, rn)
	}
	again, err := b.producer.Enqueue(b.ctx, b.pool, a)
	if err != nil || !again.Duplicate || again.OutboxID != ra.OutboxID {
		t.Fatalf("repeat in tenant-a = %+v, %v", again, err)
	}
}

// TestEnqueueBatchTenantScopesKeys is TestEnqueueTenantScopesKeys for
// batches, whose statements read keys on a path of their own: a key is
// looked up in its line's tenant only. Looked up by key alone, the second
// tenant's line found the first tenant's key and was refused as a
// mismatch.
func TestEnqueueBatchTenantScopesKeys(t *testing.T) {
	t.Parallel()
	b := setup(t)
	batch := func(tenant string) []pending.Receipt {
		t.Helper()
		lines := []pending.Instruction{payout("p1", "k1"), payout("p1", "k2")}
		for i := range lines {
			lines[i].TenantID = tenant
		}
		r, err := b.producer.EnqueueBatch(b.ctx, b.pool, lines)
		if err != nil {
			t.Fatalf("batch of %q: %v", tenant, err)
		}
		return r
	}
	ra, rb := batch("tenant-a"), batch("tenant-b")
	for i := range ra {
		if ra[i].Duplicate || rb[i].Duplicate || ra[i].OutboxID == rb[i].OutboxID {
			t.Fatalf("line %d: receipts %+v and %+v: tenants must not share keys", i, ra[i], rb[i])
		}
	}
	again := batch("tenant-b")
	for i := range again {
		if !again[i].Duplicate || again[i].OutboxID != rb[i].OutboxID {
			t.Fatalf("line %d: repeat in tenant-b = %+v, want a duplicate of %+v", i, again[i], rb[i])
		}
	}
}

func TestEnqueueValidationWritesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	small, err := pending.NewProducer(pending.Config{MaxPayloadBytes: 256})
	if err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		name     string
		producer *pending.Producer
		mutate   func(*pending.Instruction)
		field    string
		reason   string
	}{
		{"empty instruction id", nil, func(in *pending.Instruction) { in.InstructionID = "" }, payment.FieldInstructionID, payment.ReasonRequired},
		{"empty participant", nil, func(in *pending.Instruction) { in.ParticipantID = "" }, payment.FieldParticipantID, payment.ReasonRequired},
		{"empty key", nil, func(in *pending.Instruction) { in.IdempotencyKey = "" }, payment.FieldIdempotencyKey, payment.ReasonRequired},
		{"blank key", nil, func(in *pending.Instruction) { in.IdempotencyKey = "   " }, payment.FieldIdempotencyKey, payment.ReasonRequired},
		{"empty rail", nil, func(in *pending.Instruction) { in.RailType = "" }, payment.FieldRail, payment.ReasonRequired},
		{"unknown rail", nil, func(in *pending.Instruction) { in.RailType = "carrier-pigeon" }, payment.FieldRail, payment.ReasonUnknownRail},
		{"zero amount", nil, func(in *pending.Instruction) { in.AmountMinor = 0 }, payment.FieldAmount, payment.ReasonNotPositive},
		{"negative amount", nil, func(in *pending.Instruction) { in.AmountMinor = -5 }, payment.FieldAmount, payment.ReasonNotPositive},
		{"amount overflow", nil, func(in *pending.Instruction) { in.AmountMinor = payment.MaxAmountMinor + 1 }, payment.FieldAmount, payment.ReasonOverflow},
		{"unknown currency", nil, func(in *pending.Instruction) { in.Currency = "ABC" }, payment.FieldCurrency, payment.ReasonUnknownCurrency},
		{"withdrawn currency", nil, func(in *pending.Instruction) { in.Currency = "DEM" }, payment.FieldCurrency, payment.ReasonUnknownCurrency},
		{"missing currency", nil, func(in *pending.Instruction) { in.Currency = "" }, payment.FieldCurrency, payment.ReasonRequired},
		{"missing destination", nil, func(in *pending.Instruction) { in.Destination = "" }, payment.FieldDestination, payment.ReasonRequired},
		{"metadata not an object", nil, func(in *pending.Instruction) { in.Metadata = json.RawMessage(`[1,2]`) }, payment.FieldMetadata, payment.ReasonInvalid},
		{"metadata broken", nil, func(in *pending.Instruction) { in.Metadata = json.RawMessage(`{"a":`) }, payment.FieldMetadata, payment.ReasonInvalid},
		{"control characters", nil, func(in *pending.Instruction) { in.InstructionID = "ins\n1" }, payment.FieldInstructionID, payment.ReasonInvalid},
		// The hardening classes: each of these reached the database (or
		// was silently altered) before.
		{"NUL in metadata", nil, func(in *pending.Instruction) { in.Metadata = json.RawMessage(`{"note":"a\u0000b"}`) }, payment.FieldMetadata, payment.ReasonInvalid},
		{"NUL in a metadata key", nil, func(in *pending.Instruction) { in.Metadata = json.RawMessage(`{"a\u0000":1}`) }, payment.FieldMetadata, payment.ReasonInvalid},
		{"invalid UTF-8 in metadata", nil, func(in *pending.Instruction) { in.Metadata = json.RawMessage("{\"note\":\"caf\xe9\"}") }, payment.FieldMetadata, payment.ReasonInvalid},
		{"lone surrogate in metadata", nil, func(in *pending.Instruction) { in.Metadata = json.RawMessage(`{"note":"\udcff"}`) }, payment.FieldMetadata, payment.ReasonInvalid},
		{"repeated metadata name", nil, func(in *pending.Instruction) { in.Metadata = json.RawMessage(`{"a":1,"a":2}`) }, payment.FieldMetadata, payment.ReasonInvalid},
		{"metadata number jsonb inflates", nil, func(in *pending.Instruction) { in.Metadata = json.RawMessage(`{"n":1e131071}`) }, payment.FieldMetadata, payment.ReasonInvalid},
		{"metadata number jsonb refuses", nil, func(in *pending.Instruction) { in.Metadata = json.RawMessage(`{"n":1e-16384}`) }, payment.FieldMetadata, payment.ReasonInvalid},
		{"trailing metadata", nil, func(in *pending.Instruction) { in.Metadata = json.RawMessage(`{"a":1} {"b":2}`) }, payment.FieldMetadata, payment.ReasonInvalid},
		{"invalid UTF-8 key", nil, func(in *pending.Instruction) { in.IdempotencyKey = "key-\xff" }, payment.FieldIdempotencyKey, payment.ReasonInvalid},
		{"invalid UTF-8 destination", nil, func(in *pending.Instruction) { in.Destination = "acct-\xfe" }, payment.FieldDestination, payment.ReasonInvalid},
		{"invalid UTF-8 currency", nil, func(in *pending.Instruction) { in.Currency = "US\xff" }, payment.FieldCurrency, payment.ReasonUnknownCurrency},
		{"C1 NEL in an id", nil, func(in *pending.Instruction) { in.InstructionID = "ins\u00851" }, payment.FieldInstructionID, payment.ReasonInvalid},
		{"bidi override in a key", nil, func(in *pending.Instruction) { in.IdempotencyKey = "key-\u202efdp" }, payment.FieldIdempotencyKey, payment.ReasonInvalid},
		{"line separator in a participant", nil, func(in *pending.Instruction) { in.ParticipantID = "p\u20281" }, payment.FieldParticipantID, payment.ReasonInvalid},
		{"zero-width space in a tenant", nil, func(in *pending.Instruction) { in.TenantID = "t\u200b1" }, payment.FieldTenantID, payment.ReasonInvalid},
		{"BOM in a correlation id", nil, func(in *pending.Instruction) { in.CorrelationID = "\ufeffc1" }, payment.FieldCorrelationID, payment.ReasonInvalid},
		{"oversized payload", small, func(in *pending.Instruction) {
			in.Metadata = json.RawMessage(`{"note":"` + strings.Repeat("x", 300) + `"}`)
		}, payment.FieldPayload, payment.ReasonTooLarge},
		{"event rail with money", nil, func(in *pending.Instruction) { in.RailType = "event" }, payment.FieldAmount, payment.ReasonNotAllowed},
		{"event rail without body", nil, func(in *pending.Instruction) {
			*in = pending.Instruction{InstructionID: "e1", ParticipantID: "p1", IdempotencyKey: "e1", RailType: "event"}
		}, payment.FieldMetadata, payment.ReasonRequired},
	}

	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(b.ctx)
	for i, tc := range cases {
		in := payout("p1", fmt.Sprintf("k%d", i))
		tc.mutate(&in)
		producer := b.producer
		if tc.producer != nil {
			producer = tc.producer
		}
		_, err := producer.Enqueue(b.ctx, tx, in)
		var verr *payment.ValidationError
		if !errors.Is(err, payment.ErrValidation) || !errors.As(err, &verr) {
			t.Errorf("%s: err = %v, want a validation error", tc.name, err)
			continue
		}
		if verr.Field != tc.field || verr.Reason != tc.reason {
			t.Errorf("%s: error names %s/%s, want %s/%s", tc.name, verr.Field, verr.Reason, tc.field, tc.reason)
		}
	}
	// Still usable, and nothing was written by the rejections.
	if _, err := b.producer.Enqueue(b.ctx, tx, payout("p1", "good")); err != nil {
		t.Fatalf("transaction unusable after validation errors: %v", err)
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	if c := b.counts(t); c != (tableCounts{keys: 1, pending: 1, sequences: 1}) {
		t.Fatalf("counts = %+v, want only the good instruction", c)
	}
}

func TestEnqueueEventRail(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r, err := b.producer.Enqueue(b.ctx, b.pool, pending.Instruction{
		InstructionID: "usage-1", ParticipantID: "tenant-9", IdempotencyKey: "usage-1", RailType: "event",
		Metadata: json.RawMessage(`{"tokens": 1234}`),
	})
	if err != nil || r.SequenceID != 1 {
		t.Fatalf("receipt %+v, err %v", r, err)
	}
}

func TestEnqueueBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)

	var ins []pending.Instruction
	for i := range 300 {
		ins = append(ins, payout(fmt.Sprintf("p%d", i%7), fmt.Sprintf("k%d", i)))
	}
	ins = append(ins, payout("p5", "k5")) // a same-batch duplicate of ins[5]
	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(b.ctx)
	receipts, err := b.producer.EnqueueBatch(b.ctx, tx, ins)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	next := map[string]int64{}
	for i, r := range receipts[:300] {
		p := ins[i].ParticipantID
		next[p]++
		if r.Duplicate || r.SequenceID != next[p] {
			t.Fatalf("receipt %d (%s) = %+v, want sequence %d in input order", i, p, r, next[p])
		}
	}
	if last := receipts[300]; !last.Duplicate || last.OutboxID != receipts[5].OutboxID {
		t.Fatalf("same-batch duplicate = %+v, want duplicate of %+v", last, receipts[5])
	}
	if c := b.counts(t); c != (tableCounts{keys: 300, pending: 300, sequences: 300}) {
		t.Fatalf("counts = %+v", c)
	}
	b.verify(t)
}

func TestEnqueueBatchMismatchWritesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)

	if _, err := b.producer.Enqueue(b.ctx, b.pool, payout("p1", "taken")); err != nil {
		t.Fatal(err)
	}
	before := b.counts(t)
	bad := payout("p1", "taken")
	bad.Destination = "somewhere-else"
	batch := []pending.Instruction{payout("p1", "a"), payout("p2", "b"), bad, payout("p3", "c")}

	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(b.ctx)
	_, err = b.producer.EnqueueBatch(b.ctx, tx, batch)
	var be *pending.BatchError
	if !errors.As(err, &be) || be.Index != 2 || !errors.Is(err, pending.ErrIdempotencyMismatch) {
		t.Fatalf("err = %v, want a mismatch at index 2", err)
	}
	// Validation errors are reported by index too, before any write.
	invalid := payout("p9", "z")
	invalid.Currency = "XXX"
	_, err = b.producer.EnqueueBatch(b.ctx, tx, []pending.Instruction{payout("p1", "y"), invalid})
	if !errors.As(err, &be) || be.Index != 1 || !errors.Is(err, payment.ErrValidation) {
		t.Fatalf("err = %v, want a validation error at index 1", err)
	}
	if _, err := b.producer.EnqueueBatch(b.ctx, tx, batch[:2]); err != nil {
		t.Fatalf("transaction unusable after a failed batch: %v", err)
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	after := b.counts(t)
	if after.keys != before.keys+2 || after.pending != before.pending+2 || after.sequences != before.sequences+2 {
		t.Fatalf("counts %+v -> %+v: the failed batches left rows behind", before, after)
	}
	b.verify(t)
}

// TestConcurrentProducersGapFree is invariant 2 under load: 16 producers,
// 50 participants, a fifth of the transactions rolled back on purpose (some
// after enqueueing several instructions), and committed sequences per
// participant must still be exactly 1..N.
func TestConcurrentProducersGapFree(t *testing.T) {
	t.Parallel()
	b := setup(t)

	const producers, perProducer, participants = 16, 60, 50
	var (
		wg        sync.WaitGroup
		mu        sync.Mutex
		committed = map[string][]int64{}
	)
	errc := make(chan error, producers)
	for w := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for i := 0; i < perProducer; {
				n := 1 + rng.IntN(3)
				var batch []pending.Instruction
				for j := 0; j < n; j++ {
					batch = append(batch, payout(fmt.Sprintf("p%d", rng.IntN(participants)), fmt.Sprintf("w%d-%d-%d", w, i, j)))
				}
				i += n
				rollback := rng.IntN(5) == 0
				got, err := enqueueInTx(b.ctx, b.pool, b.producer, batch, rollback)
				if err != nil {
					errc <- err
					return
				}
				if rollback {
					continue
				}
				mu.Lock()
				for k, r := range got {
					committed[batch[k].ParticipantID] = append(committed[batch[k].ParticipantID], r.SequenceID)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	for p, seqs := range committed {
		seen := make(map[int64]bool, len(seqs))
		for _, s := range seqs {
			if s < 1 || s > int64(len(seqs)) || seen[s] {
				t.Fatalf("participant %s: committed sequences %v are not 1..%d", p, seqs, len(seqs))
			}
			seen[s] = true
		}
	}
	b.verify(t) // the database agrees: keys, sequences and pending are gap-free
}

// enqueueInTx enqueues in a transaction (the way a service with business
// rows would), alternating between one-at-a-time and batch enqueue, and
// commits or rolls back. One-at-a-time enqueues go in participant order:
// each holds its participant's sequence row until commit, so a transaction
// touching several participants must lock them in a consistent order (the
// batch does that itself).
func enqueueInTx(ctx context.Context, pool *pgxpool.Pool, p *pending.Producer, ins []pending.Instruction, rollback bool) ([]pending.Receipt, error) {
	var out []pending.Receipt
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if len(ins)%2 == 0 {
			rs, err := p.EnqueueBatch(ctx, tx, ins)
			out = rs
			if err == nil && rollback {
				return errRollback
			}
			return err
		}
		slices.SortStableFunc(ins, func(a, b pending.Instruction) int { return strings.Compare(a.ParticipantID, b.ParticipantID) })
		for _, in := range ins {
			r, err := p.Enqueue(ctx, tx, in)
			if err != nil {
				return err
			}
			out = append(out, r)
		}
		if rollback {
			return errRollback
		}
		return nil
	})
	if errors.Is(err, errRollback) {
		return nil, nil
	}
	return out, err
}

var errRollback = errors.New("rolled back on purpose")

func TestDeterministicKey(t *testing.T) {
	t.Parallel()
	k := pending.DeterministicKey("payouts", "tenant-1", "payout-9", "v1")
	// Golden value: keys must never change across versions, or replays
	// after a deploy would stop deduplicating.
	const golden = "a6ef7b92-6601-5286-9ee0-21081afc0f4a"
	if k != golden {
		t.Fatalf("DeterministicKey changed: got %s, want %s", k, golden)
	}
	if u := uuid.FromStringOrNil(k); u.Version() != uuid.V5 {
		t.Fatalf("key %q is not a UUIDv5", k)
	}
	distinct := map[string]string{k: "base"}
	for name, other := range map[string]string{
		"namespace":        pending.DeterministicKey("refunds", "tenant-1", "payout-9", "v1"),
		"part":             pending.DeterministicKey("payouts", "tenant-1", "payout-8", "v1"),
		"concatenation":    pending.DeterministicKey("payouts", "tenant-1payout-9", "v1"),
		"shifted boundary": pending.DeterministicKey("payouts", "tenant-", "1payout-9", "v1"),
		"extra part":       pending.DeterministicKey("payouts", "tenant-1", "payout-9", "v1", ""),
		"no parts":         pending.DeterministicKey("payouts"),
	} {
		if prev, dup := distinct[other]; dup {
			t.Errorf("%s gives the same key as %s", name, prev)
		}
		distinct[other] = name
	}
}
