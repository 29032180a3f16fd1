package store

import (
	"context"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"
)

// withdraw runs withdrawSQL for late terminal outcomes and returns the
// claim attempt ids whose requeued copy it withdrew. A late DISPATCHED
// also settles a poison instruction's dead letter (settlePoisonSQL): the
// rail did act on one of the attempts whose relayer died, so the
// instruction is dispatched, not dead (the reaper already counted it
// finished and moved its participant on). Record calls it. A
// withdrawn copy is its instruction's end, so, as for a terminal outcome,
// the participant's queued count drops (under its lock) and its next
// instruction is made due (the hand-off without refill, claiming nothing).
func (s *Store) withdraw(ctx context.Context, db Batcher, late []Outcome) (map[uuid.UUID]bool, error) {
	n := len(late)
	states, codes, messages, participants := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	attemptNos := make([]int32, n)
	unknown := make([]bool, n)
	for i, o := range late {
		states[i], codes[i], messages[i], attemptNos[i] = string(o.State), o.ErrorCode, o.ErrorMessage, int32(o.AttemptNo)
		participants[i], unknown[i] = o.ParticipantID, o.OutcomeUnknown
	}
	ids := wireUUIDs(late, func(o *Outcome) uuid.UUID { return o.OutboxID })
	var settling []Outcome
	for _, o := range late {
		if o.State == Dispatched {
			settling = append(settling, o)
		}
	}
	dispatched := wireUUIDs(settling, func(o *Outcome) uuid.UUID { return o.OutboxID })
	attemptIDs := wireUUIDs(late, func(o *Outcome) uuid.UUID { return o.AttemptID })
	claimIDs := wireUUIDs(late, func(o *Outcome) uuid.UUID { return o.ClaimAttemptID })
	b := &pgx.Batch{}
	b.Queue(s.sql.lockParticipants, participants)
	b.Queue(s.sql.withdraw, ids, attemptIDs, states, codes, messages, attemptNos, claimIDs, unknown)
	b.Queue(s.sql.handoffSuccessors, "", 0, []string{}, []int64{}, participants, []string{}, false)
	b.Queue(s.sql.settlePoison, dispatched)
	br := db.SendBatch(ctx, b)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return nil, err
	}
	rows, err := br.Query()
	if err != nil {
		return nil, err
	}
	withdrawn, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return nil, err
	}
	if _, err := br.Exec(); err != nil {
		return nil, err
	}
	if _, err := br.Exec(); err != nil {
		return nil, err
	}
	if err := br.Close(); err != nil {
		return nil, err
	}
	m := make(map[uuid.UUID]bool, len(withdrawn))
	for _, id := range withdrawn {
		m[id] = true
	}
	return m, nil
}

// withdrawSQL removes the requeued copies of instructions whose late
// outcome was terminal, if nobody claimed them yet; a FAILED one becomes a
// dead letter. It is a separate statement so that it sees the reaper's
// commit even when recordSQL had to wait for the reaper's lock on the
// in-flight row (recordSQL's snapshot predates that commit). It is
// fenced: only a pending row the reaper requeued from this very claim
// qualifies, never a later retry of the copy or an operator's replay.
//
// The copies are found by key (LATERAL lookups) and deleted by row id,
// like the outcome statement's rows: late outcomes come in numbers when
// leases run out during an incident, when a backlog builds too, and a
// join the planner chose on a drained queue's statistics (0 rows) read the
// whole queue for each write (TestLateOutcomesReadTheQueueByKey).
var withdrawSQL = `
WITH o AS (
  SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::text[], $5::text[], $6::int[], $7::uuid[], $8::bool[])
    AS o(outbox_id, attempt_id, state, error_code, error_message, attempt_no, claim_attempt_id, outcome_unknown)
), copies AS (
  -- Locked as they are found, so that the row ids are those of the rows'
  -- latest versions, whatever changed them since this statement's
  -- snapshot, and stay so until the delete (as a join's delete would
  -- have rechecked them).
  SELECT o.claim_attempt_id, c.row FROM o
  CROSS JOIN LATERAL (SELECT p.ctid AS row FROM {schema}.pending p
                      WHERE p.outbox_id = o.outbox_id AND p.zombie_attempt_id = o.claim_attempt_id LIMIT 1
                      FOR UPDATE) c
), withdrawn AS (
  DELETE FROM {schema}.pending p USING copies c
  WHERE p.ctid = ANY (ARRAY(SELECT row FROM copies)) AND p.ctid = c.row
  RETURNING p.*, c.claim_attempt_id
), finished AS (
  UPDATE {schema}.sequences s SET queued = s.queued - t.n
  FROM (SELECT participant_id, count(*) AS n FROM withdrawn GROUP BY participant_id) t
  WHERE s.participant_id = t.participant_id AND ` + orderedSQL + `
), late_dead AS (
  INSERT INTO {schema}.dead_letters (` + deadLetterColumns + `, chain_head, outcome_unknown)
  SELECT ` + from("w", identityColumns) + `, w.payload,
         greatest(w.attempt_count, o.attempt_no), o.error_code, nullif(o.error_message, ''), o.attempt_id, w.created_at,
         -- the head is the late FAILED row just archived (by primary key);
         -- the requeued copy's head (its ZOMBIE_REQUEUE row) if not found
         coalesce((SELECT a.hash FROM {schema}.attempts a
                   WHERE a.attempt_id = o.attempt_id AND a.created_at >= now() - interval '1 day' LIMIT 1), w.chain_head),
         -- the attempts before the abandoned claim (the copy's), and the
         -- late outcome's own: the late outcome settles that claim
         w.outcome_unknown OR o.outcome_unknown
  -- By claim: one write may hold late outcomes of several claims of one
  -- instruction, and only the claim the copy came from decides its end.
  FROM withdrawn w JOIN o ON o.claim_attempt_id = w.claim_attempt_id
  WHERE o.state = 'FAILED'
)
SELECT claim_attempt_id FROM withdrawn`

// settlePoisonSQL removes the dead letters the reaper made of poison
// instructions (outcome unknown) among $1, whose late DISPATCHED outcome
// is archived. It is a function (migration 16) because the relayer role
// may not delete dead letters otherwise.
const settlePoisonSQL = `SELECT {schema}.settle_poison_dead_letters($1::uuid[])`
