package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ClaimParams describe one claim.
type ClaimParams struct {
	// RelayerID is recorded in the attempt and in-flight rows.
	RelayerID string
	// Limit is the most instructions to claim.
	Limit int
	// Suspects claims suspects only (instructions the reaper requeued
	// twice: their relayer died twice while they were in flight, see
	// reap.go and suspectAfter), which the plain claim leaves alone, so
	// that a relayer dispatches a suspect with nothing else in flight: if
	// the suspect is a poison instruction, it is the only one its death
	// makes a zombie again.
	Suspects bool
	// Leases maps each rail type to claim to its lease (the rail's hard
	// timeout plus a grace period). Other rail types are left alone.
	Leases map[string]time.Duration
}

// Claimed is an instruction a relayer now owns until its lease ends.
type Claimed struct {
	Identity
	AttemptID  uuid.UUID // the DISPATCHING attempt
	AttemptNo  int
	Payload    []byte // the JSON the producer stored
	ClaimedAt  time.Time
	LeaseUntil time.Time
	EnqueuedAt time.Time // first enqueue, kept across retries
}

// ErrOrderingConflict is returned when the database refused a second
// in-flight instruction for a participant (a concurrent claim won the race).
// Nothing was claimed; claiming again is safe.
var ErrOrderingConflict = errors.New("claim: participant already has an instruction in flight")

// Claim moves up to p.Limit due instructions from pending to in flight in
// one statement (one implicit transaction, one round trip; generic plans:
// see genericplans.go): it deletes them from pending,
// appends one DISPATCHING attempt each (attempt number: see budget.go) and
// inserts one in-flight row each with its lease. Rows locked by a
// concurrent claim are skipped, so relayers never claim the same
// instruction.
//
// With ordering on (the settings table), only heads are due (see
// enqueue.go), so this is a scan of the due index whatever the number of
// participants; each candidate is also checked to have no lower pending
// sequence, and the in-flight row is marked ordered, which the database
// allows once per participant.
func (s *Store) Claim(ctx context.Context, db Batcher, p ClaimParams) ([]Claimed, error) {
	claimed, _, err := s.ClaimAsking(ctx, db, p, nil)
	return claimed, err
}

// ClaimAsking is Claim that also asks, if suspectRails is not empty,
// whether suspects of those rail types are due (as SuspectsDue does), in
// the claim's own round trip: the check's statement follows the claim's in
// the same pipelined batch. A relayer asks four times a second; asked in a
// round trip of its own before the claim, the check held up every
// instruction that claim took, by a round trip (about 1.3% of the
// instructions at a steady 1,000/s, a fifth of those past the p99 of
// enqueue → rail call: docs/performance.md). The answer is false whenever
// nothing was asked. The check runs in the claim's implicit transaction:
// if it fails, nothing is claimed and the error is returned, as for the
// claim's own failures.
func (s *Store) ClaimAsking(ctx context.Context, db Batcher, p ClaimParams, suspectRails []string) ([]Claimed, bool, error) {
	if p.Limit <= 0 || len(p.Leases) == 0 {
		return nil, false, nil
	}
	railTypes, leaseMS := leaseArrays(p.Leases)
	q := s.sql.claim
	if p.Suspects {
		q = s.sql.claimSuspects
	}
	b := &pgx.Batch{}
	generic := queueGenericPlans(b, db, claimPlansSQL)
	b.Queue(q, p.RelayerID, p.Limit, railTypes, leaseMS)
	ask := len(suspectRails) > 0
	if ask {
		b.Queue(s.sql.suspectsDue, suspectRails)
	}
	br := db.SendBatch(ctx, b)
	claimed, due, err := readClaimBatch(br, generic, ask)
	if cerr := br.Close(); err == nil && cerr != nil {
		err = claimError(cerr)
	}
	if err != nil {
		return nil, false, err
	}
	return claimed, due, nil
}

// readClaimBatch reads the results of ClaimAsking's batch: the settings
// (if generic), the claim, and the suspects check (if ask).
func readClaimBatch(br pgx.BatchResults, generic, ask bool) ([]Claimed, bool, error) {
	if err := skipGenericPlans(br, generic); err != nil {
		return nil, false, claimError(err)
	}
	rows, err := br.Query()
	if err != nil {
		return nil, false, claimError(err)
	}
	claimed, err := collectClaimed(rows)
	if err != nil || !ask {
		return claimed, false, err
	}
	var due bool
	if err := br.QueryRow().Scan(&due); err != nil {
		return nil, false, fmt.Errorf("suspects due: %w", err)
	}
	return claimed, due, nil
}

// leaseArrays turns leases by rail type into the statements' two arrays.
func leaseArrays(leases map[string]time.Duration) ([]string, []int64) {
	railTypes := make([]string, 0, len(leases))
	leaseMS := make([]int64, 0, len(leases))
	for t, d := range leases {
		railTypes = append(railTypes, t)
		leaseMS = append(leaseMS, d.Milliseconds())
	}
	return railTypes, leaseMS
}

// collectClaimed reads the rows of claimTailSQL.
func collectClaimed(rows pgx.Rows) ([]Claimed, error) {
	claimed, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Claimed, error) {
		var (
			c            Claimed
			tenant, corr *string
		)
		err := row.Scan(scanUUID(&c.OutboxID), scanUUID(&c.AttemptID), &c.AttemptNo, &c.InstructionID, &c.ParticipantID, &c.SequenceID,
			&c.IdempotencyKey, &c.RailType, &tenant, &corr, &c.Payload, &c.ClaimedAt, &c.LeaseUntil, &c.EnqueuedAt)
		c.TenantID, c.CorrelationID = deref(tenant), deref(corr)
		return c, err
	})
	if err != nil {
		return nil, claimError(err)
	}
	return claimed, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func claimError(err error) error {
	if isOrderingConflict(err) {
		return fmt.Errorf("%w: %v", ErrOrderingConflict, err)
	}
	return fmt.Errorf("claim: %w", err)
}

// isOrderingConflict reports whether err is the database refusing a
// second ordered in-flight row for a participant.
func isOrderingConflict(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.ConstraintName == "inflight_ordered_participant_idx"
}

// claimSQL picks due rows in the due index's order, skipping rows other
// claims hold. $1 relayer id, $2 limit, $3 rail types, $4 their leases (ms).
var claimSQL = claimLockedSQL + claimTailSQL

// claimLockedSQL is the first part of claimSQL: the relation locked, the
// due rows it takes.
var claimLockedSQL = claimLocked("p.zombie_count < " + suspectAfter)

// claimSuspectsSQL is claimSQL for suspects (ClaimParams.Suspects), found
// through their partial index (migration 009).
var claimSuspectsSQL = claimLocked("p.zombie_count >= "+suspectAfter) + claimTailSQL

// claimLocked renders the first part of a claim for the pending rows that
// match which.
func claimLocked(which string) string {
	return `
WITH locked AS (` + dueRows(which, "$2") + `
),`
}

// dueRows selects and locks the row ids of up to limit due pending rows
// that match which, oldest due first, skipping rows other claims hold and
// rails that cannot be claimed now (claimableRails: not this relayer's,
// breaker open, paused): a claim's choice, also made by the hand-off's
// refill (handoff.go). Each claimable rail's due range is read from its
// start in the rail-first due index (migration 021), up to limit rows each,
// and the oldest limit of those are taken, so the due instructions of other
// rails, however many, cost nothing. A rail's rows beyond the oldest limit
// overall are locked too, until the statement's transaction ends: at most
// limit per claimable rail that has a backlog. With ordering on, only
// heads are due (see enqueue.go); each candidate is also checked to have no
// lower pending sequence.
func dueRows(which, limit string) string {
	return `
  SELECT c.row FROM unnest(` + claimableRails + `) AS r(rail_type)
  CROSS JOIN LATERAL (
    SELECT p.ctid AS row, p.next_attempt_at, p.created_at FROM {schema}.pending p
    WHERE p.rail_type = r.rail_type AND p.next_attempt_at <= now() AND ` + which + `
      AND (NOT ` + orderedSQL + ` OR NOT EXISTS (
        SELECT 1 FROM {schema}.pending q WHERE q.participant_id = p.participant_id AND q.sequence_id < p.sequence_id))
    ORDER BY p.next_attempt_at, p.created_at
    LIMIT ` + limit + ` FOR UPDATE SKIP LOCKED) c
  ORDER BY c.next_attempt_at, c.created_at
  LIMIT ` + limit
}

// SuspectsDue reports whether suspects (see ClaimParams.Suspects) of
// railTypes that a claim of them could take are due: the rails are those a
// suspect claim would ask for (breaker closed), and paused ones are left
// out as the claim leaves them out. Otherwise a suspect on a paused rail
// would send every relayer into isolation, draining all its dispatches,
// only to claim nothing, 4 times a second for the whole pause. Relayers ask
// every so often (4 times a second each); it reads the suspects' partial
// index only.
func (s *Store) SuspectsDue(ctx context.Context, db Querier, railTypes []string) (bool, error) {
	if len(railTypes) == 0 {
		return false, nil
	}
	var due bool
	if err := db.QueryRow(ctx, s.sql.suspectsDue, railTypes).Scan(&due); err != nil {
		return false, fmt.Errorf("suspects due: %w", err)
	}
	return due, nil
}

// suspectsDueSQL bounds zombie_count on both sides, which changes nothing
// in what it finds (zombie_count is an int) but keeps the planner on the
// suspects' partial index while pending has no statistics yet (a fresh
// schema, or a backlog loaded since the last ANALYZE): it then takes a
// one-sided bound to keep a third of the rows, expects EXISTS to stop
// within the first few, and chose a sequential scan of every pending row,
// 14 ms at 100,000 due rows, 4 times a second per relayer. A two-sided
// range is estimated at half a percent, and the partial index wins. $1 are
// the rail types; the claimable ones among them are the claim's
// (claimableRails).
var suspectsDueSQL = `SELECT EXISTS (SELECT 1 FROM {schema}.pending
  WHERE zombie_count >= ` + suspectAfter + ` AND zombie_count < 2147483647 AND next_attempt_at <= now()
    AND rail_type = ANY (` + claimableRailsOf("$1") + `))`

// suspectAfter is the zombie count from which an instruction is a suspect:
// its relayer died with it in flight twice. Once is what a kill -9 does to
// everything a relayer holds, and those heal at full speed; twice in a row
// is a poison instruction or what was in flight beside one, which
// dispatching alone tells apart. It matches the partial index of
// migration 009.
const suspectAfter = `2`

// claimTailSQL claims the rows of the relation locked (the row ids, ctid,
// of pending rows no one else may change meanwhile): it deletes them from
// pending by row id (a plan that cannot become a join with the whole
// pending table, however many rows the planner expects: a cached generic
// plan does not know the batch size and expects a tenth of the table),
// appends their DISPATCHING attempts and inserts their in-flight rows with
// the lease of their rail ($1 relayer id, $3 rail types, $4 leases in ms).
// The attempt id and number are made in the DELETE's RETURNING, so the two
// inserts and the result read that one relation and never join one CTE to
// another (the planner, which expects one row from each, would compare
// every row with every other).
var claimTailSQL = claimWritesSQL + `
SELECT c.outbox_id, c.attempt_id, c.attempt_no, c.instruction_id, c.participant_id, c.sequence_id, c.idempotency_key,
       c.rail_type, c.tenant_id, c.correlation_id, c.payload, c.claimed_at,
       c.claimed_at + l.lease_ms * interval '1 millisecond', c.created_at
FROM claimed c JOIN leases l USING (rail_type)
ORDER BY c.next_attempt_at, c.created_at`

// claimWritesSQL are the writes of claimTailSQL, ending in the relation
// claimed. The in-flight row is outcome unknown if an earlier attempt was
// (the pending row's mark) or if the pending row is a copy the reaper
// requeued: its abandoned claim's outcome is unknown from this claim on,
// since a late FAILED of that claim withdraws only a copy nobody claimed
// (migration 032).
var claimWritesSQL = `
leases AS (
  SELECT * FROM unnest($3::text[], $4::bigint[]) AS l(rail_type, lease_ms)
), claimed AS (
  DELETE FROM {schema}.pending p WHERE p.ctid = ANY (ARRAY(SELECT row FROM locked))
  RETURNING p.*, ` + claimAttemptNo + ` AS attempt_no, {schema}.uuidv7() AS attempt_id, now() AS claimed_at,
            clock_timestamp() AS archived_at
), stamped AS (
  SELECT c.*, ` + attemptHash("c.chain_head", dispatchingValues, "c.archived_at") + ` AS hash FROM claimed c
), dispatching AS (
  INSERT INTO {schema}.attempts (` + chainedArchiveColumns + `)
  SELECT ` + dispatchingValues + `, c.archived_at, c.chain_head, c.hash
  FROM stamped c
), leased AS (
  INSERT INTO {schema}.inflight (` + inflightColumns + `, chain_head, zombie_count, outcome_unknown)
  SELECT ` + from("c", identityColumns) + `,
         c.payload, c.created_at, c.attempt_id, c.attempt_no, $1, ` + orderedSQL + `,
         c.claimed_at, c.claimed_at + l.lease_ms * interval '1 millisecond', c.hash, c.zombie_count,
         c.outcome_unknown OR c.zombie_attempt_id IS NOT NULL
  FROM stamped c JOIN leases l USING (rail_type)
)`

// dispatchingValues are the archive values of a claim's DISPATCHING row,
// from the claimed pending row c ($1 is the relayer id).
var dispatchingValues = `c.attempt_id, ` + from("c", identityColumns) + `, c.payload, c.attempt_no, 'DISPATCHING', $1::text,
         NULL::uuid, c.claimed_at, NULL::timestamptz, NULL::timestamptz, NULL::text, NULL::text, NULL::text, NULL::text,
         NULL::int, false`

// asOutcomesSQL ends a claim (claimWritesSQL) with its relation claimed
// folded into the 13 arrays recordSQL takes, as a relayer whose every
// dispatch succeeded at once would record them (columns a1 to a13), and
// the participants the participant lock and the hand-off take (p), and
// leaves them in the session's settings for the next write of the same
// session to read (CarriedArgument): the benchmark's ceiling feeds them
// to the outcome statement through pgbench, with nothing in between
// (handoffAsOutcomesSQL).
var asOutcomesSQL = `
, outcomes AS (
SELECT coalesce(array_agg(gen_random_uuid()), '{}') AS a1, coalesce(array_agg(attempt_id), '{}') AS a2,
       coalesce(array_agg(outbox_id), '{}') AS a3, coalesce(array_agg('DISPATCHED'::text), '{}') AS a4,
       coalesce(array_agg(claimed_at), '{}') AS a5, coalesce(array_agg('ref-' || outbox_id), '{}') AS a6,
       coalesce(array_agg('00'::text), '{}') AS a7, coalesce(array_agg(''::text), '{}') AS a8,
       coalesce(array_agg(''::text), '{}') AS a9, coalesce(array_agg(0), '{}') AS a10,
       coalesce(array_agg(0::bigint), '{}') AS a11, coalesce(array_agg(true), '{}') AS a12,
       coalesce(array_agg(false), '{}') AS a13, coalesce(array_agg(participant_id), '{}') AS p
FROM claimed
)
SELECT ` + carrySettings() + ` FROM outcomes`

// carriedPrefix names the session settings in which handoffAsOutcomesSQL
// leaves its claims for the next write (a custom setting's name needs a
// dot).
const carriedPrefix = "outbox_ceiling."

// carriedNames are the arguments handoffAsOutcomesSQL carries: recordSQL's
// 13 arrays and the participants.
var carriedNames = []string{"a1", "a2", "a3", "a4", "a5", "a6", "a7", "a8", "a9", "a10", "a11", "a12", "a13", "p"}

// carrySettings sets each carried argument from the relation outcomes,
// for the rest of the session (a write that fails takes its settings back
// with it).
func carrySettings() string {
	sets := make([]string, len(carriedNames))
	for i, n := range carriedNames {
		sets[i] = "set_config('" + carriedPrefix + n + "', " + n + "::text, false)"
	}
	return strings.Join(sets, ", ")
}

// CarriedArgument is an expression for the hot path's argument name ("a1"
// to "a13": Record's arrays; "p": the participants) as the session's last
// HotPath.HandoffAsOutcomes left it, and '{}' before the first. The
// benchmark's ceiling writes with these in place of parameters: pgbench
// cannot read a result inside a pipeline, and a relayer's write is one
// pipeline.
func CarriedArgument(name string) string {
	return "coalesce(current_setting('" + carriedPrefix + name + "', true), '{}')"
}
