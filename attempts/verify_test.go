package attempts_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/attempts"
	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/pending"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// verifyBundle builds archive states the way the relayer would: real
// enqueues, then plain SQL that imitates the claim, outcome, requeue and
// dead-letter transitions. Every row it writes gets a timestamp from its own
// clock, one millisecond apart, so the archive's order is the order of the
// calls and never depends on the wall clock's resolution.
type verifyBundle struct {
	ctx      context.Context
	pool     *pgxpool.Pool
	producer *pending.Producer
	archive  *attempts.Archive
	clock    time.Time
	ids      map[string]uuid.UUID // idempotency key -> outbox id
}

func setupVerify(t *testing.T) *verifyBundle {
	t.Helper()
	producer, err := pending.NewProducer(pending.Config{})
	if err != nil {
		t.Fatal(err)
	}
	archive, err := attempts.New("")
	if err != nil {
		t.Fatal(err)
	}
	pool := testdb.New(t)
	// This harness writes its histories by hand, on a clock of its own, to
	// build each corruption of invariants 1 to 5; it leaves the hash chain
	// out, as rows archived before migration 007 do. The chain and the
	// checkpoints (invariant 7) are tested against the real writers in
	// tamper_test.go.
	if _, err := pool.Exec(t.Context(), `UPDATE outbox.settings SET chained_since = 'infinity'`); err != nil {
		t.Fatal(err)
	}
	return &verifyBundle{
		ctx: t.Context(), pool: pool, producer: producer, archive: archive,
		clock: time.Now().UTC().Truncate(time.Millisecond), ids: map[string]uuid.UUID{},
	}
}

// tick returns the next timestamp of the bundle's clock.
func (b *verifyBundle) tick() time.Time {
	b.clock = b.clock.Add(time.Millisecond)
	return b.clock
}

// enqueue commits one sandbox payment for participant under key.
func (b *verifyBundle) enqueue(t *testing.T, participant, key string) uuid.UUID {
	t.Helper()
	r, err := b.producer.Enqueue(b.ctx, b.pool, pending.Instruction{
		InstructionID: "ins-" + key, ParticipantID: participant, IdempotencyKey: key,
		RailType: "sandbox", AmountMinor: 1000, Currency: "USD", Destination: "acct-1",
	})
	if err != nil {
		t.Fatal(err)
	}
	if r.Duplicate {
		t.Fatalf("key %s enqueued twice", key)
	}
	b.ids[key] = r.OutboxID
	return r.OutboxID
}

func (b *verifyBundle) exec(t *testing.T, sql string, args ...any) int64 {
	t.Helper()
	tag, err := b.pool.Exec(b.ctx, sql, args...)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return tag.RowsAffected()
}

// claimed is a DISPATCHING attempt.
type claimed struct {
	outboxID  uuid.UUID
	attemptID uuid.UUID
	attemptNo int
}

// claimSQL is the claim transition in one statement: take the row out of
// pending, append a DISPATCHING attempt numbered attempt_count + 1, and put
// the instruction in flight.
const claimSQL = `
WITH p AS (
  DELETE FROM outbox.pending WHERE outbox_id = $1 RETURNING *
), a AS (
  INSERT INTO outbox.attempts (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
                               tenant_id, correlation_id, payload, attempt_no, state, relayer_id, claim_attempt_id,
                               claimed_at, created_at)
  SELECT outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
         tenant_id, correlation_id, payload, attempt_count + 1, 'DISPATCHING', 'relayer-1', NULL,
         $2::timestamptz, $2::timestamptz
  FROM p
  RETURNING attempt_id, attempt_no, outbox_id
), f AS (
  INSERT INTO outbox.inflight (outbox_id, attempt_id, attempt_no, relayer_id, ordered, claimed_at, lease_until,
                               instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
                               tenant_id, correlation_id, payload, created_at)
  SELECT p.outbox_id, a.attempt_id, a.attempt_no, 'relayer-1', $3, $2::timestamptz, $2::timestamptz + interval '30 seconds',
         p.instruction_id, p.participant_id, p.sequence_id, p.idempotency_key, p.rail_type,
         p.tenant_id, p.correlation_id, p.payload, p.created_at
  FROM p JOIN a USING (outbox_id)
)
SELECT attempt_id, attempt_no FROM a`

// claim moves a pending instruction in flight (ordered sets the inflight
// row's ordered flag, which the database allows once per participant).
func (b *verifyBundle) claim(t *testing.T, outboxID uuid.UUID, ordered bool) claimed {
	t.Helper()
	c := claimed{outboxID: outboxID}
	if err := b.pool.QueryRow(b.ctx, claimSQL, outboxID, b.tick(), ordered).Scan(&c.attemptID, &c.attemptNo); err != nil {
		t.Fatalf("claim %s: %v", outboxID, err)
	}
	return c
}

// outcome records how a claim ended, as the relayer (or, for
// ZOMBIE_REQUEUE, the reaper) does in one transaction: the closing attempt,
// then DISPATCHED: done; RETRYABLE / ZOMBIE_REQUEUE: back to pending with
// the same identity and attempt_count = attempt_no (a zombie does not count:
// attempt_no - 1, so the copy is claimed under the same number); FAILED: a
// dead letter.
// The inflight row is removed only if it still belongs to this claim.
func (b *verifyBundle) outcome(t *testing.T, c claimed, state attempts.State) uuid.UUID {
	t.Helper()
	at := b.tick()
	var closer uuid.UUID
	err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		err := tx.QueryRow(b.ctx, `
			INSERT INTO outbox.attempts (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
			                             tenant_id, correlation_id, attempt_no, state, relayer_id, claim_attempt_id,
			                             claimed_at, completed_at, next_attempt_at, created_at)
			SELECT outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
			       tenant_id, correlation_id, attempt_no, $2::text, relayer_id, attempt_id,
			       claimed_at, $3::timestamptz, CASE WHEN $2::text IN ('RETRYABLE', 'ZOMBIE_REQUEUE') THEN $3::timestamptz END, $3::timestamptz
			FROM outbox.attempts WHERE attempt_id = $1 AND state = 'DISPATCHING'
			RETURNING attempt_id`, c.attemptID, string(state), at).Scan(&closer)
		if err != nil {
			return err
		}
		switch state {
		case attempts.Retryable, attempts.ZombieRequeue:
			_, err = tx.Exec(b.ctx, `
				INSERT INTO outbox.pending (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
				                            tenant_id, correlation_id, payload, attempt_count, next_attempt_at, created_at)
				SELECT outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
				       tenant_id, correlation_id, payload, CASE WHEN $4 THEN attempt_no - 1 ELSE attempt_no END, $3, created_at
				FROM outbox.inflight WHERE outbox_id = $1 AND attempt_id = $2`, c.outboxID, c.attemptID, at, state == attempts.ZombieRequeue)
		case attempts.Failed:
			_, err = tx.Exec(b.ctx, `
				INSERT INTO outbox.dead_letters (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
				                                 tenant_id, correlation_id, payload, attempt_count, error_code, error_message,
				                                 attempt_id, created_at, failed_at)
				SELECT outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
				       tenant_id, correlation_id, payload, attempt_no, 'RAIL_REJECTED', 'rejected by the rail',
				       $3, created_at, $4
				FROM outbox.inflight WHERE outbox_id = $1 AND attempt_id = $2`, c.outboxID, c.attemptID, closer, at)
		}
		if err != nil {
			return err
		}
		if state == attempts.Dispatched || state == attempts.Failed {
			// The instruction's end: its participant has one fewer queued.
			if _, err := tx.Exec(b.ctx, `UPDATE outbox.sequences s SET queued = queued - 1 FROM outbox.inflight f
				WHERE f.outbox_id = $1 AND f.attempt_id = $2 AND s.participant_id = f.participant_id`, c.outboxID, c.attemptID); err != nil {
				return err
			}
		}
		tag, err := tx.Exec(b.ctx, `DELETE FROM outbox.inflight WHERE outbox_id = $1 AND attempt_id = $2`, c.outboxID, c.attemptID)
		if err == nil && tag.RowsAffected() != 1 {
			t.Fatalf("outcome %s: claim %s is not in flight", state, c.attemptID)
		}
		return err
	})
	if err != nil {
		t.Fatalf("outcome %s of %s: %v", state, c.attemptID, err)
	}
	return closer
}

// replay sends a dead letter back to pending as an operator does: a
// REPLAYED attempt, the same identity, attempt_count kept.
func (b *verifyBundle) replay(t *testing.T, outboxID uuid.UUID) {
	t.Helper()
	at := b.tick()
	err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		for _, st := range []struct {
			sql  string
			args []any
		}{
			{`INSERT INTO outbox.attempts (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
			                              tenant_id, correlation_id, payload, attempt_no, state, claimed_at, created_at)
			  SELECT outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
			         tenant_id, correlation_id, payload, attempt_count, 'REPLAYED', $2::timestamptz, $2::timestamptz
			  FROM outbox.dead_letters WHERE outbox_id = $1`, []any{outboxID, at}},
			{`INSERT INTO outbox.pending (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
			                             tenant_id, correlation_id, payload, attempt_count, next_attempt_at, created_at)
			  SELECT outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
			         tenant_id, correlation_id, payload, attempt_count, $2, created_at
			  FROM outbox.dead_letters WHERE outbox_id = $1`, []any{outboxID, at}},
			{`UPDATE outbox.sequences s SET queued = queued + 1 FROM outbox.dead_letters d
			  WHERE d.outbox_id = $1 AND s.participant_id = d.participant_id`, []any{outboxID}},
			{`DELETE FROM outbox.dead_letters WHERE outbox_id = $1`, []any{outboxID}},
		} {
			tag, err := tx.Exec(b.ctx, st.sql, st.args...)
			if err != nil {
				return err
			}
			if tag.RowsAffected() != 1 {
				t.Fatalf("replay %s: not a dead letter", outboxID)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("replay %s: %v", outboxID, err)
	}
}

// appendAttempt appends a bare attempt row for an instruction, identity
// taken from its idempotency key: the raw material of corruptions.
func (b *verifyBundle) appendAttempt(t *testing.T, outboxID uuid.UUID, state attempts.State, attemptNo int, claim *uuid.UUID) {
	t.Helper()
	n := b.exec(t, `
		INSERT INTO outbox.attempts (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
		                             attempt_no, state, relayer_id, claim_attempt_id, claimed_at, completed_at, created_at)
		SELECT outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, 'sandbox',
		       $2::int, $3::text, 'relayer-1', $4::uuid, $5::timestamptz, $5::timestamptz, $5::timestamptz
		FROM outbox.idempotency_keys WHERE outbox_id = $1`, outboxID, attemptNo, string(state), claim, b.tick())
	if n != 1 {
		t.Fatalf("append attempt: outbox %s has no key", outboxID)
	}
}

func (b *verifyBundle) verify(t *testing.T, opts attempts.VerifyOptions) attempts.Report {
	t.Helper()
	r, err := b.archive.Verify(b.ctx, b.pool, opts)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// healthyHistory builds a state that satisfies every invariant, with
// ordering on (every inflight row ordered):
//
//	alice 1: dispatched
//	alice 2: DISPATCHING#1 -> RETRYABLE#1 -> pending -> DISPATCHING#2 -> DISPATCHED#2
//	alice 3: DISPATCHING#1 -> FAILED#1, a dead letter
//	alice 4: in flight
//	alice 5: pending
//	bob 1:   DISPATCHING#1 -> ZOMBIE_REQUEUE#1 -> pending (attempt_count 0)
//	bob 2:   pending
func (b *verifyBundle) healthyHistory(t *testing.T) {
	t.Helper()
	for _, key := range []string{"alice-1", "alice-2", "alice-3", "alice-4", "alice-5"} {
		b.enqueue(t, "alice", key)
	}
	b.enqueue(t, "bob", "bob-1")
	b.enqueue(t, "bob", "bob-2")

	b.outcome(t, b.claim(t, b.ids["alice-1"], true), attempts.Dispatched)

	first := b.claim(t, b.ids["alice-2"], true)
	b.outcome(t, first, attempts.Retryable)
	var count int
	if err := b.pool.QueryRow(b.ctx, "SELECT attempt_count FROM outbox.pending WHERE outbox_id = $1", b.ids["alice-2"]).Scan(&count); err != nil {
		t.Fatal(err)
	}
	if count != 1 {
		t.Fatalf("retried instruction is back in pending with attempt_count %d, want 1", count)
	}
	second := b.claim(t, b.ids["alice-2"], true)
	if first.attemptNo != 1 || second.attemptNo != 2 {
		t.Fatalf("retry attempt numbers %d, %d; want 1, 2", first.attemptNo, second.attemptNo)
	}
	b.outcome(t, second, attempts.Dispatched)

	b.outcome(t, b.claim(t, b.ids["alice-3"], true), attempts.Failed)
	b.claim(t, b.ids["alice-4"], true)

	b.outcome(t, b.claim(t, b.ids["bob-1"], true), attempts.ZombieRequeue)
}

func TestVerifyHealthyHistory(t *testing.T) {
	t.Parallel()
	b := setupVerify(t)
	b.healthyHistory(t)

	for _, ordered := range []bool{false, true} {
		r := b.verify(t, attempts.VerifyOptions{Ordered: ordered})
		for _, v := range r.Violations {
			t.Errorf("ordered=%v: unexpected violation %s", ordered, v)
		}
		if !r.OK() {
			t.Errorf("ordered=%v: OK() is false", ordered)
		}
		want := attempts.Report{
			Instructions: 7, // alice 1-5, bob 1-2
			Pending:      3, // alice 5, bob 1 (requeued), bob 2
			InFlight:     1, // alice 4
			DeadLetters:  1, // alice 3
			Dispatched:   2, // alice 1, alice 2
			Attempts:     11,
		}
		if !equalCounts(r, want) {
			t.Errorf("ordered=%v: report %+v, want %+v", ordered, r, want)
		}
	}
}

func equalCounts(a, b attempts.Report) bool {
	return a.Instructions == b.Instructions && a.Pending == b.Pending && a.InFlight == b.InFlight &&
		a.DeadLetters == b.DeadLetters && a.Dispatched == b.Dispatched && a.DispatchedTwice == b.DispatchedTwice &&
		a.Attempts == b.Attempts
}

func TestVerifyEmptyDatabase(t *testing.T) {
	t.Parallel()
	b := setupVerify(t)
	r := b.verify(t, attempts.VerifyOptions{Ordered: true})
	if !r.OK() || !equalCounts(r, attempts.Report{}) {
		t.Errorf("empty database: %+v", r)
	}
}

// deadLetterCopy adds a dead letter for an instruction that stays pending
// (two places at once).
func (b *verifyBundle) deadLetterCopy(t *testing.T, id uuid.UUID) {
	t.Helper()
	b.exec(t, `INSERT INTO outbox.dead_letters (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key,
		rail_type, payload, attempt_count, error_code, attempt_id, created_at)
		SELECT outbox_id, instruction_id, participant_id, sequence_id, idempotency_key,
		       rail_type, payload, attempt_count, 'RAIL_REJECTED', gen_random_uuid(), created_at
		FROM outbox.pending WHERE outbox_id = $1`, id)
}

// corruption is a state that breaks one check, and perhaps the checks in
// also that cannot hold once it is broken (an instruction that vanished
// from pending is also missing from its participant's queued count).
type corruption struct {
	name      string
	invariant int
	check     string
	also      []string
	ordered   bool // the check runs only with VerifyOptions.Ordered
	// detail, when set, must be in a violation of check: a check that
	// reads several tables must report the one the corruption is in.
	detail string
	build  func(t *testing.T, b *verifyBundle)
}

var corruptions = []corruption{
	{
		name: "instruction lost", invariant: 1, check: "exactly one place", also: []string{"queued counts"},
		build: func(t *testing.T, b *verifyBundle) {
			id := b.enqueue(t, "p1", "k1")
			b.exec(t, "DELETE FROM outbox.pending WHERE outbox_id = $1", id)
		},
	},
	{
		name: "pending and dead letter", invariant: 1, check: "exactly one place",
		build: func(t *testing.T, b *verifyBundle) {
			id := b.enqueue(t, "p1", "k1")
			b.deadLetterCopy(t, id)
		},
	},
	{
		name: "dispatched and pending again", invariant: 1, check: "exactly one place", also: []string{"queued counts"},
		build: func(t *testing.T, b *verifyBundle) {
			id := b.enqueue(t, "p1", "k1")
			c := b.claim(t, id, true)
			b.exec(t, `INSERT INTO outbox.pending (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key,
				rail_type, payload, attempt_count, created_at)
				SELECT outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type, payload, attempt_no, created_at
				FROM outbox.inflight WHERE outbox_id = $1`, id)
			// The outcome only removes the inflight row; the copy stays.
			b.outcome(t, c, attempts.Dispatched)
		},
	},
	{
		// A late outcome excuses two places only for a late DISPATCHED
		// whose copy is still queued; a late RETRYABLE excuses nothing.
		name: "pending and dead letter after a late retry", invariant: 1, check: "exactly one place",
		build: func(t *testing.T, b *verifyBundle) {
			id := b.enqueue(t, "p1", "k1")
			c := b.claim(t, id, true)
			b.outcome(t, c, attempts.ZombieRequeue)
			b.lateOutcome(t, c, attempts.Retryable)
			b.deadLetterCopy(t, id)
		},
	},
	{
		name: "orphan pending row", invariant: 1, check: "no orphans",
		build: func(t *testing.T, b *verifyBundle) {
			b.exec(t, `INSERT INTO outbox.pending (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type, payload)
				VALUES (gen_random_uuid(), 'ins-ghost', 'ghost', 1, 'k-ghost', 'sandbox', '{}')`)
		},
	},
	{
		name: "orphan dead letter", invariant: 1, check: "no orphans",
		build: func(t *testing.T, b *verifyBundle) {
			b.exec(t, `INSERT INTO outbox.dead_letters (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key,
				rail_type, payload, attempt_count, error_code, attempt_id, created_at)
				VALUES (gen_random_uuid(), 'ins-ghost', 'ghost', 1, 'k-ghost', 'sandbox', '{}', 1, 'RAIL_REJECTED', gen_random_uuid(), now())`)
		},
	},
	{
		// The key of an instruction in flight is gone: its in-flight row
		// (and its DISPATCHING row) name an outbox id no key owns.
		name: "orphan in-flight row", invariant: 1, check: "no orphans", detail: "inflight row", also: []string{"gap-free sequences"},
		build: func(t *testing.T, b *verifyBundle) {
			id := b.enqueue(t, "p1", "k1")
			b.claim(t, id, true)
			b.exec(t, "DELETE FROM outbox.idempotency_keys WHERE outbox_id = $1", id)
		},
	},
	{
		// The key of a dispatched instruction is gone: only its archive
		// rows are left to show it was ever enqueued.
		name: "orphan archive rows", invariant: 1, check: "no orphans", detail: "attempts row", also: []string{"gap-free sequences"},
		build: func(t *testing.T, b *verifyBundle) {
			id := b.enqueue(t, "p1", "k1")
			b.outcome(t, b.claim(t, id, true), attempts.Dispatched)
			b.exec(t, "DELETE FROM outbox.idempotency_keys WHERE outbox_id = $1", id)
		},
	},
	{
		name: "sequence allocated without a key", invariant: 2, check: "gap-free sequences", also: []string{"queued counts"},
		build: func(t *testing.T, b *verifyBundle) {
			b.enqueue(t, "p1", "k1")
			b.exec(t, "SELECT * FROM outbox.allocate_sequences('{p1}', '{1}')")
			b.enqueue(t, "p1", "k3") // sequence 3: 1, 3 committed, 2 missing
		},
	},
	{
		name: "sequence allocated for a participant without keys", invariant: 2, check: "gap-free sequences",
		also: []string{"queued counts"},
		build: func(t *testing.T, b *verifyBundle) {
			b.exec(t, "SELECT * FROM outbox.allocate_sequences('{p-nobody}', '{1}')")
		},
	},
	{
		name: "keys without a sequence row", invariant: 2, check: "gap-free sequences",
		build: func(t *testing.T, b *verifyBundle) {
			b.enqueue(t, "p1", "k1")
			b.exec(t, "DELETE FROM outbox.sequences WHERE participant_id = 'p1'")
		},
	},
	{
		// A retired key and a live key hold the same sequence of one
		// participant: none is missing, and one is there twice, which
		// only the count of the participant's keys shows.
		name: "sequence taken twice", invariant: 2, check: "gap-free sequences",
		build: func(t *testing.T, b *verifyBundle) {
			id := b.enqueue(t, "p1", "k1")
			b.exec(t, `INSERT INTO outbox.retired_keys (digest, outbox_id, participant_id, sequence_id, created_at)
				SELECT sha256(outbox_id::text::bytea), gen_random_uuid(), participant_id, sequence_id, created_at
				FROM outbox.idempotency_keys WHERE outbox_id = $1`, id)
		},
	},
	{
		name: "dead letter with the wrong sequence", invariant: 3, check: "one key one identity",
		build: func(t *testing.T, b *verifyBundle) {
			id := b.enqueue(t, "p1", "k1")
			b.outcome(t, b.claim(t, id, true), attempts.Failed)
			b.exec(t, "UPDATE outbox.dead_letters SET sequence_id = sequence_id + 41 WHERE outbox_id = $1", id)
		},
	},
	{
		name: "pending row with another key", invariant: 3, check: "one key one identity",
		build: func(t *testing.T, b *verifyBundle) {
			id := b.enqueue(t, "p1", "k1")
			b.exec(t, "UPDATE outbox.pending SET idempotency_key = 'k-other' WHERE outbox_id = $1", id)
		},
	},
	{
		name: "pending row with another participant", invariant: 3, check: "one key one identity", also: []string{"queued counts"},
		build: func(t *testing.T, b *verifyBundle) {
			id := b.enqueue(t, "p1", "k1")
			b.exec(t, "UPDATE outbox.pending SET participant_id = 'p-other' WHERE outbox_id = $1", id)
		},
	},
	{
		name: "in-flight row with another key", invariant: 3, check: "one key one identity", detail: "inflight row",
		build: func(t *testing.T, b *verifyBundle) {
			id := b.enqueue(t, "p1", "k1")
			b.claim(t, id, true)
			b.exec(t, "UPDATE outbox.inflight SET idempotency_key = 'k-other' WHERE outbox_id = $1", id)
		},
	},
	{
		// The archive is append-only, so the key is what changed: only
		// the archive rows of the dispatched instruction disagree with it.
		name: "archive rows disagree with their key", invariant: 3, check: "one key one identity", detail: "attempts row",
		build: func(t *testing.T, b *verifyBundle) {
			id := b.enqueue(t, "p1", "k1")
			b.outcome(t, b.claim(t, id, true), attempts.Dispatched)
			b.exec(t, "UPDATE outbox.idempotency_keys SET instruction_id = 'ins-other' WHERE outbox_id = $1", id)
		},
	},
	{
		// Sequence 1 failed (so sequence 2 may start), then was replayed
		// and claimed again while 2 is still in flight: two in flight for
		// p1, though no claim jumped ahead of its predecessor's end.
		name: "two in flight for one participant", invariant: 4, check: "one in flight per participant", ordered: true,
		build: func(t *testing.T, b *verifyBundle) {
			id1 := b.enqueue(t, "p1", "k1")
			id2 := b.enqueue(t, "p1", "k2")
			b.outcome(t, b.claim(t, id1, false), attempts.Failed)
			b.claim(t, id2, false)
			b.replay(t, id1)
			if c := b.claim(t, id1, false); c.attemptNo != 2 {
				t.Fatalf("replayed instruction claimed as attempt %d, want 2", c.attemptNo)
			}
		},
	},
	{
		name: "sequence 2 dispatched before sequence 1", invariant: 4, check: "dispatch order", ordered: true,
		build: func(t *testing.T, b *verifyBundle) {
			id1 := b.enqueue(t, "p1", "k1")
			id2 := b.enqueue(t, "p1", "k2")
			b.outcome(t, b.claim(t, id2, true), attempts.Dispatched)
			b.outcome(t, b.claim(t, id1, true), attempts.Dispatched)
		},
	},
	{
		name: "sequence 2 claimed while sequence 1 awaits a retry", invariant: 4, check: "dispatch order", ordered: true,
		also: []string{"one head per participant"},
		build: func(t *testing.T, b *verifyBundle) {
			id1 := b.enqueue(t, "p1", "k1")
			id2 := b.enqueue(t, "p1", "k2")
			b.outcome(t, b.claim(t, id1, true), attempts.Retryable)
			b.claim(t, id2, true)
		},
	},
	{
		name: "queued count off by one", invariant: 4, check: "queued counts",
		build: func(t *testing.T, b *verifyBundle) {
			b.enqueue(t, "p1", "k1")
			b.exec(t, "UPDATE outbox.sequences SET queued = queued + 1 WHERE participant_id = 'p1'")
		},
	},
	{
		// The head waits and nothing of p1 is in flight: no claim and no
		// outcome would ever make it due.
		name: "stranded participant", invariant: 4, check: "one head per participant",
		build: func(t *testing.T, b *verifyBundle) {
			id := b.enqueue(t, "p1", "k1")
			b.enqueue(t, "p1", "k2")
			b.exec(t, "UPDATE outbox.pending SET next_attempt_at = 'infinity' WHERE outbox_id = $1", id)
		},
	},
	{
		name: "two due rows for one participant", invariant: 4, check: "one head per participant",
		build: func(t *testing.T, b *verifyBundle) {
			b.enqueue(t, "p1", "k1")
			id2 := b.enqueue(t, "p1", "k2")
			b.exec(t, "UPDATE outbox.pending SET next_attempt_at = now() WHERE outbox_id = $1", id2)
		},
	},
	{
		name: "claim closed twice", invariant: 5, check: "every claim closed once",
		build: func(t *testing.T, b *verifyBundle) {
			id := b.enqueue(t, "p1", "k1")
			c := b.claim(t, id, true)
			b.outcome(t, c, attempts.Dispatched)
			b.appendAttempt(t, id, attempts.Dispatched, c.attemptNo, &c.attemptID)
		},
	},
	{
		// A requeue that forgot its ZOMBIE_REQUEUE attempt: the claim is
		// neither closed nor in flight.
		name: "claim never closed and not in flight", invariant: 5, check: "every claim closed once",
		build: func(t *testing.T, b *verifyBundle) {
			id := b.enqueue(t, "p1", "k1")
			b.claim(t, id, true)
			b.exec(t, `WITH f AS (DELETE FROM outbox.inflight WHERE outbox_id = $1 RETURNING *)
				INSERT INTO outbox.pending (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key,
				                            rail_type, payload, attempt_count, created_at)
				SELECT outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type, payload, attempt_no, created_at
				FROM f`, id)
		},
	},
	{
		// What a relayer that re-sent a committed batch (its reply lost)
		// would have written: the outcome again, as late, with no reaper
		// involved.
		name: "outcome archived again as late", invariant: 5, check: "every claim closed once",
		build: func(t *testing.T, b *verifyBundle) {
			id := b.enqueue(t, "p1", "k1")
			c := b.claim(t, id, true)
			b.outcome(t, c, attempts.Dispatched)
			b.lateOutcome(t, c, attempts.Dispatched)
		},
	},
	{
		name: "attempt archived twice", invariant: 5, check: "attempt ids unique",
		build: func(t *testing.T, b *verifyBundle) {
			id := b.enqueue(t, "p1", "k1")
			c := b.claim(t, id, true)
			b.outcome(t, c, attempts.Dispatched)
			b.exec(t, `INSERT INTO outbox.attempts (attempt_id, outbox_id, instruction_id, participant_id, sequence_id,
				idempotency_key, rail_type, payload, attempt_no, state, relayer_id, claimed_at, created_at)
				SELECT attempt_id, outbox_id, instruction_id, participant_id, sequence_id,
				       idempotency_key, rail_type, payload, attempt_no, state, relayer_id, claimed_at, created_at + interval '1 second'
				FROM outbox.attempts WHERE attempt_id = $1`, c.attemptID)
		},
	},
	{
		name: "closer without a claim", invariant: 5, check: "closers match a claim",
		build: func(t *testing.T, b *verifyBundle) {
			id := b.enqueue(t, "p1", "k1")
			b.appendAttempt(t, id, attempts.Retryable, 1, nil)
		},
	},
	{
		name: "closer with another attempt number", invariant: 5, check: "closers match a claim", also: []string{"queued counts"},
		build: func(t *testing.T, b *verifyBundle) {
			id := b.enqueue(t, "p1", "k1")
			c := b.claim(t, id, true)
			b.appendAttempt(t, id, attempts.Dispatched, c.attemptNo+1, &c.attemptID)
			b.exec(t, "DELETE FROM outbox.inflight WHERE outbox_id = $1", id)
		},
	},
	{
		name: "attempt number goes back", invariant: 5, check: "attempt numbers never go back",
		build: func(t *testing.T, b *verifyBundle) {
			id := b.enqueue(t, "p1", "k1")
			b.exec(t, "UPDATE outbox.pending SET attempt_count = 1 WHERE outbox_id = $1", id)
			b.outcome(t, b.claim(t, id, true), attempts.Retryable) // #2, back with attempt_count 2
			b.exec(t, "UPDATE outbox.pending SET attempt_count = 0 WHERE outbox_id = $1", id)
			if c := b.claim(t, id, true); c.attemptNo != 1 {
				t.Fatalf("claimed as attempt %d, want 1", c.attemptNo)
			} else {
				b.outcome(t, c, attempts.Dispatched)
			}
		},
	},
	{
		name: "in flight without its claim", invariant: 5, check: "in-flight rows have their claim",
		build: func(t *testing.T, b *verifyBundle) {
			id := b.enqueue(t, "p1", "k1")
			b.exec(t, `WITH p AS (DELETE FROM outbox.pending WHERE outbox_id = $1 RETURNING *)
				INSERT INTO outbox.inflight (outbox_id, attempt_id, attempt_no, relayer_id, ordered, claimed_at, lease_until,
				                             instruction_id, participant_id, sequence_id, idempotency_key, rail_type, payload, created_at)
				SELECT outbox_id, gen_random_uuid(), 1, 'relayer-1', true, now(), now() + interval '30 seconds',
				       instruction_id, participant_id, sequence_id, idempotency_key, rail_type, payload, created_at
				FROM p`, id)
		},
	},
}

// TestVerifyDetectsCorruption builds each corruption on top of a healthy
// history and expects violations of its check and of no other.
func TestVerifyDetectsCorruption(t *testing.T) {
	t.Parallel()
	for _, c := range corruptions {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			b := setupVerify(t)
			b.healthyHistory(t)
			if r := b.verify(t, attempts.VerifyOptions{Ordered: true}); !r.OK() {
				t.Fatalf("healthy history is not healthy: %v", r.Violations)
			}
			c.build(t, b)

			r := b.verify(t, attempts.VerifyOptions{Ordered: true})
			requireOnly(t, r, c.invariant, c.check, c.also)
			if c.detail != "" && !slices.ContainsFunc(r.Violations, func(v attempts.Violation) bool {
				return v.Check == c.check && strings.Contains(v.Detail, c.detail)
			}) {
				t.Errorf("no violation of %s mentions %q: %v", c.check, c.detail, r.Violations)
			}

			unordered := b.verify(t, attempts.VerifyOptions{Ordered: false})
			if c.ordered {
				for _, v := range unordered.Violations {
					if !slices.Contains(c.also, v.Check) {
						t.Errorf("an ordering check ran without Ordered: %v", v)
					}
				}
			} else if !slices.Equal(unordered.Violations, r.Violations) {
				t.Errorf("without Ordered: %v, want %v", unordered.Violations, r.Violations)
			}
		})
	}
}

// requireOnly fails unless r has a violation of the given invariant and
// check, and no violation but of it or of the checks in also.
func requireOnly(t *testing.T, r attempts.Report, invariant int, check string, also []string) {
	t.Helper()
	if !slices.ContainsFunc(r.Violations, func(v attempts.Violation) bool { return v.Invariant == invariant && v.Check == check }) {
		t.Fatalf("want a violation of invariant %d (%s), report: %+v", invariant, check, r)
	}
	for _, v := range r.Violations {
		if (v.Invariant != invariant || v.Check != check) && !slices.Contains(also, v.Check) {
			t.Errorf("violation %s; want only invariant %d (%s) or %v", v, invariant, check, also)
		} else if v.Detail == "" {
			t.Errorf("violation of %s has no detail", check)
		} else {
			t.Logf("reported: %s", v)
		}
	}
}

func TestVerifyExamplesCapsViolationsPerCheck(t *testing.T) {
	t.Parallel()
	b := setupVerify(t)
	for _, key := range []string{"k1", "k2", "k3"} {
		id := b.enqueue(t, "p1", key)
		b.withdraw(t, id) // lost, with the queued count kept right
	}
	// An orphan as well, so the cap is seen to be per check.
	b.exec(t, `INSERT INTO outbox.pending (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type, payload)
		VALUES (gen_random_uuid(), 'ins-ghost', 'ghost', 1, 'k-ghost', 'sandbox', '{}')`)

	count := func(r attempts.Report, check string) int {
		n := 0
		for _, v := range r.Violations {
			if v.Check == check {
				n++
			}
		}
		return n
	}
	r := b.verify(t, attempts.VerifyOptions{})
	if n := count(r, "exactly one place"); n != 3 {
		t.Errorf("default cap: %d lost instructions reported, want 3", n)
	}
	r = b.verify(t, attempts.VerifyOptions{Examples: 2})
	// Two examples and a line saying there are more.
	if n := count(r, "exactly one place"); n != 3 || !strings.HasPrefix(r.Violations[2].Detail, "and more") {
		t.Errorf("Examples 2: %d lines of lost instructions, want 2 and an \"and more\": %v", n, r.Violations)
	}
	if n := count(r, "no orphans"); n != 1 {
		t.Errorf("Examples 2: %d orphans reported, want 1", n)
	}
	if len(r.Violations) != 4 {
		t.Errorf("Examples 2: violations %v, want 4", r.Violations)
	}
}

// withdraw removes a requeued copy, as a late terminal outcome does: the
// instruction's end, one fewer queued for its participant.
func (b *verifyBundle) withdraw(t *testing.T, id uuid.UUID) {
	t.Helper()
	b.exec(t, `WITH w AS (DELETE FROM outbox.pending WHERE outbox_id = $1 RETURNING participant_id)
		UPDATE outbox.sequences s SET queued = queued - 1 FROM w WHERE s.participant_id = w.participant_id`, id)
}

// lateOutcome records, as a relayer that finished after its lease was
// reaped does, the outcome of an earlier claim with late = true.
func (b *verifyBundle) lateOutcome(t *testing.T, c claimed, state attempts.State) {
	t.Helper()
	b.exec(t, `INSERT INTO outbox.attempts (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
			tenant_id, correlation_id, attempt_no, state, relayer_id, claim_attempt_id, claimed_at, completed_at, late, created_at)
		SELECT outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
		       tenant_id, correlation_id, attempt_no, $2::text, relayer_id, attempt_id, claimed_at, $3::timestamptz, true, $3::timestamptz
		FROM outbox.attempts WHERE attempt_id = $1 AND state = 'DISPATCHING'`, c.attemptID, string(state), b.tick())
}

// TestVerifyLateCompletionWithdrawsCopy: the reaper requeued an expired
// lease, then the original relayer finished late (DISPATCHED, late) and
// withdrew the requeued copy before anyone claimed it. Nothing is violated.
func TestVerifyLateCompletionWithdrawsCopy(t *testing.T) {
	t.Parallel()
	b := setupVerify(t)
	id := b.enqueue(t, "p1", "k1")
	c := b.claim(t, id, true)
	b.outcome(t, c, attempts.ZombieRequeue)
	b.lateOutcome(t, c, attempts.Dispatched)
	b.withdraw(t, id)

	r := b.verify(t, attempts.VerifyOptions{Ordered: true})
	for _, v := range r.Violations {
		t.Errorf("unexpected violation %s", v)
	}
	want := attempts.Report{Instructions: 1, Dispatched: 1, Attempts: 3}
	if !equalCounts(r, want) {
		t.Errorf("report %+v, want counts %+v", r, want)
	}

	// A second late closer of the same claim is one too many.
	b.lateOutcome(t, c, attempts.Dispatched)
	requireOnly(t, b.verify(t, attempts.VerifyOptions{Ordered: true}), 5, "every claim closed once", nil)
}

// TestVerifyDispatchedTwiceIsCounted: a late completion raced the requeued
// copy, which was claimed again (under the same attempt number: a zombie
// does not count) and dispatched too. Two DISPATCHED attempts, each closing
// its own claim: counted as dispatched once and twice-dispatched once, and
// legitimate (the rail saw one idempotency key), so nothing is violated.
func TestVerifyDispatchedTwiceIsCounted(t *testing.T) {
	t.Parallel()
	b := setupVerify(t)
	id := b.enqueue(t, "p1", "k1")
	slow := b.claim(t, id, true)
	b.outcome(t, slow, attempts.ZombieRequeue) // the reaper requeues the expired lease
	again := b.claim(t, id, true)
	if again.attemptNo != slow.attemptNo {
		t.Fatalf("copy claimed as attempt %d, want %d", again.attemptNo, slow.attemptNo)
	}
	b.lateOutcome(t, slow, attempts.Dispatched) // the slow relayer finishes late
	b.outcome(t, again, attempts.Dispatched)

	r := b.verify(t, attempts.VerifyOptions{Ordered: true})
	for _, v := range r.Violations {
		t.Errorf("unexpected violation %s", v)
	}
	want := attempts.Report{Instructions: 1, Dispatched: 1, DispatchedTwice: 1, Attempts: 5}
	if !equalCounts(r, want) {
		t.Errorf("report %+v, want counts %+v", r, want)
	}
}

// TestVerifyLateCompletionAfterCopyRetried: as above, but the copy failed
// retryably and was claimed again as attempt #2 before the slow relayer's
// late DISPATCHED#1 arrived (the relayer was paused longer than a backoff).
// The archive is a true account of what happened and should verify.
func TestVerifyLateCompletionAfterCopyRetried(t *testing.T) {
	t.Parallel()
	b := setupVerify(t)
	id := b.enqueue(t, "p1", "k1")
	slow := b.claim(t, id, true)
	b.outcome(t, slow, attempts.ZombieRequeue)
	b.outcome(t, b.claim(t, id, true), attempts.Retryable) // the copy, #1 again
	retry := b.claim(t, id, true)                          // #2
	if retry.attemptNo != 2 {
		t.Fatalf("retry claimed as attempt %d, want 2", retry.attemptNo)
	}
	b.lateOutcome(t, slow, attempts.Dispatched) // DISPATCHED#1, late, after DISPATCHING#2
	b.outcome(t, retry, attempts.Dispatched)

	r := b.verify(t, attempts.VerifyOptions{Ordered: true})
	want := attempts.Report{Instructions: 1, Dispatched: 1, DispatchedTwice: 1, Attempts: 7}
	if !equalCounts(r, want) {
		t.Errorf("report %+v, want counts %+v", r, want)
	}
	for _, v := range r.Violations {
		t.Errorf("unexpected violation %s", v)
	}
}

// TestVerifyReportsTimesInUTC: the times in verify's violations read the
// same whatever the verifying session's TimeZone and DateStyle: UTC, in
// ISO form. They were written in the session's: under Asia/Kolkata with
// an SQL DateStyle, "29/11/2026 16:33:05.088 IST", an abbreviation
// PostgreSQL itself reads as Israel's, and two auditors' reports of the
// same archive disagreed.
func TestVerifyReportsTimesInUTC(t *testing.T) {
	t.Parallel()
	b := setupVerify(t)
	id1 := b.enqueue(t, "p1", "k1")
	id2 := b.enqueue(t, "p1", "k2")
	b.outcome(t, b.claim(t, id2, true), attempts.Dispatched)
	b.outcome(t, b.claim(t, id1, true), attempts.Dispatched)
	details := func(zone, style string) []string {
		cfg := b.pool.Config().Copy()
		cfg.ConnConfig.RuntimeParams["TimeZone"] = zone
		cfg.ConnConfig.RuntimeParams["DateStyle"] = style
		pool, err := pgxpool.NewWithConfig(b.ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		r, err := b.archive.Verify(b.ctx, pool, attempts.VerifyOptions{Ordered: true})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, v := range r.Violations {
			if v.Check == "dispatch order" {
				out = append(out, v.Detail)
			}
		}
		return out
	}
	utc := details("UTC", "ISO, YMD")
	if len(utc) == 0 || !strings.Contains(utc[0], "+00") {
		t.Fatalf("dispatch order violations in UTC: %q, want one with its times in UTC", utc)
	}
	for _, zone := range []string{"Asia/Kolkata", "America/St_Johns", "Pacific/Kiritimati"} {
		if got := details(zone, "SQL, DMY"); !slices.Equal(got, utc) {
			t.Errorf("verifying in %s, SQL DateStyle: %q, want %q", zone, got, utc)
		}
	}
}
