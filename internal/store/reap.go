package store

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"
)

// Requeued is one instruction the reaper put back into pending. LeaseUntil
// and RequeuedAt (both database clock) let callers measure how long a
// zombie waited after its lease ran out.
type Requeued struct {
	OutboxID      uuid.UUID
	InstructionID string
	ParticipantID string
	SequenceID    int64
	// AttemptNo is the abandoned attempt's number; the next claim gets the
	// same number again, because a zombie does not use up the retry budget.
	AttemptNo int
	// RelayerID is the dead relayer that held the lease.
	RelayerID  string
	ClaimedAt  time.Time
	LeaseUntil time.Time
	RequeuedAt time.Time
	// DeadLettered is true for a poison instruction: reaped once more than
	// the zombie limit allows, it became a dead letter (outcome unknown)
	// instead of going back to pending.
	DeadLettered bool
}

// Reap requeues up to limit in-flight instructions whose lease expired,
// in one implicit transaction of two pipelined statements. The first locks
// the sequences rows of the participants of expired instructions, in
// participant order, as producers and outcomes lock them (reapLockSQL).
// The second locks the expired rows of those participants (with ordering
// off, every expired row; an ordered one whose claim committed after the
// first statement is left for the next pass), skipping rows another
// reaper, or a relayer recording a late outcome, holds), deletes them, puts
// each back into pending with its identity, payload, first enqueue time
// and attempt count (see budget.go) marked with the abandoned attempt's id
// (so only that attempt's late outcome may withdraw this copy) and due
// since the dead relayer claimed it (it keeps its place in line instead of
// queueing behind the backlog that built up meanwhile; with ordering on,
// unless a lower sequence of its participant, replayed meanwhile, is
// pending: then that one is made due and the copy waits), and appends one
// ZOMBIE_REQUEUE attempt that closes the dead relayer's DISPATCHING
// attempt. reaperID is named in that row's message.
//
// An instruction the reaper already requeued zombieLimit times (its
// relayer died zombieLimit + 1 times on it: a poison instruction) is not
// requeued: its claim is closed by a FAILED row (error code ZOMBIE_LIMIT),
// it becomes a dead letter marked outcome unknown, and, with ordering on,
// it leaves its participant's queued count and the participant's next
// instruction becomes due. zombieLimit <= 0 means no limit.
//
// Only inflight is read (the whole table: it holds what is in flight, and
// an index on the lease would cost every claim more than it saves a pass
// a minute, migration 014); the archive is only inserted into, so the cost
// does not grow with the archive. A row requeued once is no longer in
// flight, which makes reaping idempotent. The expired rows are deleted by
// row id, and a poison instruction's successor is found by its
// participant's key: joins the planner chose read the whole in-flight
// table per expired row, and every waiting row of pending, on a drained
// queue's statistics (TestReapReadsByKey).
func (s *Store) Reap(ctx context.Context, db Batcher, limit int, reaperID string, zombieLimit int) ([]Requeued, error) {
	if zombieLimit <= 0 {
		zombieLimit = math.MaxInt32
	}
	b := &pgx.Batch{}
	b.Queue(s.sql.reapLock)
	b.Queue(s.sql.reap, limit, reaperID, zombieLimit)
	br := db.SendBatch(ctx, b)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return nil, fmt.Errorf("reap: lock participants: %w", err)
	}
	rows, err := br.Query()
	if err != nil {
		return nil, fmt.Errorf("reap: %w", err)
	}
	batch, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Requeued, error) {
		var q Requeued
		err := row.Scan(scanUUID(&q.OutboxID), &q.InstructionID, &q.ParticipantID, &q.SequenceID, &q.AttemptNo,
			&q.RelayerID, &q.ClaimedAt, &q.LeaseUntil, &q.RequeuedAt, &q.DeadLettered)
		return q, err
	})
	if err == nil {
		err = br.Close()
	}
	if err != nil {
		return nil, fmt.Errorf("reap: %w", err)
	}
	return batch, nil
}

// reapLockSQL locks the sequences rows of the participants of expired
// instructions, in participant order: a poison instruction's dead letter
// changes its participant's queued count, and a requeue may change who is
// its participant's head (reapSQL's behind), which replays and cancels,
// under the same lock, must see. With ordering off it locks nothing. It
// leaves the participants it locked in a setting of the transaction
// (reapLockedSetting), and the reap that follows requeues only the
// expired ordered instructions of those: one whose claim committed
// between the two statements, unseen by this one, is left for the next
// pass. Such a claim's lease can be over when it commits (a claim, or an
// outcome write's hand-off, whose transaction waited for locks longer
// than the lease, which runs from the transaction's start); requeued
// without its participant's lock, a replay of a lower sequence running
// meanwhile saw it in flight and left the replayed instruction waiting,
// while the reap, from a snapshot without that one, made the copy due:
// the participant stranded
// (TestReapLeavesAClaimItDidNotLockForTheNextPass).
const reapLockSQL = `
WITH locked AS (
  SELECT participant_id FROM {schema}.sequences
  WHERE participant_id IN (SELECT participant_id FROM {schema}.inflight WHERE lease_until < now() AND ordered)
    AND ` + orderedSQL + `
  ORDER BY participant_id
  FOR UPDATE
)
SELECT set_config('` + reapLockedSetting + `', coalesce(array_agg(participant_id), '{}')::text, true) FROM locked`

// reapLockedSetting names the transaction's setting in which reapLockSQL
// leaves the participants it locked, as a text[] (a custom setting's name
// needs a dot). Unset or empty (reapSQL alone, as plan tests run it), no
// ordered row is reaped.
const reapLockedSetting = "outbox_reaper.locked"

var reapSQL = `
WITH expired AS (
  SELECT ctid AS row FROM {schema}.inflight
  WHERE lease_until < now()
    AND (NOT ordered OR participant_id = ANY ((SELECT coalesce(nullif(current_setting('` + reapLockedSetting + `', true), ''), '{}'))::text[]))
  ORDER BY lease_until
  LIMIT $1
  FOR UPDATE SKIP LOCKED
), reaped AS (
  DELETE FROM {schema}.inflight f WHERE f.ctid = ANY (ARRAY(SELECT row FROM expired))
  RETURNING f.*, {schema}.uuidv7() AS zombie_id, clock_timestamp() AS archived_at, f.zombie_count >= $3 AS poisoned
), stamped AS (
  SELECT r.*, ` + attemptHash("r.chain_head", zombieValues, "r.archived_at") + ` AS hash FROM reaped r
` + behindSQL("NOT s.poisoned") + `
), requeued AS (
  -- outcome_unknown: the earlier attempts' only; the copy's claim adds
  -- this one's (zombie_attempt_id), unless its late FAILED withdraws it
  INSERT INTO {schema}.pending (` + pendingColumns + `, chain_head, zombie_count, outcome_unknown)
  SELECT ` + identityColumns + `, payload, ` + countAfter("attempt_no", "false") + `,
         CASE WHEN outbox_id IN (SELECT outbox_id FROM behind) THEN 'infinity' ELSE claimed_at END,
         created_at, attempt_id, hash, zombie_count + 1, outcome_unknown
  FROM stamped WHERE NOT poisoned
), poison AS (
  INSERT INTO {schema}.dead_letters (` + deadLetterColumns + `, chain_head, outcome_unknown)
  SELECT ` + identityColumns + `, payload, attempt_no, 'ZOMBIE_LIMIT', ` + zombieMessage + `, zombie_id, created_at, hash, true
  FROM stamped WHERE poisoned
), finished AS (
  UPDATE {schema}.sequences s SET queued = s.queued - t.n
  FROM (SELECT participant_id, count(*) AS n FROM reaped WHERE poisoned AND ordered GROUP BY participant_id) t
  WHERE s.participant_id = t.participant_id AND ` + orderedSQL + `
), promoted AS (
  -- The dead-lettered instruction was its participant's one ordered
  -- instruction in flight (the unique index allows no other), so the
  -- participant's lowest pending row is its head now; so is the one a
  -- requeued instruction is behind.
  -- (The row is locked as it is found and picked by id alone: a
  -- condition on next_attempt_at here let the planner read the due
  -- index's waiting rows instead.)
  UPDATE {schema}.pending p SET ` + dueAgainSQL + `
  WHERE p.ctid = ANY (ARRAY(
      SELECT h.row FROM (SELECT DISTINCT participant_id FROM reaped WHERE poisoned AND ordered) t
      CROSS JOIN LATERAL (SELECT q.ctid AS row, q.next_attempt_at FROM {schema}.pending q
                          WHERE q.participant_id = t.participant_id ORDER BY q.sequence_id LIMIT 1
                          FOR UPDATE) h
      WHERE h.next_attempt_at = 'infinity' AND ` + orderedSQL + `
      UNION ALL
      SELECT row FROM behind WHERE waits))
), zombie AS (
  INSERT INTO {schema}.attempts (` + chainedArchiveColumns + `)
  SELECT ` + zombieValues + `, archived_at, chain_head, hash
  FROM stamped
)
SELECT outbox_id, instruction_id, participant_id, sequence_id, attempt_no, relayer_id, claimed_at, lease_until, now(), poisoned
FROM reaped
ORDER BY lease_until, outbox_id`

// behindSQL is the CTE behind, after a CTE stamped of instructions going
// back to pending (a retry, a reaper's requeue): for each of them that
// filter keeps (over s) and ordering covers, the lowest pending row of its
// participant below its sequence, locked, and whether that row waits
// (waits). Such a row is a dead letter an operator replayed while the
// instruction was in flight, which waits for it; no terminal outcome will
// hand it on, so the instruction goes back waiting and that row is made
// due (a write's ahead, a reap's promoted). One probe of the (participant,
// sequence) key per instruction; rows change only in that rare case.
func behindSQL(filter string) string {
	return `
), behind AS (
  SELECT s.outbox_id, h.row, h.next_attempt_at = 'infinity' AS waits FROM stamped s
  CROSS JOIN LATERAL (SELECT q.ctid AS row, q.next_attempt_at FROM {schema}.pending q
                      WHERE q.participant_id = s.participant_id AND q.sequence_id < s.sequence_id
                      ORDER BY q.sequence_id LIMIT 1 FOR UPDATE) h
  WHERE ` + filter + ` AND s.ordered`
}

// zombieMessage says what happened to a reaped instruction ($2 is the
// reaper's id). Its times are written in UTC, in one form (as a cancel's
// RAIL_MAY_STILL_ACT detail is): the message is archived for good, and
// in the reaper session's TimeZone and DateStyle it read "IST", which
// PostgreSQL itself reads as Israel's.
const zombieMessage = `format('lease of relayer %s expired at %s (claimed at %s, %s time(s) so far); %s by reaper %s',
         relayer_id, to_char(lease_until AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
         to_char(claimed_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'), zombie_count + 1,
         CASE WHEN poisoned THEN 'dead-lettered, outcome unknown,' ELSE 'requeued' END, $2::text)`

// zombieValues are the archive values of the row that closes a reaped
// claim, from the reaped in-flight row: ZOMBIE_REQUEUE, or for a poison
// instruction FAILED with error code ZOMBIE_LIMIT.
const zombieValues = `zombie_id, ` + identityColumns + `,
         NULL::jsonb, attempt_no, CASE WHEN poisoned THEN 'FAILED' ELSE 'ZOMBIE_REQUEUE' END, relayer_id, attempt_id,
         claimed_at, now(), CASE WHEN poisoned THEN NULL ELSE now() END, NULL::text, NULL::text,
         CASE WHEN poisoned THEN 'ZOMBIE_LIMIT' ELSE 'ZOMBIE_REQUEUE' END, ` + zombieMessage + `,
         NULL::int, false`

// ReapSQL is the reaping statement, for plan tests.
func (s *Store) ReapSQL() string { return s.sql.reap }
