package store

import (
	"context"
	"fmt"
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
}

// Reap requeues up to limit in-flight instructions whose lease expired, in
// one statement (one implicit transaction): it locks them (skipping rows
// another reaper, or a relayer recording a late outcome, holds), deletes
// them, puts each back into pending with its identity, payload, first
// enqueue time and attempt count (see budget.go) marked with the abandoned
// attempt's id (so only that attempt's late outcome may withdraw this
// copy) and due since the dead relayer claimed it (it keeps its place in
// line instead of queueing behind the backlog that built up meanwhile),
// and appends one ZOMBIE_REQUEUE attempt that closes the dead
// relayer's DISPATCHING attempt. reaperID is named in that row's message.
//
// Only inflight is read (through inflight_lease_idx); the archive is only
// inserted into, so the cost does not grow with the archive. A row
// requeued once is no longer in flight, which makes reaping idempotent.
func (s *Store) Reap(ctx context.Context, db Querier, limit int, reaperID string) ([]Requeued, error) {
	rows, err := db.Query(ctx, s.sql.reap, limit, reaperID)
	if err != nil {
		return nil, fmt.Errorf("reap: %w", err)
	}
	batch, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Requeued, error) {
		var q Requeued
		err := row.Scan(scanUUID(&q.OutboxID), &q.InstructionID, &q.ParticipantID, &q.SequenceID, &q.AttemptNo,
			&q.RelayerID, &q.ClaimedAt, &q.LeaseUntil, &q.RequeuedAt)
		return q, err
	})
	if err != nil {
		return nil, fmt.Errorf("reap: %w", err)
	}
	return batch, nil
}

var reapSQL = `
WITH expired AS (
  SELECT outbox_id FROM {schema}.inflight
  WHERE lease_until < now()
  ORDER BY lease_until
  LIMIT $1
  FOR UPDATE SKIP LOCKED
), reaped AS (
  DELETE FROM {schema}.inflight f USING expired e
  WHERE f.outbox_id = e.outbox_id
  RETURNING f.*, {schema}.uuidv7() AS zombie_id, clock_timestamp() AS archived_at
), stamped AS (
  SELECT r.*, ` + attemptHash("r.chain_head", zombieValues, "r.archived_at") + ` AS hash FROM reaped r
), requeued AS (
  INSERT INTO {schema}.pending (` + pendingColumns + `, chain_head)
  SELECT ` + identityColumns + `, payload,
         ` + countAfter("attempt_no", "false") + `, claimed_at, created_at, attempt_id, hash
  FROM stamped
), zombie AS (
  INSERT INTO {schema}.attempts (` + chainedArchiveColumns + `)
  SELECT ` + zombieValues + `, archived_at, chain_head, hash
  FROM stamped
)
SELECT outbox_id, instruction_id, participant_id, sequence_id, attempt_no, relayer_id, claimed_at, lease_until, now()
FROM reaped
ORDER BY lease_until, outbox_id`

// zombieValues are the archive values of a ZOMBIE_REQUEUE row, from the
// reaped in-flight row ($2 is the reaper's id).
const zombieValues = `zombie_id, ` + identityColumns + `,
         NULL::jsonb, attempt_no, 'ZOMBIE_REQUEUE', relayer_id, attempt_id,
         claimed_at, now(), now(), NULL::text, NULL::text, 'ZOMBIE_REQUEUE',
         format('lease of relayer %s expired at %s (claimed at %s); requeued by reaper %s',
                relayer_id, lease_until, claimed_at, $2::text),
         NULL::int, false`

// ReapSQL is the reaping statement, for plan tests.
func (s *Store) ReapSQL() string { return s.sql.reap }
