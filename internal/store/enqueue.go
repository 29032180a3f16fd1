package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// NewInstruction is an instruction the producer validated and encoded, to
// be enqueued under a fresh outbox id.
type NewInstruction struct {
	OutboxID       uuid.UUID
	InstructionID  string
	ParticipantID  string
	IdempotencyKey string
	RailType       string
	TenantID       string // "" for none
	CorrelationID  string // "" for none
	Payload        []byte // JSON
	PayloadHash    []byte // what the key promises (see the producer)
}

// KeyRow is what an instruction's idempotency key maps to after an
// enqueue: its own fresh outbox id, or the one it was first enqueued under.
type KeyRow struct {
	OutboxID uuid.UUID
	// InstructionID is the instruction the key belongs to: a key belongs
	// to one instruction id per tenant (migration 028), and one enqueued
	// under another id is not the same instruction. "" for a retired key.
	InstructionID string
	SequenceID    *int64 // nil only for a key another transaction has not committed yet, or a retired one
	PayloadHash   []byte // nil for a retired key
	// Retired says the key was used by an instruction whose archive months
	// were detached: only its digest and outbox id remain, and it can never
	// be enqueued again.
	Retired bool
	// OwnerKey is set when the key was not found but the instruction id
	// was, under this other key: an instruction id takes one key per
	// tenant (migration 030), and OutboxID is then that key's instruction.
	OwnerKey string
}

// ErrKeyRetired is returned when an idempotency key was retired (its
// instruction's archive months detached, see RetireKeys) while the
// enqueue's transaction was inserting it; the transaction is aborted.
var ErrKeyRetired = errors.New("idempotency key retired")

// retiredRaceCode is the SQLSTATE key_retired_race raises (migration 011).
const retiredRaceCode = "OBKR1"

// Enqueue writes instructions in db (the caller's transaction) in one
// round trip of three pipelined statements: claim each idempotency key for
// its fresh outbox id (a key that exists is left alone; a concurrent
// inserter of the same key is waited for, so racing duplicates resolve to
// one row); allocate sequence ids and insert pending rows only for the
// instructions whose key is theirs (duplicates use no sequence id); read
// back what every key maps to (or, for a key the insert left out because
// its instruction id has another key, what that key maps to). It returns
// one KeyRow per instruction, in input order; telling fresh from
// duplicate and mismatch is the caller's business.
//
// The participants' sequence rows stay locked until the caller's
// transaction ends: that keeps committed sequences gap-free. Keys are
// claimed in key order and participants locked in participant order, so
// concurrent batches wait for each other but do not deadlock.
func (s *Store) Enqueue(ctx context.Context, db Batcher, ins []NewInstruction) ([]KeyRow, error) {
	n := len(ins)
	var (
		ords                                                        = make([]int32, n)
		instrIDs, participants, keys, railTypes, tenants, correlats = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		payloads                                                    = make([]string, n)
		hashes                                                      = make([][]byte, n)
	)
	for i, in := range ins {
		ords[i], hashes[i], payloads[i] = int32(i), in.PayloadHash, string(in.Payload)
		instrIDs[i], participants[i], keys[i] = in.InstructionID, in.ParticipantID, in.IdempotencyKey
		railTypes[i], tenants[i], correlats[i] = in.RailType, in.TenantID, in.CorrelationID
	}

	ids := wireUUIDs(ins, func(in *NewInstruction) uuid.UUID { return in.OutboxID })
	b := &pgx.Batch{}
	if n == 1 { // the common case: one instruction per business transaction
		b.Queue(s.sql.insertKeyOne, tenants[0], instrIDs[0], keys[0], ids[0], participants[0], hashes[0])
		b.Queue(s.sql.insertPendingOne, ids[0], railTypes[0], correlats[0], payloads[0])
		b.Queue(s.sql.lookupKeyOne, tenants[0], instrIDs[0], keys[0], ids[0])
	} else {
		b.Queue(s.sql.insertKeys, tenants, instrIDs, keys, ids, participants, hashes)
		b.Queue(s.sql.insertPending, ids, railTypes, correlats, payloads)
		b.Queue(s.sql.lookupKeys, tenants, instrIDs, keys, ords, ids)
	}
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
		return nil, receiptsError(err)
	}
	out := make([]KeyRow, n)
	seen := make([]bool, n)
	var (
		ord int32
		kr  KeyRow
	)
	var (
		race            *bool
		instr, ownerKey *string
	)
	_, err = pgx.ForEachRow(rows, []any{&ord, scanUUID(&kr.OutboxID), &kr.SequenceID, &kr.PayloadHash, &instr, &ownerKey, &kr.Retired, &race}, func() error {
		if instr != nil {
			kr.InstructionID = *instr
		}
		if ownerKey != nil {
			kr.OwnerKey = *ownerKey
		}
		out[ord], seen[ord] = kr, true
		kr = KeyRow{}
		return nil
	})
	if err != nil {
		return nil, receiptsError(err)
	}
	for i, ok := range seen {
		if !ok {
			return nil, fmt.Errorf("enqueue: instruction %d: idempotency key not found after insert", i)
		}
	}
	return out, br.Close()
}

// receiptsError wraps an error of the receipts' lookup; the retirement
// race (key_retired_race) is ErrKeyRetired.
func receiptsError(err error) error {
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == retiredRaceCode {
		return fmt.Errorf("enqueue: %w: %s", ErrKeyRetired, pgErr.Message)
	}
	return fmt.Errorf("enqueue: read receipts: %w", err)
}

// orderedSQL is whether per-participant ordering is on.
const orderedSQL = `(SELECT ordered FROM {schema}.settings)`

// The batch statements below reach keys by key, one lookup per
// instruction (LATERAL subqueries with a LIMIT, which the planner cannot
// turn into joins; scalar subqueries; row ids), never by a join the
// planner picks: the keys table is permanent and large, and when its
// statistics say it is empty (the first vacuum of the pre-sized table
// records 0 rows on 200 pages, and PostgreSQL then estimates one row
// whatever it holds until the next ANALYZE), the chosen joins scanned it
// whole for every instruction. BenchmarkEnqueueBatch1000 (pending; 30
// batches of 1,000 on a fresh schema) took 2.1 s a batch in runs that met
// such statistics and 0.15 s in the others; keyed, 0.05 s in every run.
// TestEnqueueReadsKeysPerInstruction.

// insertKeysSQL claims each idempotency key for a new outbox id. A key that
// exists (committed, or inserted by a concurrent transaction that then
// commits) is left alone; the statement waits for a concurrent inserter to
// finish, so racing duplicates resolve to exactly one row. ON CONFLICT
// names no index, so the same holds for an instruction id that has
// another key (the unique index on instruction id and tenant, migration
// 030): not inserted, a racing one waited for, and the lookup reports the
// key it has. A retired key (archive.go) is not inserted either: the
// lookup reports it.
//
// Keys are inserted in key order (tenant and key, the unique index's
// columns), not input order: an inserted key is held until the
// transaction ends, and a concurrent inserter of it waits, so two batches
// sharing keys in different orders (a retried batch, reordered) each
// claimed part and waited for the other's part: a deadlock. In one order,
// the later batch waits at the first key they share and holds none the
// earlier one needs. (Byte order, "C": any order both use will do, and it
// is the cheapest to sort by.) Twins of one key in a batch stay in input
// order, whatever their instruction ids, so the first line claims it and
// the later ones are its duplicates or mismatches; which receipt goes with
// which line is the lookup's business, by ord, and does not change. Lines
// of one instruction id under different keys would go by key order here
// (the smallest key wins); the producer refuses all but the first line's
// key before it sends a batch.
// TestBatchesWithSharedKeysInOppositeOrdersDoNotDeadlock (pending).
const insertKeysSQL = `
INSERT INTO {schema}.idempotency_keys (tenant_id, instruction_id, idempotency_key, outbox_id, participant_id, payload_hash)
SELECT u.t, u.i, u.k, u.o, u.p, u.h
FROM unnest($1::text[], $2::text[], $3::text[], $4::uuid[], $5::text[], $6::bytea[]) WITH ORDINALITY AS u(t, i, k, o, p, h, n)
WHERE (SELECT true FROM {schema}.retired_keys r WHERE r.digest = {schema}.key_digest(u.t, u.i, u.k)) IS NULL
ORDER BY u.t COLLATE "C", u.k COLLATE "C", u.n
ON CONFLICT DO NOTHING`

// insertPendingSQL allocates sequence ids and inserts pending rows only for
// instructions whose key row above carries their own, still unsequenced,
// outbox id: duplicates use no sequence id. Ids are handed out per
// participant in input order. With ordering on, a new row is due at once
// only if it is its participant's head (nothing was pending or in flight
// before it: queued_before = 0, read under the participant's row lock);
// the others wait (next_attempt_at = 'infinity') until the outcome of the
// row before them hands them on (record.go, handoff.go).
//
// The statement is enqueue_pending_batch's (migration 033), which reads
// each instruction's identity from its key row and, where the roles are in
// place, runs as the owner: producers may not insert pending rows or
// allocate sequence ids themselves, so neither can happen outside an
// enqueue (a sequence id without its instruction strands its participant).
const insertPendingSQL = `SELECT {schema}.enqueue_pending_batch($1::uuid[], $2::text[], $3::text[], $4::text[])`

// The one-instruction forms of the three statements above: one
// instruction per business transaction is the common case. They take
// scalar parameters, so PostgreSQL keeps a generic plan for them (an array
// parameter's length is unknown to a generic plan, and it replanned the
// batch forms on every call: 0.3 ms of the enqueue's 0.5 ms of database
// time), and they leave out what only a batch needs (grouping by
// participant, numbering within one, joining input rows): starting the
// executor on the batch forms' plans was a sixth of the enqueue's
// processor time. Same semantics, row for row:
// TestSingleAndBatchEnqueueAgree holds them to it.
const (
	// insertKeyOneSQL is insertKeysSQL for one key.
	insertKeyOneSQL = `
INSERT INTO {schema}.idempotency_keys (tenant_id, instruction_id, idempotency_key, outbox_id, participant_id, payload_hash)
SELECT $1::text, $2::text, $3::text, $4::uuid, $5::text, $6::bytea
WHERE NOT EXISTS (SELECT 1 FROM {schema}.retired_keys r WHERE r.digest = {schema}.key_digest($1::text, $2::text, $3::text))
ON CONFLICT DO NOTHING`

	// insertPendingOneSQL is insertPendingSQL for one instruction:
	// enqueue_pending (migration 033) allocates a sequence id and inserts
	// the row only if the key row carries its own, still unsequenced,
	// outbox id ($1), due at once if it is its participant's head.
	insertPendingOneSQL = `SELECT {schema}.enqueue_pending($1::uuid, $2::text, $3::text, $4::text)`

	// lookupKeyOneSQL is lookupKeysSQL for one key (its ord is 0).
	lookupKeyOneSQL = `
SELECT 0, coalesce(r.outbox_id, k.outbox_id, o.outbox_id), k.sequence_id, k.payload_hash, k.instruction_id, o.idempotency_key,
       r.digest IS NOT NULL,
       CASE WHEN k.outbox_id = i.outbox_id AND r.digest IS NOT NULL THEN {schema}.key_retired_race(k.outbox_id) END
FROM (SELECT $1::text AS tenant_id, $2::text AS instruction_id, $3::text AS idempotency_key, $4::uuid AS outbox_id) AS i
LEFT JOIN {schema}.idempotency_keys k ON (k.tenant_id, k.idempotency_key) = (i.tenant_id, i.idempotency_key)
LEFT JOIN LATERAL (SELECT o.outbox_id, o.idempotency_key FROM {schema}.idempotency_keys o
                   WHERE k.outbox_id IS NULL AND (o.instruction_id, o.tenant_id || '') = (i.instruction_id, i.tenant_id) LIMIT 1) o ON true
LEFT JOIN {schema}.retired_keys r ON r.digest = {schema}.key_digest(i.tenant_id, i.instruction_id, i.idempotency_key)
WHERE k.outbox_id IS NOT NULL OR r.digest IS NOT NULL OR o.outbox_id IS NOT NULL`
)

// lookupKeysSQL reads what every key of the batch maps to now: the row of
// the tenant's key, whichever instruction id it belongs to (the caller
// tells its own from another's), and whether this instruction's key was
// retired. A retired key reports the retired outbox id: the key itself may
// since belong to another instruction (retirement frees it, months after
// its instruction ended). A key not found at all was left out by the
// insert because its instruction id has another key (migration 030): that
// key and its outbox id are read, by the unique index on instruction id
// and tenant (the tenant as an expression, the column joined to the empty
// string: migration 030 says why), only then (the condition on k is
// constant within the subquery, a one-time filter: the usual enqueue,
// whose key is found, does not read that index).
//
// A key is live beside its digest while its retirement waits for the
// snapshots older than the digest to end (archive.go): that is a retired
// key, refused as such, and the caller's transaction stays usable. Only
// this transaction's own fresh row beside a digest is a race: a
// retirement that removed the old row in the statement that wrote the
// digest (builds before the wait) committed while this transaction's
// insert waited on that row's lock, and the insert, whose snapshot did not
// see the digest, wrote the key again. key_retired_race then fails the
// statement, and with it the transaction, so the key is never enqueued
// twice.
const lookupKeysSQL = `
SELECT i.ord, coalesce(r.outbox_id, k.outbox_id, o.outbox_id), k.sequence_id, k.payload_hash, k.instruction_id, o.idempotency_key,
       r.digest IS NOT NULL,
       CASE WHEN k.outbox_id = i.outbox_id AND r.digest IS NOT NULL THEN {schema}.key_retired_race(k.outbox_id) END
FROM unnest($1::text[], $2::text[], $3::text[], $4::int[], $5::uuid[]) AS i(tenant_id, instruction_id, idempotency_key, ord, outbox_id)
LEFT JOIN LATERAL (SELECT k.outbox_id, k.sequence_id, k.payload_hash, k.instruction_id FROM {schema}.idempotency_keys k
                   WHERE (k.tenant_id, k.idempotency_key) = (i.tenant_id, i.idempotency_key)
                   LIMIT 1) k ON true
LEFT JOIN LATERAL (SELECT o.outbox_id, o.idempotency_key FROM {schema}.idempotency_keys o
                   WHERE k.outbox_id IS NULL AND (o.instruction_id, o.tenant_id || '') = (i.instruction_id, i.tenant_id)
                   LIMIT 1) o ON true
LEFT JOIN LATERAL (SELECT r.digest, r.outbox_id FROM {schema}.retired_keys r
                   WHERE r.digest = {schema}.key_digest(i.tenant_id, i.instruction_id, i.idempotency_key) LIMIT 1) r ON true
WHERE k.outbox_id IS NOT NULL OR r.digest IS NOT NULL OR o.outbox_id IS NOT NULL`
