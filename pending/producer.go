// Package pending is the producer: services enqueue instructions in their
// own transaction, with permanent idempotency and gap-free per-participant
// sequences. It links pgx, uuid and the validators, nothing heavier.
//
// Within a tenant, an idempotency key and an instruction id name each
// other, one to one: the rails deduplicate by the key, so a key under a
// second instruction id would be answered as a repeat and go unpaid
// ([MismatchError], [ErrIdempotencyMismatch]), and an instruction id under
// a second key would be paid twice ([InstructionReusedError],
// [ErrInstructionIDReused]). Both are refused with nothing written. Derive
// the key from the instruction ([DeterministicKey]) and keep it for every
// retry. A key is kept so until `outbox archive detach` retires it with the
// archive month that ended its instruction: its instruction is then still
// refused under it ([ErrKeyRetired]), and another instruction id may take
// it.
package pending

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"sync/atomic"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/internal/strictjson"
	"github.com/ledgerline/outbox/payment"
)

// DBTX is the part of a connection the producer uses. The caller's pgx.Tx
// is the intended argument (the instruction commits or rolls back with the
// caller's business rows); *pgxpool.Pool and *pgx.Conn also satisfy it, in
// which case each call is its own transaction, or, on a connection (a
// *pgx.Conn or *pgxpool.Conn) inside a transaction the caller began with
// a BEGIN statement, part of that transaction, a batch under a savepoint
// of it.
type DBTX = store.Batcher

// ErrInvalidConfig is wrapped by the errors [NewProducer] returns for a
// Config no enqueue could use.
var ErrInvalidConfig = errors.New("pending: invalid config")

// Config configures a [Producer].
type Config struct {
	// Schema holding the outbox tables; "" means the default.
	Schema string
	// Rails are the rail types producers may use and how each validates;
	// nil means [payment.DefaultCatalog] (sandbox and event). An empty
	// catalog, or a rail without a profile, is refused. NewProducer keeps
	// a copy: later changes to the map do not reach the Producer.
	Rails payment.Catalog
	// MaxPayloadBytes limits the encoded payload as PostgreSQL writes the
	// stored jsonb back (metadata numbers written out in full, a space
	// after every ',' and ':'); 0 means 64 KiB; negative, or more than
	// [MaxBatchPayloadBytes], is refused.
	MaxPayloadBytes int
}

// MaxBatchSize is the most instructions one [Producer.EnqueueBatch] takes;
// a longer batch is refused with [ErrBatchTooLarge] before anything is
// sent. A batch is one transaction's statements, and its keys and
// participants' sequence rows stay locked until that transaction ends,
// holding up every other producer of the same participants: ten thousand
// instructions is a payroll file's batch, written in about a second,
// and longer ones are better written in parts.
const MaxBatchSize = 10_000

// MaxBatchPayloadBytes is the most payload one [Producer.EnqueueBatch]
// takes, its instructions' payloads counted as [Config].MaxPayloadBytes
// counts each (as stored); a batch over it is refused with
// [ErrBatchTooLarge] before anything is sent. The payloads travel as one
// array parameter of one statement, which PostgreSQL holds in its
// memory, and converts to jsonb, all at once: a message or an array past
// 1 GB is refused, the message by closing the connection (and with it
// the caller's transaction), and long before that one batch's statement
// takes the server's memory from everyone else's. It is also the largest
// MaxPayloadBytes a [Config] may set, so that every instruction fits a
// batch.
const MaxBatchPayloadBytes = 64 << 20

// Producer enqueues instructions. It is safe for concurrent use.
type Producer struct {
	rails      payment.Catalog
	maxPayload int
	// maxBatchPayload is MaxBatchPayloadBytes (lowered by tests).
	maxBatchPayload int
	store           *store.Store
	// schemaOK is set once a database answered with a schema version the
	// enqueue statements are right for; until then each enqueue asks.
	schemaOK atomic.Bool
}

// NewProducer validates cfg and returns a Producer. A Config it refuses
// (an invalid schema, an empty catalog or a rail without a profile, a
// negative MaxPayloadBytes or one past [MaxBatchPayloadBytes]) is an
// error wrapping [ErrInvalidConfig].
func NewProducer(cfg Config) (*Producer, error) {
	st, err := store.New(cfg.Schema)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	switch {
	case cfg.Rails == nil:
		cfg.Rails = payment.DefaultCatalog()
	case len(cfg.Rails) == 0:
		// Every enqueue would be refused as an unknown rail: a
		// configuration that lost its rails, better found at deploy
		// than at the first payment.
		return nil, fmt.Errorf("%w: Rails is empty (nil means the default catalog)", ErrInvalidConfig)
	default:
		for rail, profile := range cfg.Rails {
			if profile == nil {
				return nil, fmt.Errorf("%w: rail %q has no profile", ErrInvalidConfig, rail)
			}
		}
		// Our own copy: the Producer is used concurrently, and the
		// caller may go on changing its map.
		cfg.Rails = maps.Clone(cfg.Rails)
	}
	switch {
	case cfg.MaxPayloadBytes == 0:
		cfg.MaxPayloadBytes = payment.DefaultMaxPayloadBytes
	case cfg.MaxPayloadBytes < 0:
		return nil, fmt.Errorf("%w: MaxPayloadBytes %d is negative (0 means the default)", ErrInvalidConfig, cfg.MaxPayloadBytes)
	case cfg.MaxPayloadBytes > MaxBatchPayloadBytes:
		// An instruction at the limit could not be enqueued even alone.
		return nil, fmt.Errorf("%w: MaxPayloadBytes %d is past MaxBatchPayloadBytes, %d, the most one enqueue sends", ErrInvalidConfig, cfg.MaxPayloadBytes, MaxBatchPayloadBytes)
	}
	return &Producer{rails: cfg.Rails, maxPayload: cfg.MaxPayloadBytes, maxBatchPayload: MaxBatchPayloadBytes, store: st}, nil
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
// An invalid instruction returns a [*payment.ValidationError] (errors.Is
// payment.ErrValidation) before anything is sent to the database. A key seen
// before with the same payload returns the original receipt with
// Duplicate=true (no sequence id is used), even long after the instruction
// was dispatched; with a different payload, or under another instruction
// id, it returns a [*MismatchError] (errors.Is ErrIdempotencyMismatch). An
// instruction id already enqueued under another key (in its tenant)
// returns an [*InstructionReusedError] (errors.Is ErrInstructionIDReused,
// and ErrIdempotencyMismatch) naming that key: the rail would pay it once
// per key. In all these cases nothing is written and tx remains usable.
// A write the database refuses as read-only (a READ ONLY transaction, a
// standby) is [ErrReadOnly], and one refused for a privilege the role
// lacks (another tenant's instruction, the outbox's grants) is
// [ErrPermissionDenied]: nothing is written, but tx is aborted. A ctx
// that ends while the statements run fails the enqueue with ctx's error,
// and tx can no longer commit (pgx closes the connection of a statement
// it gives up on): nothing of it, or of tx, is written.
//
// The participant's sequence row stays locked until tx ends (that is what
// keeps sequences gap-free), so a transaction that enqueues for several
// participants should do so in participant order, or use EnqueueBatch,
// which claims keys in key order and locks participants in participant
// order, whatever the input order; otherwise it can deadlock with another
// such transaction, or with a relayer's outcome write, which locks its
// participants' rows in participant order (with ordering off, only a
// write of late outcomes does): PostgreSQL then rolls one of them back
// (SQLSTATE 40P01).
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
// undoes the rest, so tx remains usable). Lines of one key are resolved in
// input order (the first claims it, a later one with the same instruction
// id and payload is its duplicate, one that differs is a [*MismatchError]
// with no OutboxID); so are lines of one instruction id (and tenant) under
// different keys: the first gives it its key, and the first later line
// with another key is refused. Lines that disagree so are refused before
// anything is sent. So is a batch of more than [MaxBatchSize]
// instructions or [MaxBatchPayloadBytes] of payload: [ErrBatchTooLarge],
// nothing written, tx untouched.
func (p *Producer) EnqueueBatch(ctx context.Context, tx DBTX, ins []Instruction) ([]Receipt, error) {
	if len(ins) == 0 {
		return nil, nil
	}
	if len(ins) > MaxBatchSize {
		return nil, &BatchTooLargeError{Instructions: len(ins), MaxInstructions: MaxBatchSize, MaxPayloadBytes: p.maxBatchPayload}
	}
	preps := make([]prepared, len(ins))
	size := 0
	for i, in := range ins {
		pr, err := p.prepare(in)
		if err != nil {
			return nil, &BatchError{Index: i, Err: err}
		}
		preps[i] = pr
		// Each size is at most MaxBatchPayloadBytes (NewProducer), so the
		// sum stops before it could overflow.
		if size += pr.size; size > p.maxBatchPayload {
			return nil, &BatchTooLargeError{Instructions: len(ins), PayloadBytes: size, MaxInstructions: MaxBatchSize, MaxPayloadBytes: p.maxBatchPayload}
		}
	}
	if i, err := batchConflicts(preps); err != nil {
		return nil, &BatchError{Index: i, Err: err}
	}
	if !p.schemaOK.Load() {
		if err := p.checkSchema(ctx, tx); err != nil {
			return nil, err
		}
	}
	if len(preps) == 1 {
		// A lone instruction that mismatches writes nothing in the first
		// place: no savepoint needed.
		receipts, err := p.write(ctx, tx, preps)
		return receipts, refusal(err)
	}
	if inCallersTransaction(tx) {
		return p.writeInSavepoint(ctx, tx, preps)
	}
	sp, err := tx.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("enqueue: begin: %w", err)
	}
	receipts, err := p.write(ctx, sp, preps)
	if err != nil {
		_ = sp.Rollback(ctx)
		return nil, refusal(err)
	}
	if err := sp.Commit(ctx); err != nil {
		return nil, fmt.Errorf("enqueue: commit: %w", err)
	}
	return receipts, nil
}

// inCallersTransaction reports whether db is a connection (a *pgx.Conn,
// or a pool's connection) inside a transaction pgx did not begin: the
// caller sent BEGIN as a statement. pgx's Begin on it would send BEGIN
// (PostgreSQL only warns) and then COMMIT or ROLLBACK: the caller's own
// transaction, ended halfway through, its later statements each
// committed on their own.
func inCallersTransaction(db DBTX) bool {
	var conn *pgx.Conn
	switch c := db.(type) {
	case pgx.Tx:
		// Its Begin is a savepoint of it (it has Conn too).
		return false
	case *pgx.Conn:
		conn = c
	case interface{ Conn() *pgx.Conn }: // *pgxpool.Conn, without linking the pool
		conn = c.Conn()
	default:
		return false
	}
	return conn != nil && conn.PgConn().TxStatus() != 'I'
}

// batchSavepoint names the savepoint of a batch written in its caller's
// transaction (see writeInSavepoint).
const batchSavepoint = "outbox_enqueue_batch"

// writeInSavepoint is write under a savepoint of the caller's own
// transaction, for a connection pgx's Begin would not nest on (see
// inCallersTransaction): a refused batch leaves the transaction as it
// was, open and usable, as it does a pgx.Tx.
func (p *Producer) writeInSavepoint(ctx context.Context, db DBTX, preps []prepared) ([]Receipt, error) {
	if _, err := db.Exec(ctx, "SAVEPOINT "+batchSavepoint); err != nil {
		return nil, fmt.Errorf("enqueue: savepoint: %w", err)
	}
	receipts, err := p.write(ctx, db, preps)
	if err != nil {
		if _, rerr := db.Exec(ctx, "ROLLBACK TO SAVEPOINT "+batchSavepoint); rerr != nil {
			return nil, errors.Join(refusal(err), fmt.Errorf("enqueue: rollback to savepoint: %w", rerr))
		}
		_, _ = db.Exec(ctx, "RELEASE SAVEPOINT "+batchSavepoint)
		return nil, refusal(err)
	}
	if _, err := db.Exec(ctx, "RELEASE SAVEPOINT "+batchSavepoint); err != nil {
		return nil, fmt.Errorf("enqueue: release savepoint: %w", err)
	}
	return receipts, nil
}

// PostgreSQL's SQLSTATEs the enqueue gives a type of its own.
const (
	// readOnlySQLTransaction is a write in a read-only transaction
	// (read_only_sql_transaction).
	readOnlySQLTransaction = "25006"
	// insufficientPrivilege is a statement the role may not run
	// (insufficient_privilege): a grant missing, a row-level security
	// policy or a tenant binding refusing the row.
	insufficientPrivilege = "42501"
)

// refusal marks the database's refusals an enqueue's caller must tell
// apart without reading SQLSTATEs: a write refused as read-only
// (read_only_sql_transaction) is [ErrReadOnly], as, unlike the others,
// the same enqueue goes through in a writable transaction (on the
// primary); a privilege the role lacks (insufficient_privilege) is
// [ErrPermissionDenied], a configuration to fix, never the instruction's
// fault nor the database's trouble. Any other error is returned as it
// is.
func refusal(err error) error {
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) {
		switch pgErr.Code {
		case readOnlySQLTransaction:
			return fmt.Errorf("%w: %w", ErrReadOnly, err)
		case insufficientPrivilege:
			return fmt.Errorf("%w: %w", ErrPermissionDenied, err)
		}
	}
	return err
}

// checkSchema refuses a schema older than the enqueue statements need
// (store.EnqueueSchemaVersion), once per Producer: producers are often
// deployed before `outbox migrate` runs, and, unlike relayers, are not
// started in a way that could refuse. A role that may not read the
// version table is let through.
func (p *Producer) checkSchema(ctx context.Context, db DBTX) error {
	version, visible, err := p.store.SchemaVersion(ctx, db)
	if err != nil {
		return refusal(fmt.Errorf("enqueue: %w", err))
	}
	if visible && version < store.EnqueueSchemaVersion {
		return &SchemaError{Schema: p.store.Schema(), Version: version, Needed: store.EnqueueSchemaVersion}
	}
	p.schemaOK.Store(true)
	return nil
}

// batchConflicts refuses the first line of a batch that disagrees with
// an earlier line, before anything is sent: an instruction id (per
// tenant) an earlier line names under another key, or a key (per tenant)
// an earlier line gives to another instruction id or enqueues with
// another payload. The database would refuse them too (migration 030; a
// key's later line a mismatch), but the keys are inserted in key order,
// so the instruction id's winning line would be the smaller key's, not
// the earlier line's; and a key's refusal named the earlier line's outbox
// id, never enqueued, the batch failing whole. Lines that agree (one key,
// one instruction id, one payload) are one instruction, the later a
// duplicate.
func batchConflicts(preps []prepared) (int, error) {
	if len(preps) < 2 {
		return 0, nil
	}
	type id struct{ tenant, name string }
	firstKey := make(map[id]string, len(preps)) // instruction id → its first line's key
	firstLine := make(map[id]int, len(preps))   // key → its first line
	for i, pr := range preps {
		in := pr.in
		ins := id{in.TenantID, in.InstructionID}
		if key, seen := firstKey[ins]; !seen {
			firstKey[ins] = in.IdempotencyKey
		} else if key != in.IdempotencyKey {
			return i, &InstructionReusedError{InstructionID: in.InstructionID, IdempotencyKey: in.IdempotencyKey,
				TenantID: in.TenantID, OwnerKey: key}
		}
		key := id{in.TenantID, in.IdempotencyKey}
		j, seen := firstLine[key]
		switch {
		case !seen:
			firstLine[key] = i
		case preps[j].in.InstructionID != in.InstructionID:
			return i, &MismatchError{InstructionID: in.InstructionID, IdempotencyKey: in.IdempotencyKey, Owner: preps[j].in.InstructionID}
		case !bytes.Equal(preps[j].hash, pr.hash):
			return i, &MismatchError{InstructionID: in.InstructionID, IdempotencyKey: in.IdempotencyKey}
		}
	}
	return 0, nil
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
		return prepared{}, &payment.ValidationError{Field: payment.FieldMetadata, Reason: payment.ReasonInvalid, Message: "metadata is not valid JSON"}
	}
	payload, err := json.Marshal(in.payload(meta))
	if err != nil {
		return prepared{}, fmt.Errorf("enqueue: encode payload: %w", err)
	}
	// The limit holds for the payload as stored and read back, where jsonb
	// writes every metadata number out in full (0e-1000 is 1,002 bytes):
	// on the input's length alone, 64 KiB of such numbers became megabytes
	// in the table and in every relayer's request. The check also runs the
	// storability rules whatever the rail's profile checked: a number
	// PostgreSQL refuses would fail the statement, and the caller's
	// transaction with it, after it was sent.
	// jsonb's text form also puts a space after every ',' and ':', so a
	// compact payload reads back longer than it was sent (TextFormLength:
	// the payload is encoding/json's, whose own numbers are in full).
	size := strictjson.TextFormLength(payload)
	if meta != nil {
		stored, err := strictjson.StoredSize(meta)
		if err != nil {
			return prepared{}, payment.Invalid(payment.FieldMetadata, payment.ReasonInvalid, "metadata: %v", err)
		}
		size += stored - strictjson.TextFormLength(meta)
	}
	if size > p.maxPayload {
		msg := fmt.Sprintf("payload is %d bytes as stored (%d as given: PostgreSQL writes its numbers out in full and a space after every , and :), the limit is %d",
			size, len(payload), p.maxPayload)
		return prepared{}, &payment.ValidationError{Field: payment.FieldPayload, Reason: payment.ReasonTooLarge, Message: msg}
	}
	id, err := uuid.NewV7()
	if err != nil {
		return prepared{}, fmt.Errorf("enqueue: outbox id: %w", err)
	}
	// The hash is over the payload with its numbers as jsonb stores them
	// (1e2 as 100, -0 as 0), which is what the rail is sent: a retry
	// whose encoder writes a number otherwise is the same payment. An
	// older build hashed the numbers as given; a retry of one of its
	// instructions, sent as it was then, must still match it.
	full, rewritten, err := strictjson.NumbersInFull(payload)
	if err != nil {
		return prepared{}, payment.Invalid(payment.FieldMetadata, payment.ReasonInvalid, "metadata: %v", err)
	}
	pr := prepared{in: in, outboxID: id, payload: payload, size: size, hash: payloadHash(in, full)}
	if rewritten {
		pr.asGivenHash = payloadHash(in, payload)
	}
	return pr, nil
}

// write enqueues prepared instructions (see [store.Store.Enqueue]) and
// turns what their keys map to into receipts: the instruction's own outbox
// id is a fresh enqueue; a key of another instruction id a mismatch; the
// instruction id under another key (the key not found, so not inserted)
// an instruction reused; another outbox id of the same instruction with
// the same payload hash a duplicate, with another hash a mismatch.
func (p *Producer) write(ctx context.Context, db DBTX, preps []prepared) ([]Receipt, error) {
	rows := make([]store.NewInstruction, len(preps))
	for i, pr := range preps {
		rows[i] = store.NewInstruction{
			OutboxID: pr.outboxID, InstructionID: pr.in.InstructionID, ParticipantID: pr.in.ParticipantID,
			IdempotencyKey: pr.in.IdempotencyKey, RailType: pr.in.RailType, TenantID: pr.in.TenantID,
			CorrelationID: pr.in.CorrelationID, Payload: pr.payload, PayloadHash: pr.hash,
		}
	}
	keys, err := p.store.Enqueue(ctx, db, rows)
	if err != nil {
		return nil, err
	}
	receipts := make([]Receipt, len(preps))
	for i, k := range keys {
		pr := preps[i]
		switch {
		case k.Retired:
			return nil, &BatchError{Index: i, Err: &RetiredError{InstructionID: pr.in.InstructionID, IdempotencyKey: pr.in.IdempotencyKey, OutboxID: k.OutboxID}}
		case k.OutboxID == pr.outboxID && k.SequenceID != nil:
			receipts[i] = Receipt{OutboxID: k.OutboxID, SequenceID: *k.SequenceID}
		case k.OutboxID == pr.outboxID:
			return nil, fmt.Errorf("enqueue: instruction %d got no sequence id", i)
		case k.OwnerKey != "":
			return nil, &BatchError{Index: i, Err: &InstructionReusedError{InstructionID: pr.in.InstructionID, IdempotencyKey: pr.in.IdempotencyKey,
				TenantID: pr.in.TenantID, OwnerKey: k.OwnerKey, OutboxID: k.OutboxID}}
		case k.SequenceID == nil:
			// A committed key without its instruction: inserted outside an
			// enqueue (a producer credential may insert keys). Before the
			// mismatches: whatever it names, nothing was enqueued under it.
			return nil, &BatchError{Index: i, Err: &KeyWithoutInstructionError{InstructionID: pr.in.InstructionID,
				IdempotencyKey: pr.in.IdempotencyKey, OutboxID: k.OutboxID}}
		case k.InstructionID != pr.in.InstructionID:
			return nil, &BatchError{Index: i, Err: &MismatchError{InstructionID: pr.in.InstructionID, IdempotencyKey: pr.in.IdempotencyKey, OutboxID: k.OutboxID, Owner: k.InstructionID}}
		case !bytes.Equal(k.PayloadHash, pr.hash) && (pr.asGivenHash == nil || !bytes.Equal(k.PayloadHash, pr.asGivenHash)):
			return nil, &BatchError{Index: i, Err: &MismatchError{InstructionID: pr.in.InstructionID, IdempotencyKey: pr.in.IdempotencyKey, OutboxID: k.OutboxID}}
		default:
			receipts[i] = Receipt{OutboxID: k.OutboxID, SequenceID: *k.SequenceID, Duplicate: true}
		}
	}
	return receipts, nil
}

// Validate checks an instruction exactly as Enqueue would, without touching
// the database.
func (p *Producer) Validate(in Instruction) error {
	_, err := p.prepare(in)
	return err
}

// Payload validates in exactly as Enqueue would and returns the JSON
// payload Enqueue would store for it (payment fields and canonical
// metadata: sorted keys, no insignificant whitespace), without touching
// the database.
func (p *Producer) Payload(in Instruction) ([]byte, error) {
	pr, err := p.prepare(in)
	if err != nil {
		return nil, err
	}
	return pr.payload, nil
}
