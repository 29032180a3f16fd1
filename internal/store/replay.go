package store

import (
	"context"
	"fmt"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"
)

// Replay sends a dead letter back to pending with the same outbox and
// sequence id and a fresh retry budget (see budget.go), and archives a
// REPLAYED row naming the operator, in one transaction of two statements:
// the first locks the participant's sequences row (producers and outcomes
// of the participant wait), the second, seeing everything committed
// before, counts the instruction back into queued and, with ordering on,
// makes it its participant's head when nothing of the participant is in
// flight and no lower sequence is pending (the head it replaces waits
// again). It reports whether the dead letter existed.
func (s *Store) Replay(ctx context.Context, db Batcher, outboxID uuid.UUID, operator string) (bool, error) {
	b := &pgx.Batch{}
	b.Queue(s.sql.replayLock, outboxID)
	b.Queue(s.sql.replay, outboxID, operator)
	br := db.SendBatch(ctx, b)
	defer br.Close()
	var n int
	_, err := br.Exec()
	if err == nil {
		err = br.QueryRow().Scan(&n)
	}
	if err == nil {
		err = br.Close()
	}
	if err != nil {
		return false, fmt.Errorf("replay %s: %w", outboxID, err)
	}
	return n == 1, nil
}

const replayLockSQL = `
SELECT 1 FROM {schema}.sequences s JOIN {schema}.dead_letters d USING (participant_id)
WHERE d.outbox_id = $1
FOR UPDATE OF s`

var replaySQL = `
WITH d AS (
  DELETE FROM {schema}.dead_letters WHERE outbox_id = $1
  RETURNING *, {schema}.uuidv7() AS replay_id, clock_timestamp() AS archived_at
), stamped AS (
  SELECT d.*, ` + attemptHash("d.chain_head", replayValues, "d.archived_at") + ` AS hash FROM d
), counted AS (
  UPDATE {schema}.sequences s SET queued = s.queued + 1 FROM d WHERE s.participant_id = d.participant_id
), first AS (
  SELECT NOT ` + orderedSQL + ` OR (
           NOT EXISTS (SELECT 1 FROM {schema}.inflight i WHERE i.participant_id = d.participant_id AND i.ordered)
           AND NOT EXISTS (SELECT 1 FROM {schema}.pending q WHERE q.participant_id = d.participant_id AND q.sequence_id < d.sequence_id)
         ) AS head
  FROM d
), demoted AS (
  UPDATE {schema}.pending p SET next_attempt_at = 'infinity'
  FROM d, first
  WHERE first.head AND ` + orderedSQL + ` AND p.participant_id = d.participant_id
    AND p.sequence_id > d.sequence_id AND p.next_attempt_at <> 'infinity'
), requeued AS (
  INSERT INTO {schema}.pending (` + pendingColumns + `, chain_head)
  SELECT ` + identityColumns + `, payload, ` + replayedCount + `,
         CASE WHEN (SELECT head FROM first) THEN now() ELSE 'infinity' END, created_at, NULL, hash
  FROM stamped
), archived AS (
  INSERT INTO {schema}.attempts (` + chainedArchiveColumns + `)
  SELECT ` + replayValues + `, archived_at, chain_head, hash
  FROM stamped
)
SELECT count(*) FROM d`

// replayValues are the archive values of a REPLAYED row, from the deleted
// dead letter ($2 is the operator).
var replayValues = `replay_id, ` + identityColumns + `,
         payload, ` + replayedCount + `, 'REPLAYED', $2::text, NULL::uuid,
         now(), now(), now(), NULL::text, NULL::text, NULL::text,
         format('replayed by %s after %s', $2::text, error_code), NULL::int, false`
