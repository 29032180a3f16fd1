package store

import (
	"context"
	"fmt"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// HandoffParams let the transaction that records outcomes claim work for
// the dispatch slots its terminal outcomes free, for the relayer to
// dispatch at once (no wake, no claim round trip): first the next
// instruction of the participants it freed, then any due instruction.
type HandoffParams struct {
	RelayerID string
	// Limit is how many it may claim (the relayer's free dispatch slots);
	// freed participants beyond it get their next instruction made due
	// instead.
	Limit int
	// Leases are the claimable rail types and their leases, as for Claim.
	Leases map[string]time.Duration
	// Refill fills the slots the freed participants' successors leave from
	// the due queue. Relayers ask for it while draining a backlog (their
	// claims come back full): there it saves a claim transaction per
	// batch. At a steady rate their hot polls find new work anyway, and a
	// refill in every write only lengthens the write.
	Refill bool
}

// lockParticipantsLateSQL is lockParticipantsSQL for the writes that send
// recordLateSQL, with ordering on or off: a late outcome's
// late_outcome_prior (migration 050) locks its participant's row before it
// looks for another outcome of its claim, and taken here first, in
// participant order, those locks cannot deadlock two late writes, nor a
// late write and a producer that locks in participant order
// (EnqueueBatch). A transaction that enqueues for several participants
// in another order can deadlock with it, ordering on or off (one of the
// two is rolled back, 40P01; the relayer writes again), as with any
// outcome write when ordering is on. Only after a reaped lease or a lost
// commit reply.
const lockParticipantsLateSQL = lockSequencesSQL + lockInOrderSQL

// lockParticipantsSQL locks the sequences rows of the participants whose
// outcomes are terminal or retryable, in participant order (as producers
// lock them, so the two cannot deadlock), before the outcome statement
// decrements their queued counts or puts a retry back (which may make a
// replayed instruction the head: requeuedSQL). Replays and cancels take
// the same lock, so each sees the other's rows. With ordering off it locks
// nothing. $1 participants.
const lockParticipantsSQL = lockSequencesSQL + ` AND ` + orderedSQL + lockInOrderSQL

// lockSequencesSQL and lockInOrderSQL are the two locks' head and tail:
// the participants $1's sequences rows, locked in participant order.
const (
	lockSequencesSQL = `
SELECT 1 FROM {schema}.sequences
WHERE participant_id = ANY($1::text[])`
	lockInOrderSQL = `
ORDER BY participant_id
FOR UPDATE`
)

// handoffSQL runs after an outcome statement, in its transaction, for the
// participants of its terminal outcomes ($5). It is a statement of its own
// so that it sees every producer that committed while the outcome
// statement waited for the participants' locks. It claims up to $2
// instructions on claimable rails, exactly as Claim would ($1 relayer, $3
// rail types, $4 leases):
//
//   - successors: for each freed participant with nothing in flight whose
//     next instruction (lowest pending sequence) waits (next_attempt_at =
//     'infinity'), that instruction; those beyond $2, those of a rail
//     this relayer does not claim or an operator paused, those whose
//     retry time is still ahead (retry_at: a retry that waited behind a
//     replay, migration 039) and suspects (a reaped copy, or a head a
//     replay put waiting, whose relayers died with it twice: a relayer
//     claims those alone, ClaimParams.Suspects) are made due instead
//     (dueAgainSQL). Which
//     of them are beyond $2 is not chosen by age: a relayer asks for as
//     many as it records terminal outcomes, so none are, and
//     one made due is claimed by the next claim anyway (sorting them cost
//     a write of ten outcomes about 2%). With ordering off nothing waits.
//   - refill, if $7: the slots left are filled from the due queue, as
//     Claim fills them (dueRows), but never with an instruction of this batch's
//     outcomes ($6 outbox ids): the reaper's requeued copy of a late
//     DISPATCHED outcome is due, and Record withdraws it after this
//     statement; the transaction that records the payment must not send
//     it again. (NOT IN a subquery is a hashed lookup; <> ALL($6)
//     compared every candidate with the whole batch.) A relayer draining a queue then needs one transaction per
//     batch instead of two, a claim and an outcome write.
//
// Successor lookups are per freed participant, through an index (the
// LATERAL ... LIMIT 1 forms keep the planner from hashing the whole
// in-flight table, whose heap churns with every claim), the refill is a
// claim's scan of the due index, and the rows found are changed by row id
// (ctid), so the cost is O(outcomes). The waiting rows need no row lock:
// only the outcome of their participant's head (this statement, under the
// participant's lock) makes them due or claims them. The refill cannot
// take a freed participant's next instruction: it waits until promoted,
// which this statement's own snapshot does not see.
var handoffSQL = handoffWith(refillSQL, true)

// handoffSuccessorsSQL is handoffSQL without the refill, for writes that
// do not ask for one (HandoffParams.Refill false: a relayer at a steady
// rate, or with a few busy participants): PostgreSQL sets up every node of
// a plan at each execution, run or not, and the refill's claim is a
// quarter of the hand-off's plan. Same parameters ($6 and $7 unused).
var handoffSuccessorsSQL = handoffWith(noRefillSQL, true)

// handoffFencedSQL and handoffFencedSuccessorsSQL are handoffSQL and
// handoffSuccessorsSQL without the look for a freed participant's
// in-flight row, for the writes whose outcome statement took only
// outcomes still holding their in-flight row (recordSQL,
// recordDispatchedSQL: anything else and it fails). Each freed
// participant's one in-flight row (ordering on: the unique index) is then
// the one this transaction deleted, and any transaction that inserts
// another waits on that delete until this one ends, so the look can find
// nothing. Only a late or repeated outcome's participant can be busy
// (with the attempt the reaper's requeue led to), and those writes send
// recordLateSQL and the hand-off that looks. Over 10 participants the
// look was about 2% of a write. Same parameters.
var (
	handoffFencedSQL           = handoffWith(refillSQL, false)
	handoffFencedSuccessorsSQL = handoffWith(noRefillSQL, false)
)

// noRefillSQL is the refill relation of a hand-off that does not refill.
const noRefillSQL = `
  SELECT NULL::tid AS row WHERE $7::bool IS NULL AND $6::uuid[] IS NULL`

// refillSQL is the hand-off's refill (see handoffSQL).
var refillSQL = dueRows("p.zombie_count < "+suspectAfter+" AND p.outbox_id NOT IN (SELECT unnest($6::uuid[]))", "CASE WHEN $7::bool THEN $2 - (SELECT count(*) FROM successors) ELSE 0 END")

// handoffAsOutcomesSQL is handoffFencedSQL with its result folded into the 13
// arrays recordSQL takes and its participants, kept in the session's
// settings (asOutcomesSQL): the benchmark's ceiling records one write's
// hand-offs in the next, as a draining relayer does, with nothing in
// between.
var handoffAsOutcomesSQL = handoffTail(refillSQL, false, claimWritesSQL+asOutcomesSQL)

// handoffSuccessorsAsOutcomesSQL is handoffAsOutcomesSQL without the
// refill (handoffFencedSuccessorsSQL's result so folded), as a relayer
// sends it while its claims come back short: a few busy participants.
var handoffSuccessorsAsOutcomesSQL = handoffTail(noRefillSQL, false, claimWritesSQL+asOutcomesSQL)

// handoffWith renders handoffSQL with refill as its refill relation, and
// with the look for busy participants if busy.
func handoffWith(refill string, busy bool) string { return handoffTail(refill, busy, claimTailSQL) }

// handoffTail renders handoffSQL with refill as its refill relation, the
// look for busy participants if busy, and tail (the claim's writes and
// result) after its claims.
func handoffTail(refill string, busy bool, tail string) string {
	waiting := `
  WHERE h.next_attempt_at = 'infinity'`
	if busy {
		waiting = `
  LEFT JOIN LATERAL (
    SELECT true AS busy FROM {schema}.inflight i WHERE i.participant_id = f.participant_id AND i.ordered LIMIT 1) b ON true
  WHERE h.next_attempt_at = 'infinity' AND b.busy IS NULL`
	}
	return `
WITH freed AS (
  SELECT DISTINCT u.participant_id FROM unnest($5::text[]) AS u(participant_id)
  WHERE ` + orderedSQL + `
), waiting AS (
  SELECT h.* FROM freed f
  CROSS JOIN LATERAL (
    SELECT p.ctid AS row, p.next_attempt_at, p.retry_at, p.rail_type, p.created_at, p.zombie_count FROM {schema}.pending p
    WHERE p.participant_id = f.participant_id ORDER BY p.sequence_id LIMIT 1) h` + waiting + `
), successors AS (
  SELECT w.row FROM waiting w
  WHERE w.rail_type = ANY (` + claimableRails + `) AND (w.retry_at IS NULL OR w.retry_at <= now())
    AND w.zombie_count < ` + suspectAfter + `
  LIMIT $2
), refill AS (` + refill + `
), locked AS (
  SELECT row FROM successors UNION ALL SELECT row FROM refill
), promoted AS (
  UPDATE {schema}.pending p SET ` + dueAgainSQL + `
  WHERE p.ctid = ANY (ARRAY(SELECT row FROM waiting WHERE row NOT IN (SELECT row FROM successors)))
),` + tail
}

// LostHandoffs returns the claims, still in flight, that the hand-off of
// an outcome write made for relayerID when that write committed but its
// reply was lost (the connection broke after the commit): the relayer
// never learned of them, so nothing dispatches them, and until this they
// waited for their leases to end and for the reaper, which counted each a
// zombie. outcomeID is the attempt id of one outcome of that write and
// claimedAt its claim's time (which bounds the archive's partitions).
//
// The caller must have recorded the outcomes again without a hand-off
// (HandoffParams.Limit 0) before it asks: then the transaction that
// archived outcomeID is the lost write if it committed, and any other
// made no hand-off. A transaction's rows share its id (xmin), and neither
// archive nor in-flight rows are ever updated, so the in-flight rows of
// relayerID with the xmin of outcomeID's archive row are exactly that
// write's hand-offs. None is returned if the outcome is not in an
// attached partition (a month detached in between): those stay for the
// reaper. Only a relayer recovering from a lost reply calls it; a read of
// the in-flight table, which holds what is in flight.
func (s *Store) LostHandoffs(ctx context.Context, db Querier, relayerID string, outcomeID uuid.UUID, claimedAt time.Time) ([]Claimed, error) {
	rows, err := db.Query(ctx, s.sql.lostHandoffs, relayerID, pgtype.UUID{Bytes: outcomeID, Valid: true}, claimedAt)
	if err != nil {
		return nil, fmt.Errorf("lost hand-offs: %w", err)
	}
	claimed, err := collectClaimed(rows)
	if err != nil {
		return nil, fmt.Errorf("lost hand-offs: %w", err)
	}
	return claimed, nil
}

// lostHandoffsSQL: see LostHandoffs. $1 relayer id, $2 the outcome's
// attempt id, $3 its claim's time. Same columns as claimTailSQL.
const lostHandoffsSQL = `
SELECT i.outbox_id, i.attempt_id, i.attempt_no, i.instruction_id, i.participant_id, i.sequence_id, i.idempotency_key,
       i.rail_type, i.tenant_id, i.correlation_id, i.payload, i.claimed_at, i.lease_until, i.created_at
FROM {schema}.inflight i
WHERE i.relayer_id = $1
  AND i.xmin = (SELECT a.xmin FROM {schema}.attempts a
                WHERE a.attempt_id = $2 AND a.created_at >= $3::timestamptz - interval '1 day' LIMIT 1)
ORDER BY i.claimed_at, i.participant_id, i.sequence_id`

// LostClaims returns the claims, still in flight, that a claim statement
// of relayerID made when it committed but its reply was lost (the
// connection broke after the commit): the relayer never learned of them,
// so nothing dispatches them, and until this they waited for their leases
// to end and for the reaper, which counted each a zombie, and with
// ordering on held their participants' queues for as long.
//
// after is the latest claimed_at of the claims the relayer did learn of
// since it started (its claims are made one after the other, so the lost
// one began after every one of those), and known the attempt ids it holds
// of the same call (a probe claimed before the claim that was lost). The
// rows returned are those of relayerID claimed after after, not in
// known, in one transaction that archived nothing but its claims'
// DISPATCHING rows: a hand-off claims for the relayer too, in the
// transaction that archives the outcomes whose slots it takes, and the
// relayer holds those (or the recorder hands them back, LostHandoffs). A
// transaction's rows share its id (xmin), and neither archive nor
// in-flight rows are ever updated; an outcome's row is archived after its
// write began (claimed_at of the write's hand-offs) and before the
// hand-off's own DISPATCHING rows, so the look for one reads the
// archive's rows of that span only (one transaction at a time, LATERAL
// ... LIMIT 1, through the BRIN index on created_at: joined, the planner
// hashed every partition's rows). If the rows that are left come from
// more than one transaction (another process claims under the same
// relayer id), none is returned: the relayer cannot tell which are its
// own, and they stay for the reaper. When the lost claim did not commit
// and another process of the same id claimed once since, that claim is
// the one transaction left, and nothing in its rows tells it from the
// lost one; so none is returned either while another run of relayerID
// than runID, the caller's (RegisterRun), is registered with a
// ClaimsUntil after after: a claim that run dispatches may be among the
// rows, and they stay for the reaper, as before the look existed. The
// check is part of the statement, so a claim the look sees is one whose
// run's registration it sees too. A run registered before the caller and
// killed (its ClaimsUntil before after) does not stop the look: every
// claim it dispatched began before after, and none of them is looked at.
// Only a relayer recovering from a claim whose reply was lost calls it:
// a read of the in-flight table.
func (s *Store) LostClaims(ctx context.Context, db Querier, relayerID string, runID uuid.UUID, after time.Time, known []uuid.UUID) ([]Claimed, error) {
	ids := make([]pgtype.UUID, len(known))
	for i, id := range known {
		ids[i] = pgtype.UUID{Bytes: id, Valid: true}
	}
	rows, err := db.Query(ctx, s.sql.lostClaims, relayerID, after, ids, pgtype.UUID{Bytes: runID, Valid: true})
	if err != nil {
		return nil, fmt.Errorf("lost claims: %w", err)
	}
	claimed, err := collectClaimed(rows)
	if err != nil {
		return nil, fmt.Errorf("lost claims: %w", err)
	}
	return claimed, nil
}

// lostClaimsSQL: see LostClaims. $1 relayer id, $2 the latest claimed_at
// the relayer knows of, $3 the attempt ids it holds of the same call, $4
// its run id. Same columns as claimTailSQL.
const lostClaimsSQL = `
WITH candidates AS (
  SELECT i.*, i.xmin AS tx FROM {schema}.inflight i
  WHERE i.relayer_id = $1 AND i.claimed_at > $2 AND i.attempt_id <> ALL ($3::uuid[])
), claims AS (
  SELECT g.tx FROM (
    SELECT c.tx, min(c.claimed_at) AS claimed_at, (array_agg(c.attempt_id))[1] AS attempt_id
    FROM candidates c GROUP BY c.tx) g
  CROSS JOIN LATERAL (
    SELECT d.created_at FROM {schema}.attempts d
    WHERE d.attempt_id = g.attempt_id AND d.created_at >= g.claimed_at LIMIT 1) d
  LEFT JOIN LATERAL (
    SELECT true AS wrote FROM {schema}.attempts a
    WHERE a.created_at >= g.claimed_at AND a.created_at <= d.created_at
      AND a.xmin = g.tx AND a.state <> 'DISPATCHING' LIMIT 1) o ON true
  WHERE o.wrote IS NULL
)
SELECT c.outbox_id, c.attempt_id, c.attempt_no, c.instruction_id, c.participant_id, c.sequence_id, c.idempotency_key,
       c.rail_type, c.tenant_id, c.correlation_id, c.payload, c.claimed_at, c.lease_until, c.created_at
FROM candidates c
WHERE c.tx IN (SELECT tx FROM claims) AND (SELECT count(*) FROM claims) = 1
  AND NOT EXISTS (SELECT 1 FROM {schema}.relayer_runs r
                  WHERE r.relayer_id = $1 AND r.run_id <> $4 AND r.claims_until > $2)
ORDER BY c.claimed_at, c.participant_id, c.sequence_id`
