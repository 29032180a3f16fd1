package store

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// State is the state an archive row records.
type State string

// The states of an archive row.
const (
	Dispatching   State = "DISPATCHING"    // claimed by a relayer, about to be sent
	Dispatched    State = "DISPATCHED"     // the rail accepted it (terminal)
	Retryable     State = "RETRYABLE"      // this attempt failed; pending again
	Failed        State = "FAILED"         // terminal failure; a dead letter
	ZombieRequeue State = "ZOMBIE_REQUEUE" // the relayer's lease expired; the reaper requeued it
	Replayed      State = "REPLAYED"       // an operator sent a dead letter back to pending
	Acknowledged  State = "ACKNOWLEDGED"   // an operator accepted a dead letter's failure
	Cancelled     State = "CANCELLED"      // an operator cancelled it while pending: never sent (terminal)
)

// Outcome is how one claimed attempt ended, as the relayer records it. The
// identity fields repeat what the claim returned; the outcome statement
// archives an instruction as its in-flight row (or, for a late outcome, its
// claim's archive row) says it is. Record uses only ParticipantID of
// them (the participant whose lock a terminal or retryable outcome takes)
// and, for a late terminal outcome, AttemptNo too (withdrawing the
// reaper's requeued copy).
type Outcome struct {
	Identity
	AttemptID      uuid.UUID // the new outcome row's id
	ClaimAttemptID uuid.UUID // the DISPATCHING attempt this outcome closes
	AttemptNo      int
	RelayerID      string
	ClaimedAt      time.Time

	// State is Dispatched, Retryable or Failed.
	State         State
	RailReference string
	RailCode      string
	ErrorCode     string
	ErrorMessage  string
	LatencyMS     int
	// RetryDelay is how long a Retryable instruction waits in pending.
	RetryDelay time.Duration
	// CountAttempt is false when the attempt does not use up the retry
	// budget (see budget.go).
	CountAttempt bool
	// OutcomeUnknown says the rail may have acted on this attempt without
	// our knowing (a timeout or a broken exchange after the request was
	// sent, an answer we cannot read). A Failed outcome with it makes a
	// dead letter marked outcome unknown.
	OutcomeUnknown bool
}

// Recorded says what happened to one outcome.
type Recorded struct {
	OutboxID uuid.UUID
	// ClaimAttemptID is the DISPATCHING attempt the outcome closed.
	ClaimAttemptID uuid.UUID
	// Late is true when the in-flight row no longer belonged to this
	// attempt (its lease was reaped): the outcome was archived, marked
	// late, and did not touch the queue.
	Late bool
	// Withdrew is true when a late DISPATCHED/FAILED outcome removed the
	// requeued copy that nobody had claimed yet.
	Withdrew bool
	// Absorbed is true (with Late) when the claim had an outcome already,
	// recorded on time or late under another outcome id: this one was not
	// archived and changed nothing (migration 050).
	Absorbed bool
	// NextAttemptAt is when a Retryable instruction's backoff ends (with
	// ordering on, it waits longer behind a lower sequence of its
	// participant that an operator replayed meanwhile: see requeuedSQL).
	NextAttemptAt *time.Time
}

// Record applies a batch of outcomes in one transaction, sent in one round
// trip (two for a batch with a late or repeated outcome, below). The
// outcome statement appends each outcome attempt, removes the
// in-flight row only where it still belongs to that attempt (fencing), puts
// retries back into pending with the same outbox and sequence id (attempt
// count: see budget.go, next_attempt_at = now() + RetryDelay; with
// ordering on, behind a lower sequence an operator replayed meanwhile:
// see requeuedSQL), moves terminal failures to the dead letters and, with
// ordering on, counts the terminal ones out of their participants' queued
// (under the row locks of the participants of terminal and retryable
// outcomes, taken first in participant order). The hand-off statement
// that follows claims up to h.Limit instructions, the next instruction of
// the participants it freed first, then (h.Refill) any due one, and returns those
// claims for the caller to dispatch (see handoff.go). If the database
// refuses one of those claims (ErrOrderingConflict, which only a broken
// ordering invariant can cause), nothing is written; the same outcomes can
// be recorded again with h.Limit 0.
//
// The outcome statement a write sends first takes only outcomes whose
// in-flight row is still theirs, the common case; if one is not, it writes
// nothing, and Record writes the batch again with the statement that takes
// the others too (outcomes_not_fenced, migration 025), a round trip more
// after a reaped lease or a lost commit reply. In the caller's transaction
// (db a pgx.Tx), which that first failure would abort, it sends the second
// statement at once.
//
// An outcome whose in-flight row is gone or owned by a newer attempt is
// late: it is archived with late = true, and if it is DISPATCHED or FAILED
// and the reaper's requeued copy is still pending, that copy is withdrawn
// (a FAILED one becomes a dead letter) by [Store.withdraw], in a second
// transaction. If that fails the outcomes are still archived and the copy
// is simply dispatched again under the same idempotency key; the error is
// returned with the results.
//
// Record is idempotent per outcome (keyed by Outcome.AttemptID): a caller
// that lost the reply of a commit may send the same outcomes again, and an
// outcome already archived is reported as it was recorded the first time
// instead of being archived twice. A claim has one outcome: a late outcome
// of a claim that has one already under another outcome id (recorded on
// time, or late) is absorbed (Recorded.Absorbed, Late too): not archived,
// nothing withdrawn (migration 050).
func (s *Store) Record(ctx context.Context, db Batcher, outcomes []Outcome, h HandoffParams) ([]Recorded, []Claimed, error) {
	if len(outcomes) == 0 {
		return nil, nil, nil
	}
	args, terminal, locked, err := recordArgs(outcomes)
	if err != nil {
		return nil, nil, err
	}
	record := s.sql.recordDispatched
	if slices.ContainsFunc(outcomes, func(o Outcome) bool { return o.State != Dispatched }) {
		record = s.sql.record
	}
	late := inCallersTx(db) // a statement that fails would abort the caller's transaction
	if late {
		record = s.sql.recordLate
	}
	recorded, claimed, err := s.write(ctx, db, record, late, args, terminal, locked, h)
	if isNotFenced(err) {
		// Nothing was written: some outcome is late or was recorded
		// before. The whole batch again, with the statement for those.
		recorded, claimed, err = s.write(ctx, db, s.sql.recordLate, true, args, terminal, locked, h)
	}
	if err != nil {
		if isOrderingConflict(err) {
			// Only the hand-off claims: nothing was written, and the same
			// outcomes without it can be.
			return nil, nil, fmt.Errorf("record: hand-off: %w: %w", ErrOrderingConflict, err)
		}
		return nil, nil, fmt.Errorf("record: %w", err)
	}

	if !slices.ContainsFunc(recorded, func(r Recorded) bool { return r.Late }) {
		return recorded, claimed, nil // the common case: nothing to withdraw
	}
	byClaim := make(map[uuid.UUID]Outcome, len(outcomes))
	for _, o := range outcomes {
		byClaim[o.ClaimAttemptID] = o
	}
	var lateTerminal []Outcome
	for _, r := range recorded {
		if o := byClaim[r.ClaimAttemptID]; r.Late && !r.Absorbed && (o.State == Dispatched || o.State == Failed) {
			lateTerminal = append(lateTerminal, o)
		}
	}
	if len(lateTerminal) == 0 {
		return recorded, claimed, nil
	}
	withdrew, err := s.withdraw(ctx, db, lateTerminal)
	if err != nil {
		// The outcome rows are archived; the copy stays pending and is
		// dispatched again under the same idempotency key.
		return recorded, claimed, fmt.Errorf("record: withdraw requeued copies: %w", err)
	}
	for i := range recorded {
		recorded[i].Withdrew = withdrew[recorded[i].ClaimAttemptID]
	}
	return recorded, claimed, nil
}

// write sends one outcome write: the plan settings, the locks of the
// participants locked, the outcome statement record with args, and the
// hand-off of the participants of terminal outcomes (terminal). late
// says record is recordLateSQL, the one statement that takes outcomes
// whose in-flight row is gone: only after it can a freed participant be
// busy again, and only then does the hand-off look (handoffFencedSQL).
func (s *Store) write(ctx context.Context, db Batcher, record string, late bool, args []any, terminal, locked []string, h HandoffParams) ([]Recorded, []Claimed, error) {
	railTypes, leaseMS := leaseArrays(h.Leases)
	b := &pgx.Batch{}
	generic := queueGenericPlans(b, db, genericPlansSQL)
	lock := s.sql.lockParticipants
	if late {
		// Ordering on or off: late_outcome_prior (migration 050) locks
		// each late outcome's participant; taken here first, in
		// participant order, two late writes cannot deadlock.
		lock = s.sql.lockParticipantsLate
	}
	b.Queue(lock, locked)
	b.Queue(record, args...)
	var handoff string
	switch {
	case late && h.Refill:
		handoff = s.sql.handoff
	case late:
		handoff = s.sql.handoffSuccessors
	case h.Refill:
		handoff = s.sql.handoffFenced
	default:
		handoff = s.sql.handoffFencedSuccessors
	}
	b.Queue(handoff, h.RelayerID, max(h.Limit, 0), railTypes, leaseMS, terminal, args[2], h.Refill)
	br := db.SendBatch(ctx, b)
	recorded, claimed, err := readRecordBatch(br, generic)
	if cerr := br.Close(); err == nil && cerr != nil {
		err = cerr
	}
	return recorded, claimed, err
}

// notFencedCode is the SQLSTATE outcomes_not_fenced raises (migration 025).
const notFencedCode = "OBLT1"

// isNotFenced reports whether err is the outcome statement's refusal of
// outcomes that no longer find their in-flight row (outcomes_not_fenced).
func isNotFenced(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == notFencedCode
}

// recordArgs are recordSQL's arguments for outcomes, the participants of
// the terminal ones (whose next instruction the hand-off looks at), and
// those of the terminal and retryable ones (whose locks the write takes:
// a retry may change who is its participant's head, requeuedSQL). Only
// what the rail answered is sent, with the ids
// that find the in-flight row (and the claim's time, which bounds the
// archive's partitions for the rare outcome whose row is gone): the
// instruction's identity, attempt number and relayer come from that row.
func recordArgs(outcomes []Outcome) (args []any, terminal, locked []string, err error) {
	n := len(outcomes)
	var (
		states, refs, codes, errCodes, messages = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		latencies                               = make([]int32, n)
		delays                                  = make([]int64, n)
		claimedAt                               = make([]time.Time, n)
		counts, unknown                         = make([]bool, n), make([]bool, n)
	)
	for i, o := range outcomes {
		switch o.State {
		case Dispatched, Failed:
			terminal = append(terminal, o.ParticipantID)
		case Retryable:
		default:
			return nil, nil, nil, fmt.Errorf("record: outcome %d has state %q", i, o.State)
		}
		states[i], refs[i], codes[i], errCodes[i], messages[i] = string(o.State), o.RailReference, o.RailCode, o.ErrorCode, o.ErrorMessage
		// The archive's latency_ms is an int: a call longer than 24.8 days
		// (a transport that ignored its deadline) is written as the most
		// it holds, not wrapped to a negative.
		latencies[i], delays[i] = int32(min(max(o.LatencyMS, 0), math.MaxInt32)), o.RetryDelay.Milliseconds()
		claimedAt[i], counts[i], unknown[i] = o.ClaimedAt, o.CountAttempt, o.OutcomeUnknown
	}
	ids := wireUUIDs(outcomes, func(o *Outcome) uuid.UUID { return o.AttemptID })
	claimIDs := wireUUIDs(outcomes, func(o *Outcome) uuid.UUID { return o.ClaimAttemptID })
	outboxIDs := wireUUIDs(outcomes, func(o *Outcome) uuid.UUID { return o.OutboxID })
	return []any{ids, claimIDs, outboxIDs, states, claimedAt, refs, codes, errCodes, messages, latencies, delays,
		counts, unknown}, terminal, lockedParticipants(outcomes, terminal), nil
}

// lockedParticipants are the participants of outcomes, whose locks a
// write takes: terminal itself when every outcome is terminal, as in a
// drain, so the common write builds no second list.
func lockedParticipants(outcomes []Outcome, terminal []string) []string {
	if len(terminal) == len(outcomes) {
		return terminal
	}
	locked := make([]string, len(outcomes))
	for i, o := range outcomes {
		locked[i] = o.ParticipantID
	}
	return locked
}

// RecordArgs are the outcome statement's arguments, for plan tests.
func RecordArgs(outcomes []Outcome) []any {
	args, _, _, _ := recordArgs(outcomes)
	return args
}

// readRecordBatch reads the results of Record's three statements.
func readRecordBatch(br pgx.BatchResults, generic bool) ([]Recorded, []Claimed, error) {
	if err := skipGenericPlans(br, generic); err != nil {
		return nil, nil, err
	}
	if _, err := br.Exec(); err != nil {
		return nil, nil, fmt.Errorf("lock participants: %w", err)
	}
	rows, err := br.Query()
	if err != nil {
		return nil, nil, err
	}
	recorded, err := pgx.CollectRows(rows, func(cr pgx.CollectableRow) (Recorded, error) {
		var r Recorded
		if len(cr.FieldDescriptions()) > 4 { // recordLateSQL's
			return r, cr.Scan(scanUUID(&r.OutboxID), scanUUID(&r.ClaimAttemptID), &r.Late, &r.NextAttemptAt, &r.Absorbed)
		}
		err := cr.Scan(scanUUID(&r.OutboxID), scanUUID(&r.ClaimAttemptID), &r.Late, &r.NextAttemptAt)
		return r, err
	})
	if err != nil {
		return nil, nil, err
	}
	rows, err = br.Query()
	if err != nil {
		return nil, nil, fmt.Errorf("hand off: %w", err)
	}
	claimed, err := collectClaimed(rows)
	if err != nil {
		return nil, nil, fmt.Errorf("hand off: %w", err)
	}
	return recorded, claimed, nil
}

// outcomeValues are the archive values of an on-time outcome, from the
// fenced (deleted in-flight) row joined with its outcome.
const outcomeValues = `outcome_id, ` + identityColumns + `, NULL::jsonb, attempt_no, state, relayer_id, attempt_id,
         claimed_at, now(), due, nullif(rail_reference, ''), nullif(rail_code, ''),
         nullif(error_code, ''), nullif(error_message, ''), latency_ms, false`

// lateValues are the archive values of a late outcome, from its input row
// (the in-flight row is gone) and its claim's archive row
// (archived_claim).
const lateValues = `attempt_id, outbox_id, instruction_id, participant_id, sequence_id, idempotency_key,
         rail_type, tenant_id, correlation_id,
         NULL::jsonb, attempt_no, state, relayer_id, claim_attempt_id,
         claimed_at, now(), NULL::timestamptz, nullif(rail_reference, ''), nullif(rail_code, ''),
         nullif(error_code, ''), nullif(error_message, ''), latency_ms, true`

// RecordSQL is the outcome statement that handles late and repeated
// outcomes (with retries and failures), the one that reads the archive,
// for plan tests.
func (s *Store) RecordSQL() string { return s.sql.recordLate }

// recordSQL: fenced are the outcomes whose in-flight row still belongs to
// their claim (the common case); its DELETE returns what the other writes
// need, so they read it alone, without joining outcomes to rows. If any
// outcome is not fenced, the statement fails (outcomes_not_fenced,
// migration 025) and Record writes the batch again with recordLateSQL:
// PostgreSQL sets up every node of a plan at each execution, run or not,
// and the part for late outcomes was about a quarter of the statement's
// plan, paid by every write for outcomes that come only after a reaped
// lease or a lost commit reply (over 10 busy participants, writes without
// it drained 50,000 instructions 8% faster: docs/performance.md).
var recordSQL = recordWith(requeuedSQL+deadSQL, false)

// recordDispatchedSQL is recordSQL for outcomes that are all DISPATCHED
// (Record picks it then): without the retries' insert into pending and
// the failures' into the dead letters. PostgreSQL opens the tables and
// indexes those inserts would write, too, so a write of ten outcomes paid
// for both every time; a drain's writes, and most writes at a steady rate,
// have neither. Same parameters.
var recordDispatchedSQL = recordWith("", false)

// recordLateSQL is recordSQL that also takes outcomes that are not fenced.
// Those (unfenced) are late, or repeats of outcomes already archived (a
// resend after a lost commit reply): only they read the archive, by key
// and in recent partitions (late_outcome_prior, migration 050, which asks
// archived_attempt, migration 012: functions, so that the plan of this
// statement holds none of the archive's partitions), and prior_late says
// how the first one was recorded; absorbed, that the claim has another
// outcome already (one claim, one outcome: its participant's row locked,
// lockParticipantsLateSQL, then looked for). Only fresh ones (prior_late
// NULL, not absorbed) are archived, with what they repeat of their claim
// read from its archive row (archived_claim, migration 024). Same
// parameters; a fifth column, absorbed.
var recordLateSQL = recordWith(requeuedSQL+deadSQL, true)

// requeuedSQL and deadSQL are recordSQL's retries, back to pending with
// the same identity after their backoff, and terminal failures, into the
// dead letters. Both carry outcome_unknown: the in-flight row's (an
// earlier attempt's) or this attempt's (attempt_unknown), so that a dead
// letter is outcome unknown if any attempt of its instruction was, not
// only its last (migration 032).
//
// With ordering on, a retry is its participant's head again unless a
// lower sequence of the participant is pending: a dead letter an operator
// replayed while this one was in flight, which waits (replay_dead_letter).
// No terminal outcome will hand that one on, so the retry waits instead,
// keeping its retry time (retry_at, waiting.go), and the participant's
// lowest pending row is made due (behindSQL, ahead).
// The participant's lock (Record takes it for retries too) keeps a replay
// or a cancel from changing those rows meanwhile.
var (
	requeuedSQL = behindSQL("s.state = 'RETRYABLE'") + `
), requeued AS (
  INSERT INTO {schema}.pending (` + pendingColumns + `, chain_head, zombie_count, outcome_unknown, retry_at)
  SELECT ` + identityColumns + `, payload, ` + countAfter("attempt_no", "count_attempt") + `,
         CASE WHEN outbox_id IN (SELECT outbox_id FROM behind) THEN 'infinity' ELSE due END, created_at, NULL, hash,
         zombie_count, outcome_unknown OR attempt_unknown,
         ` + retryAtBehindSQL("outbox_id IN (SELECT outbox_id FROM behind)", "due") + `
  FROM stamped WHERE state = 'RETRYABLE'
), ahead AS (
  UPDATE {schema}.pending p SET ` + dueAgainSQL + `
  WHERE p.ctid = ANY (ARRAY(SELECT row FROM behind WHERE waits))`
	deadSQL = `
), dead AS (
  INSERT INTO {schema}.dead_letters (` + deadLetterColumns + `, chain_head, outcome_unknown)
  SELECT ` + identityColumns + `, payload, attempt_no, error_code, nullif(error_message, ''), outcome_id, created_at, hash,
         outcome_unknown OR attempt_unknown
  FROM stamped WHERE state = 'FAILED'`
)

// recordWith renders recordSQL with inserts (requeuedSQL, deadSQL or
// neither) and, if late, recordLateSQL.
func recordWith(inserts string, late bool) string {
	if !late {
		return recordFenced + inserts + recordFinished + `
)
SELECT outbox_id, attempt_id, false, due FROM fenced
UNION ALL
SELECT NULL, NULL, {schema}.outcomes_not_fenced(c.n), NULL
FROM (SELECT cardinality($1::uuid[]) - count(*) AS n FROM fenced) c WHERE c.n > 0`
	}
	return recordFenced + recordUnfenced + inserts + recordFinished + `
  UNION ALL
  SELECT ` + lateValues + `, archived_at, claim_hash, hash
  FROM late
)
SELECT outbox_id, attempt_id, false, due, false FROM fenced
UNION ALL
SELECT outbox_id, claim_attempt_id, coalesce(prior_late, true), NULL, absorbed FROM unfenced`
}

// recordFenced, recordUnfenced and recordFinished are the parts of
// recordWith's statements: the fenced outcomes, the others (late or
// repeated), and the writes after the inserts, up to the archive's
// insert of the fenced ones.
var (
	recordFenced = `
WITH input AS (
  SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::uuid[], $4::text[], $5::timestamptz[], $6::text[], $7::text[],
                       $8::text[], $9::text[], $10::int[], $11::bigint[], $12::bool[], $13::bool[])
    AS o(attempt_id, claim_attempt_id, outbox_id, state, claimed_at, rail_reference, rail_code, error_code,
         error_message, latency_ms, retry_delay_ms, count_attempt, outcome_unknown)
), targets AS (
  SELECT o.*, t.row FROM input o
  CROSS JOIN LATERAL (SELECT f.ctid AS row FROM {schema}.inflight f
                      WHERE f.outbox_id = o.outbox_id AND f.attempt_id = o.claim_attempt_id LIMIT 1) t
), fenced AS (
  DELETE FROM {schema}.inflight f USING targets o
  WHERE f.ctid = ANY (ARRAY(SELECT row FROM targets)) AND f.ctid = o.row
  RETURNING f.*, o.attempt_id AS outcome_id, o.state, o.rail_reference, o.rail_code, o.error_code, o.error_message,
            o.latency_ms, o.count_attempt, o.outcome_unknown AS attempt_unknown,
            CASE WHEN o.state = 'RETRYABLE' THEN now() + o.retry_delay_ms * interval '1 millisecond' END AS due,
            clock_timestamp() AS archived_at
), stamped AS (
  SELECT f.*, ` + attemptHash("f.chain_head", outcomeValues, "f.archived_at") + ` AS hash FROM fenced f`
	recordUnfenced = `
), unfenced AS (
  SELECT o.*, p.late AS prior_late, p.absorbed
  FROM input o
  CROSS JOIN LATERAL {schema}.late_outcome_prior(o.attempt_id, o.claim_attempt_id, o.outbox_id,
                                                 o.claimed_at - interval '1 day') p
  WHERE o.claim_attempt_id NOT IN (SELECT attempt_id FROM fenced)
), late AS (
  -- A late outcome follows its claim's DISPATCHING row in the chain (the
  -- in-flight row that carried the head is gone) and repeats its identity:
  -- an archive read by primary key, on a path taken only after a reaped
  -- lease.
  SELECT u.*, ` + attemptHash("u.claim_hash", lateValues, "u.archived_at") + ` AS hash
  FROM (SELECT o.attempt_id, o.claim_attempt_id, o.outbox_id, o.state, o.rail_reference, o.rail_code, o.error_code,
               o.error_message, o.latency_ms, c.instruction_id, c.participant_id, c.sequence_id, c.idempotency_key,
               c.rail_type, c.tenant_id, c.correlation_id, c.attempt_no, c.relayer_id, c.claimed_at,
               c.hash AS claim_hash, clock_timestamp() AS archived_at
        FROM unfenced o
        CROSS JOIN LATERAL {schema}.archived_claim(o.claim_attempt_id, o.claimed_at - interval '1 day') c
        WHERE o.prior_late IS NULL AND NOT o.absorbed) u`
	recordFinished = `
), finished AS (
  UPDATE {schema}.sequences s SET queued = s.queued - t.n
  FROM (SELECT participant_id, count(*) AS n FROM fenced
        WHERE state IN ('DISPATCHED', 'FAILED') GROUP BY participant_id) t
  WHERE s.participant_id = t.participant_id AND ` + orderedSQL + `
), archived AS (
  INSERT INTO {schema}.attempts (` + chainedArchiveColumns + `)
  SELECT ` + outcomeValues + `, archived_at, chain_head, hash
  FROM stamped`
)
