// Package pending owns the hot queue: producers enqueue instructions in
// their own transaction (with permanent idempotency and gap-free
// per-participant sequences), and relayers claim due instructions from it.
package pending

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ledgerline/outbox/migrations"
	"github.com/ledgerline/outbox/rails"
)

// DBTX is the part of a connection the producer uses. The caller's pgx.Tx
// is the intended argument (the instruction commits or rolls back with the
// caller's business rows); *pgxpool.Pool and *pgx.Conn also satisfy it, in
// which case each call is its own transaction.
type DBTX interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Config configures a [Producer].
type Config struct {
	// Schema holding the outbox tables; "" means the default.
	Schema string
	// Rails are the rail types producers may use and how each validates;
	// nil means [rails.DefaultCatalog] (sandbox and event).
	Rails rails.Catalog
	// MaxPayloadBytes limits the encoded payload; 0 means 64 KiB.
	MaxPayloadBytes int
}

// Producer enqueues instructions. It is safe for concurrent use.
type Producer struct {
	rails      rails.Catalog
	maxPayload int
	sql        producerSQL
}

// NewProducer validates cfg and returns a Producer.
func NewProducer(cfg Config) (*Producer, error) {
	if err := migrations.ValidateSchema(cfg.Schema); err != nil {
		return nil, err
	}
	if cfg.Rails == nil {
		cfg.Rails = rails.DefaultCatalog()
	}
	if cfg.MaxPayloadBytes <= 0 {
		cfg.MaxPayloadBytes = rails.DefaultMaxPayloadBytes
	}
	return &Producer{rails: cfg.Rails, maxPayload: cfg.MaxPayloadBytes, sql: newProducerSQL(cfg.Schema)}, nil
}

var defaultProducer, _ = NewProducer(Config{})

// Enqueue enqueues one instruction with the default configuration (default
// schema, sandbox and event rails). See [Producer.Enqueue].
func Enqueue(ctx context.Context, tx DBTX, in Instruction) (Receipt, error) {
	return defaultProducer.Enqueue(ctx, tx, in)
}

// EnqueueBatch enqueues instructions with the default configuration. See
// [Producer.EnqueueBatch].
func EnqueueBatch(ctx context.Context, tx DBTX, ins []Instruction) ([]Receipt, error) {
	return defaultProducer.EnqueueBatch(ctx, tx, ins)
}

// Enqueue validates in and, in tx, records its idempotency key, allocates
// the participant's next sequence id and inserts it into the pending queue,
// all in one round trip.
//
// An invalid instruction returns a [*rails.ValidationError] (errors.Is
// rails.ErrValidation) before anything is sent to the database. A key seen
// before with the same payload returns the original receipt with
// Duplicate=true (no sequence id is used), even long after the instruction
// was dispatched; with a different payload it returns a [*MismatchError]
// (errors.Is ErrIdempotencyMismatch). In both cases nothing is written and
// tx remains usable.
//
// The participant's sequence row stays locked until tx ends (that is what
// keeps sequences gap-free), so a transaction that enqueues for several
// participants should do so in a consistent order, or use EnqueueBatch,
// which locks them in participant order; otherwise two such transactions
// can deadlock.
func (p *Producer) Enqueue(ctx context.Context, tx DBTX, in Instruction) (Receipt, error) {
	rs, err := p.EnqueueBatch(ctx, tx, []Instruction{in})
	if err != nil {
		if be := (*BatchError)(nil); errors.As(err, &be) {
			return Receipt{}, be.Err
		}
		return Receipt{}, err
	}
	return rs[0], nil
}

// EnqueueBatch enqueues many instructions in a few round trips, with the
// semantics of [Producer.Enqueue] for each. Receipts are in input order. If
// any instruction is invalid or mismatches its key, the error is a
// [*BatchError] naming it and nothing of the batch is written (a savepoint
// undoes the rest, so tx remains usable).
func (p *Producer) EnqueueBatch(ctx context.Context, tx DBTX, ins []Instruction) ([]Receipt, error) {
	if len(ins) == 0 {
		return nil, nil
	}
	preps := make([]prepared, len(ins))
	for i, in := range ins {
		pr, err := p.prepare(in)
		if err != nil {
			return nil, &BatchError{Index: i, Err: err}
		}
		preps[i] = pr
	}
	if len(preps) == 1 {
		// A lone instruction that mismatches writes nothing in the first
		// place: no savepoint needed.
		return p.write(ctx, tx, preps)
	}
	sp, err := tx.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("enqueue: begin: %w", err)
	}
	receipts, err := p.write(ctx, sp, preps)
	if err != nil {
		_ = sp.Rollback(ctx)
		return nil, err
	}
	if err := sp.Commit(ctx); err != nil {
		return nil, fmt.Errorf("enqueue: commit: %w", err)
	}
	return receipts, nil
}

// prepare validates an instruction and encodes its payload.
func (p *Producer) prepare(in Instruction) (prepared, error) {
	profile, err := p.rails.Lookup(in.RailType)
	if err != nil {
		return prepared{}, err
	}
	if err := profile.Validate(in.RailInstruction(profile.MovesMoney())); err != nil {
		return prepared{}, err
	}
	meta, err := canonicalJSON(in.Metadata)
	if err != nil {
		return prepared{}, &rails.ValidationError{Field: rails.FieldMetadata, Reason: rails.ReasonInvalid, Message: "metadata is not valid JSON"}
	}
	payload, err := json.Marshal(Payload{AmountMinor: in.AmountMinor, Currency: in.Currency, Destination: in.Destination, Metadata: meta})
	if err != nil {
		return prepared{}, fmt.Errorf("enqueue: encode payload: %w", err)
	}
	if len(payload) > p.maxPayload {
		return prepared{}, &rails.ValidationError{Field: rails.FieldPayload, Reason: rails.ReasonTooLarge,
			Message: fmt.Sprintf("payload is %d bytes, the limit is %d", len(payload), p.maxPayload)}
	}
	id, err := uuid.NewV7()
	if err != nil {
		return prepared{}, fmt.Errorf("enqueue: outbox id: %w", err)
	}
	return prepared{in: in, outboxID: id, payload: payload, hash: payloadHash(in, payload)}, nil
}

// write sends the three statements of an enqueue as one pipelined batch:
// claim the keys, allocate sequences and insert the instructions whose key
// is new, then read back what every key maps to.
func (p *Producer) write(ctx context.Context, db DBTX, preps []prepared) ([]Receipt, error) {
	n := len(preps)
	var (
		ords                                                        = make([]int32, n)
		ids                                                         = make([]uuid.UUID, n)
		instrIDs, participants, keys, railTypes, tenants, correlats = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		payloads                                                    = make([]string, n)
		hashes                                                      = make([][]byte, n)
	)
	for i, pr := range preps {
		ords[i], ids[i], hashes[i], payloads[i] = int32(i), pr.outboxID, pr.hash, string(pr.payload)
		instrIDs[i], participants[i], keys[i] = pr.in.InstructionID, pr.in.ParticipantID, pr.in.IdempotencyKey
		railTypes[i], tenants[i], correlats[i] = pr.in.RailType, pr.in.TenantID, pr.in.CorrelationID
	}

	b := &pgx.Batch{}
	b.Queue(p.sql.insertKeys, tenants, instrIDs, keys, ids, participants, hashes)
	b.Queue(p.sql.insertPending, ids, ords, instrIDs, participants, keys, railTypes, tenants, correlats, payloads)
	b.Queue(p.sql.lookupKeys, tenants, instrIDs, keys, ords)
	br := db.SendBatch(ctx, b)
	defer br.Close()

	if _, err := br.Exec(); err != nil {
		return nil, fmt.Errorf("enqueue: insert idempotency keys: %w", err)
	}
	if _, err := br.Exec(); err != nil {
		return nil, fmt.Errorf("enqueue: insert pending: %w", err)
	}
	rows, err := br.Query()
	if err != nil {
		return nil, fmt.Errorf("enqueue: read receipts: %w", err)
	}
	receipts := make([]Receipt, n)
	seen := make([]bool, n)
	var (
		ord      int32
		outboxID uuid.UUID
		seq      *int64
		hash     []byte
	)
	_, err = pgx.ForEachRow(rows, []any{&ord, &outboxID, &seq, &hash}, func() error {
		i := int(ord)
		pr := preps[i]
		switch {
		case outboxID == pr.outboxID && seq != nil:
			receipts[i] = Receipt{OutboxID: outboxID, SequenceID: *seq}
		case outboxID == pr.outboxID:
			return fmt.Errorf("enqueue: instruction %d got no sequence id", i)
		case !bytes.Equal(hash, pr.hash):
			return &BatchError{Index: i, Err: &MismatchError{InstructionID: pr.in.InstructionID, IdempotencyKey: pr.in.IdempotencyKey, OutboxID: outboxID}}
		case seq == nil:
			// Only visible inside its own transaction; cannot happen for a
			// committed key, and a same-batch twin resolves above.
			return fmt.Errorf("enqueue: instruction %d: key %q has no sequence id", i, pr.in.IdempotencyKey)
		default:
			receipts[i] = Receipt{OutboxID: outboxID, SequenceID: *seq, Duplicate: true}
		}
		seen[i] = true
		return nil
	})
	if err != nil {
		return nil, err
	}
	for i, ok := range seen {
		if !ok {
			return nil, fmt.Errorf("enqueue: instruction %d: idempotency key not found after insert", i)
		}
	}
	return receipts, br.Close()
}

// producerSQL holds the producer's statements rendered for one schema.
type producerSQL struct {
	insertKeys, insertPending, lookupKeys string
}

func newProducerSQL(schema string) producerSQL {
	return producerSQL{
		insertKeys:    migrations.Qualify(schema, insertKeysSQL),
		insertPending: migrations.Qualify(schema, insertPendingSQL),
		lookupKeys:    migrations.Qualify(schema, lookupKeysSQL),
	}
}

// insertKeysSQL claims each idempotency key for a new outbox id. A key that
// exists (committed, or inserted by a concurrent transaction that then
// commits) is left alone; the statement waits for a concurrent inserter to
// finish, so racing duplicates resolve to exactly one row.
const insertKeysSQL = `
INSERT INTO {schema}.idempotency_keys (tenant_id, instruction_id, idempotency_key, outbox_id, participant_id, payload_hash)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::uuid[], $5::text[], $6::bytea[])
ON CONFLICT DO NOTHING`

// insertPendingSQL allocates sequence ids and inserts pending rows only for
// instructions whose key row above carries their own, still unsequenced,
// outbox id: duplicates use no sequence id. Ids are handed out per
// participant in input order.
const insertPendingSQL = `
WITH input AS (
  SELECT * FROM unnest($1::uuid[], $2::int[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[], $9::text[])
    AS u(outbox_id, ord, instruction_id, participant_id, idempotency_key, rail_type, tenant_id, correlation_id, payload)
), fresh AS (
  SELECT i.* FROM input i
  JOIN {schema}.idempotency_keys k ON k.outbox_id = i.outbox_id AND k.sequence_id IS NULL
), counts AS (
  SELECT participant_id, count(*)::int AS n FROM fresh GROUP BY participant_id
), firsts AS (
  SELECT b.participant_id, b.first_sequence_id
  FROM {schema}.bump_sequences((SELECT array_agg(participant_id) FROM counts), (SELECT array_agg(n) FROM counts)) b
), numbered AS (
  SELECT f.*, fi.first_sequence_id + row_number() OVER (PARTITION BY f.participant_id ORDER BY f.ord) - 1 AS sequence_id
  FROM fresh f JOIN firsts fi USING (participant_id)
), inserted AS (
  INSERT INTO {schema}.pending (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key,
                                rail_type, tenant_id, correlation_id, payload)
  SELECT outbox_id, instruction_id, participant_id, sequence_id, idempotency_key,
         rail_type, nullif(tenant_id, ''), nullif(correlation_id, ''), payload::jsonb
  FROM numbered
)
UPDATE {schema}.idempotency_keys k SET sequence_id = n.sequence_id
FROM numbered n WHERE k.outbox_id = n.outbox_id`

// lookupKeysSQL reads what every key of the batch maps to now.
const lookupKeysSQL = `
SELECT i.ord, k.outbox_id, k.sequence_id, k.payload_hash
FROM unnest($1::text[], $2::text[], $3::text[], $4::int[]) AS i(tenant_id, instruction_id, idempotency_key, ord)
JOIN {schema}.idempotency_keys k USING (tenant_id, instruction_id, idempotency_key)`

// Validate checks an instruction exactly as Enqueue would, without touching
// the database.
func (p *Producer) Validate(in Instruction) error {
	_, err := p.prepare(in)
	return err
}
