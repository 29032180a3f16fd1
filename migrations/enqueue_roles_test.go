package migrations_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ledgerline/outbox/pending"
)

// TestProducerCannotStrandAParticipant: a producer credential used outside
// an enqueue. Before migration 033 it could take a participant's next
// sequence id for an instruction that never existed (allocate_sequence,
// run as the owner), and with ordering on every later instruction of that
// participant waited for it; or insert a pending row of its own. Now the
// pending row and its sequence id come only from enqueue_pending(_batch),
// which read the instruction from a key that has no sequence id yet, and
// keep to the session's tenant.
func TestProducerCannotStrandAParticipant(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	producer := b.as(t, "outbox_producer", "")
	refused(t, b.ctx, producer,
		`SELECT outbox.allocate_sequence('p-victim')`,
		`SELECT * FROM outbox.allocate_sequences(ARRAY['p-victim'], ARRAY[1])`,
		`INSERT INTO outbox.pending (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type, payload)
		   VALUES (gen_random_uuid(), 'i', 'p-victim', 1, 'k', 'sandbox', '{}')`,
		`UPDATE outbox.idempotency_keys SET sequence_id = 7`,
		// A receipt of an instruction never enqueued: its later enqueues
		// would be answered as duplicates, and never paid.
		`INSERT INTO outbox.idempotency_keys (instruction_id, idempotency_key, outbox_id, participant_id, payload_hash, sequence_id)
		   VALUES ('ins-forged', 'k-forged', gen_random_uuid(), 'p-victim', '\x00', 1)`,
	)
	// An outbox id without a key of its own enqueues nothing.
	if _, err := producer.Exec(b.ctx, `SELECT outbox.enqueue_pending(gen_random_uuid(), 'sandbox', '', '{}')`); err != nil {
		t.Fatalf("enqueue_pending without a key: %v", err)
	}
	if _, err := producer.Exec(b.ctx, `SELECT outbox.enqueue_pending_batch(ARRAY[gen_random_uuid()], ARRAY['sandbox'], ARRAY[''], ARRAY['{}'])`); err != nil {
		t.Fatalf("enqueue_pending_batch without a key: %v", err)
	}

	// A key of tenant B written by hand (no pending row): a producer
	// scoped to tenant A may not make it an instruction, by either form.
	orphan := uuid.Must(uuid.NewV4())
	if _, err := b.as(t, "outbox_producer", "B").Exec(b.ctx, `
		INSERT INTO outbox.idempotency_keys (tenant_id, instruction_id, idempotency_key, outbox_id, participant_id, payload_hash)
		VALUES ('B', 'ins-orphan', 'k-orphan', $1, 'p-victim', '\x00')`, orphan); err != nil {
		t.Fatal(err)
	}
	tenantA := b.as(t, "outbox_producer", "A")
	for _, q := range []string{
		`SELECT outbox.enqueue_pending($1, 'sandbox', '', '{}')`,
		`SELECT outbox.enqueue_pending_batch(ARRAY[$1::uuid], ARRAY['sandbox'], ARRAY[''], ARRAY['{}'])`,
	} {
		_, err := tenantA.Exec(b.ctx, q, orphan)
		if pgErr := (*pgconn.PgError)(nil); !errors.As(err, &pgErr) || pgErr.Code != "42501" {
			t.Errorf("%s on tenant B's key as tenant A: %v, want a 42501 refusal", q, err)
		}
	}

	// Nothing of the above took a sequence id: the participant's first
	// instruction is number 1, and due.
	r, err := b.producer.Enqueue(b.ctx, producer, pending.Instruction{
		InstructionID: "ins-victim", ParticipantID: "p-victim", IdempotencyKey: "k-victim",
		RailType: "sandbox", AmountMinor: 100, Currency: "USD", Destination: "acct-1",
	})
	if err != nil || r.SequenceID != 1 {
		t.Fatalf("the participant's first enqueue: %+v %v, want sequence 1", r, err)
	}
	var due bool
	if err := b.admin.QueryRow(b.ctx, `SELECT next_attempt_at <= now() FROM outbox.pending WHERE outbox_id = $1`, r.OutboxID).Scan(&due); err != nil || !due {
		t.Fatalf("the participant's head: due %v (%v), want due at once", due, err)
	}
	// A batch as the producer still enqueues, in order.
	rs, err := b.producer.EnqueueBatch(b.ctx, producer, []pending.Instruction{
		{InstructionID: "ins-b1", ParticipantID: "p-victim", IdempotencyKey: "k-b1", RailType: "sandbox", AmountMinor: 100, Currency: "USD", Destination: "acct-1"},
		{InstructionID: "ins-b2", ParticipantID: "p-victim", IdempotencyKey: "k-b2", RailType: "sandbox", AmountMinor: 100, Currency: "USD", Destination: "acct-1"},
	})
	if err != nil || rs[0].SequenceID != 2 || rs[1].SequenceID != 3 {
		t.Fatalf("a batch as the producer: %+v %v, want sequences 2 and 3", rs, err)
	}
}

// TestNoRoleButTheOwnerHoldsUpCheckpoints: take_checkpoint serializes its
// callers on a lock. Before migration 034 that was an advisory lock, which
// any role that can connect may take: a producer holding it made every
// checkpoint wait and fail. Now it is the checkpoints table's own SHARE
// ROW EXCLUSIVE lock, which no outbox role but the owner can take or
// block; an auditor reading the checkpoints in an open transaction does
// not hold it up either.
func TestNoRoleButTheOwnerHoldsUpCheckpoints(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	for _, role := range []string{"outbox_producer", "outbox_relayer", "outbox_auditor", "outbox_operator"} {
		conn, err := b.as(t, role, "*").Acquire(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Release()
		// What the function used to wait on, held by the producer for the
		// rest of the test.
		if role == "outbox_producer" {
			if _, err := conn.Exec(b.ctx, `SELECT pg_advisory_lock(hashtext('outbox.checkpoint:outbox'))`); err != nil {
				t.Fatal(err)
			}
		}
		for _, q := range []string{
			`LOCK TABLE outbox.checkpoints IN SHARE ROW EXCLUSIVE MODE`,
			`LOCK TABLE outbox.checkpoints IN ROW SHARE MODE`,
			`SELECT 1 FROM outbox.checkpoints FOR SHARE`,
		} {
			tx, err := conn.Begin(b.ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(b.ctx, q); !isRefused(err) {
				t.Errorf("%s: %s: %v, want a 42501 refusal", role, q, err)
			}
			if err := tx.Rollback(b.ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	reader, err := b.as(t, "outbox_auditor", "*").Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Rollback(b.ctx)
	if _, err := reader.Exec(b.ctx, `SELECT count(*) FROM outbox.checkpoints`); err != nil {
		t.Fatal(err)
	}
	relayer := b.as(t, "outbox_relayer", "")
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	time.Sleep(2 * time.Millisecond)
	if _, err := b.st.TakeCheckpoint(ctx, relayer, time.Millisecond, 0); err != nil {
		t.Errorf("checkpoint as relayer while every other role holds what it can: %v", err)
	}
}

// isRefused is whether err is PostgreSQL's insufficient_privilege.
func isRefused(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42501"
}

// TestProducerEnqueueWakesAnIdleRelayer: the adaptive NOTIFY trigger
// reads relayer_idle, which producers may not read since migration 033.
// It fires inside enqueue_pending, as the owner, so a producer's enqueue
// still wakes a relayer registered idle.
func TestProducerEnqueueWakesAnIdleRelayer(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	if err := b.st.RegisterIdle(b.ctx, b.as(t, "outbox_relayer", ""), "r1"); err != nil {
		t.Fatal(err)
	}
	listener, err := b.admin.Acquire(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Release()
	if _, err := listener.Exec(b.ctx, "LISTEN outbox_pending"); err != nil {
		t.Fatal(err)
	}
	producer := b.as(t, "outbox_producer", "")
	refused(t, b.ctx, producer, `SELECT * FROM outbox.relayer_idle`)
	if _, err := b.enqueue(t, producer, "", "k-wake"); err != nil {
		t.Fatalf("enqueue as producer: %v", err)
	}
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	if _, err := listener.Conn().WaitForNotification(ctx); err != nil {
		t.Fatalf("no notification for a producer's enqueue beside an idle relayer: %v", err)
	}
}
