package store

import (
	"context"
	"fmt"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"
)

// Queued is an instruction waiting in pending or held in flight, as the
// operations console lists it.
type Queued struct {
	OutboxID      uuid.UUID `json:"outbox_id"`
	InstructionID string    `json:"instruction_id"`
	ParticipantID string    `json:"participant_id"`
	SequenceID    int64     `json:"sequence_id"`
	RailType      string    `json:"rail"`
	TenantID      string    `json:"tenant_id,omitempty"`
	EnqueuedAt    time.Time `json:"enqueued_at"`
	// State is "due" (waiting for a relayer), "retry_wait" (waiting for
	// its next attempt), "queued" (behind its participant's head, ordering
	// on), "in_flight", or "stuck" (in flight past its lease: its relayer
	// died; the reaper will requeue it).
	State        string     `json:"state"`
	AttemptCount int        `json:"attempt_count"`        // pending: attempts so far; in flight: this attempt's number
	NextAttempt  *time.Time `json:"next_attempt_at"`      // pending only; nil while queued behind the head
	RelayerID    string     `json:"relayer_id,omitempty"` // in flight only
	ClaimedAt    *time.Time `json:"claimed_at,omitempty"`
	LeaseUntil   *time.Time `json:"lease_until,omitempty"`
	ZombieCount  int        `json:"zombie_requeues"` // times the reaper requeued it (a suspect from 2 on)
	// OutcomeUnknown: an earlier attempt may have reached the rail (it
	// timed out, its relayer died holding it, ...): cancelling it does not
	// undo a payment the rail may have made.
	OutcomeUnknown bool `json:"outcome_unknown"`
}

// QueuedFilter selects queued instructions. Pages are in outbox id order.
// Outbox ids are UUIDv7, whose leading bits are the enqueue's time (the
// producer's clock, to the millisecond), so that is enqueue order, which
// new enqueues only extend (a page boundary does not move under concurrent
// inserts, producers' clocks allowing), and the order of the tables'
// primary keys: a page reads its rows, not the queue.
type QueuedFilter struct {
	InFlight    bool   // in flight instead of pending
	Participant string // "" for any
	Rail        string // "" for any
	After       Cursor // the last row of the previous page (zero: from the start)
	Limit       int
}

// Cursor is a keyset position: the (time, outbox id) of a page's last row.
// Queue listings (QueuedFilter) page by the outbox id alone.
type Cursor struct {
	At time.Time
	ID uuid.UUID
}

// The listings' columns, as Queued reads them.
const (
	queuedPendingColumns = `
SELECT outbox_id, instruction_id, participant_id, sequence_id, rail_type, coalesce(tenant_id, ''), created_at,
       CASE WHEN next_attempt_at = 'infinity' THEN 'queued' WHEN next_attempt_at <= now() THEN 'due' ELSE 'retry_wait' END,
       attempt_count, CASE WHEN next_attempt_at = 'infinity' THEN NULL ELSE next_attempt_at END,
       '', NULL::timestamptz, NULL::timestamptz, zombie_count, outcome_unknown OR zombie_attempt_id IS NOT NULL`
	queuedInFlightColumns = `
SELECT outbox_id, instruction_id, participant_id, sequence_id, rail_type, coalesce(tenant_id, ''), created_at,
       CASE WHEN lease_until < now() THEN 'stuck' ELSE 'in_flight' END,
       attempt_no, NULL::timestamptz, relayer_id, claimed_at, lease_until, zombie_count, outcome_unknown`
)

// queuedPageSQL lists one page of table: the rows after outbox id $2, of
// a rail ($1; empty for any), $3 at most, in outbox id order (the primary
// key's: TestListQueuedReadsItsPage); with byParticipant, only participant
// $4's. A participant's rows are read through its index in a subquery the
// rest cannot reach into (OFFSET 0): as one query, on a drained queue's
// statistics (0 rows: PostgreSQL then estimates one row whatever the table
// holds) the planner read the due index whole instead, 200,000 entries for
// a participant's 400 rows (TestListQueuedByParticipantReadsItsRows).
func queuedPageSQL(columns, table string, byParticipant bool) string {
	from := "{schema}." + table
	if byParticipant {
		from = "(SELECT * FROM {schema}." + table + " WHERE participant_id = $4 OFFSET 0) q"
	}
	return columns + `
FROM ` + from + `
WHERE ($1 = '' OR rail_type = $1) AND outbox_id > $2
ORDER BY outbox_id LIMIT $3`
}

// listQueuedOfRailSQL is queuedPageSQL for pending, of rail $1 (never
// empty), any participant: a page of the index by rail and outbox id
// (migration 049). With the rail an optional filter of the primary key's
// walk, every plan sifted out the other rails' rows until it had a page:
// a rail of 10 pending instructions among 1,000,000 read all of them, as
// did a misspelt rail (TestListQueuedByRailReadsItsPage). The rail is
// asked as a range of one value, not "rail_type = $1": with an equality
// the planner drops the rail from the order, and a generic plan, which
// estimates an average rail's share, found the primary key's walk in
// outbox id order as cheap and took it. A range of one value leaves the
// (rail, outbox id) order to that index alone. A participant's
// (listQueuedOf) and in-flight pages read few rows whatever the filter.
const listQueuedOfRailSQL = queuedPendingColumns + `
FROM {schema}.pending
WHERE (rail_type, outbox_id) > ($1, $2) AND rail_type <= $1
ORDER BY rail_type, outbox_id LIMIT $3`

// ListQueued returns one page of pending or in-flight instructions.
func (s *Store) ListQueued(ctx context.Context, db Querier, f QueuedFilter) ([]Queued, error) {
	args := []any{f.Rail, f.After.ID, f.Limit}
	var q string
	switch {
	case f.InFlight && f.Participant != "":
		q, args = s.sql.listInFlightOf, append(args, f.Participant)
	case f.InFlight:
		q = s.sql.listInFlight
	case f.Participant != "":
		q, args = s.sql.listQueuedOf, append(args, f.Participant)
	case f.Rail != "":
		q = s.sql.listQueuedOfRail
	default:
		q = s.sql.listQueued
	}
	rows, err := db.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list queued: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[Queued])
}

// ParticipantView says where a participant stands and why it is not
// moving, if it is not.
type ParticipantView struct {
	ParticipantID string `json:"participant_id"`
	// Allocated is the number of sequence ids handed out, Queued those
	// pending or in flight (with ordering on).
	Allocated int64 `json:"allocated"`
	Queued    int64 `json:"queued"`
	// Head is the instruction the participant waits on: the one in flight,
	// else its lowest pending sequence; nil when clear.
	Head *Queued `json:"head"`
	// State is Head's state ("in_flight", "stuck", "retry_wait", "due",
	// "queued" for a stranded head) or "clear".
	State string `json:"state"`
	// Reason says it in words, with the times and the relayer.
	Reason string `json:"reason"`
	// LastError is the error code of the head's last failed attempt.
	LastError   string `json:"last_error,omitempty"`
	DeadLetters int64  `json:"dead_letters"` // unacknowledged
}

const participantSQL = `
SELECT coalesce((SELECT next_sequence_id - 1 FROM {schema}.sequences WHERE participant_id = $1), 0),
       coalesce((SELECT queued FROM {schema}.sequences WHERE participant_id = $1), 0),
       (SELECT count(*) FROM {schema}.dead_letters WHERE participant_id = $1 AND acknowledged_at IS NULL)`

const lastErrorSQL = `
SELECT error_code FROM {schema}.archive
WHERE outbox_id = $1 AND error_code IS NOT NULL ORDER BY created_at DESC, attempt_id DESC LIMIT 1`

// Participant reads a participant's view in one snapshot.
func (s *Store) Participant(ctx context.Context, db TxBeginner, participant string) (ParticipantView, error) {
	v := ParticipantView{ParticipantID: participant, State: "clear"}
	err := pgx.BeginTxFunc(ctx, db, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, s.sql.participant, participant).Scan(&v.Allocated, &v.Queued, &v.DeadLetters); err != nil {
			return err
		}
		inflight, err := s.ListQueued(ctx, tx, QueuedFilter{InFlight: true, Participant: participant, Limit: 1})
		if err != nil {
			return err
		}
		if len(inflight) == 0 {
			// Its head: the lowest sequence pending.
			rows, err := tx.Query(ctx, s.sql.participantHead, participant)
			if err != nil {
				return err
			}
			if inflight, err = pgx.CollectRows(rows, pgx.RowToStructByPos[Queued]); err != nil {
				return err
			}
		}
		if len(inflight) == 0 {
			v.Reason = "nothing pending or in flight"
			return nil
		}
		v.Head = &inflight[0]
		v.State = v.Head.State
		if err := tx.QueryRow(ctx, s.sql.lastError, v.Head.OutboxID).Scan(&v.LastError); err != nil && err != pgx.ErrNoRows {
			return err
		}
		v.Reason = reason(v.Head, v.LastError)
		return nil
	})
	if err != nil {
		return ParticipantView{}, fmt.Errorf("participant %s: %w", participant, err)
	}
	return v, nil
}

const participantHeadSQL = queuedPendingColumns + `
FROM {schema}.pending WHERE participant_id = $1 ORDER BY sequence_id LIMIT 1`

// reason says why a participant waits on its head.
func reason(h *Queued, lastError string) string {
	// As the console shows times: to the millisecond (a short lease's claim
	// and end are apart), the zone named.
	ts := func(t *time.Time) string { return t.UTC().Format("2006-01-02 15:04:05.000 UTC") }
	after := ""
	if lastError != "" {
		after = fmt.Sprintf(" (last error %s)", lastError)
	}
	switch h.State {
	case "in_flight":
		return fmt.Sprintf("sequence %d is in flight on relayer %s since %s, lease until %s", h.SequenceID, h.RelayerID, ts(h.ClaimedAt), ts(h.LeaseUntil))
	case "stuck":
		return fmt.Sprintf("sequence %d was claimed by relayer %s at %s and its lease ran out at %s: the relayer is presumed dead, the reaper will requeue it",
			h.SequenceID, h.RelayerID, ts(h.ClaimedAt), ts(h.LeaseUntil))
	case "retry_wait":
		attempts := "attempts"
		if h.AttemptCount == 1 {
			attempts = "attempt"
		}
		return fmt.Sprintf("sequence %d waits for its next attempt until %s after %d %s%s", h.SequenceID, ts(h.NextAttempt), h.AttemptCount, attempts, after)
	case "due":
		return fmt.Sprintf("sequence %d has been due since %s, waiting for a relayer to claim it%s", h.SequenceID, ts(h.NextAttempt), after)
	default:
		return fmt.Sprintf("sequence %d is the lowest pending but is not due and nothing is in flight: the participant is stranded (audit verify reports it)", h.SequenceID)
	}
}

// RailActivity is a rail's recent outcomes, from the archive.
type RailActivity struct {
	RailType   string           `json:"rail"`
	Dispatched int64            `json:"dispatched"`
	Retryable  int64            `json:"retryable"`
	Failed     int64            `json:"failed"`
	ErrorCodes map[string]int64 `json:"error_codes"` // retryable and failed, by code
}

const railActivitySQL = `
SELECT rail_type, coalesce(state, ''), coalesce(error_code, ''), count(*)
FROM {schema}.attempts
WHERE created_at > now() - $1::interval AND state IN ('DISPATCHED', 'RETRYABLE', 'FAILED')
GROUP BY 1, 2, 3`

// RailActivity counts each rail's outcomes over the last `window` (a read
// of that stretch of the current partition, found by its BRIN index).
func (s *Store) RailActivity(ctx context.Context, db Querier, window time.Duration) ([]RailActivity, error) {
	rows, err := queryNoJIT(ctx, db, s.sql.railActivity, window)
	if err != nil {
		return nil, fmt.Errorf("rail activity: %w", err)
	}
	byRail := map[string]*RailActivity{}
	var out []RailActivity
	var rail, state, code string
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&rail, &state, &code, &n}, func() error {
		a := byRail[rail]
		if a == nil {
			a = &RailActivity{RailType: rail, ErrorCodes: map[string]int64{}}
			byRail[rail] = a
		}
		switch state {
		case "DISPATCHED":
			a.Dispatched += n
		case "RETRYABLE":
			a.Retryable += n
		case "FAILED":
			a.Failed += n
		}
		if code != "" {
			a.ErrorCodes[code] += n
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("rail activity: %w", err)
	}
	for _, a := range byRail {
		out = append(out, *a)
	}
	return out, nil
}

// LiveRelayer is a relayer that wrote to the archive recently or holds
// claims in flight, live or with their leases expired.
type LiveRelayer struct {
	RelayerID string    `json:"relayer_id"`
	LastSeen  time.Time `json:"last_seen"`
	// InFlight counts its claims whose lease has not ended.
	InFlight int64 `json:"in_flight"`
	// ExpiredLeases counts its claims whose lease has ended, waiting for
	// the reaper: a relayer killed with work in flight shows them here
	// (and 0 in flight), whatever its last archive write.
	ExpiredLeases int64 `json:"expired_leases"`
	// LeaseUntil is when its latest lease ends (or ended); nil without
	// claims in flight.
	LeaseUntil *time.Time `json:"lease_until,omitempty"`
	// ExpiredSince is when its oldest expired lease ended: how long that
	// claim has waited for the reaper. Nil without expired leases.
	ExpiredSince *time.Time `json:"expired_since,omitempty"`
}

// liveRelayersSQL leaves out the operators' rows (REPLAYED, ACKNOWLEDGED,
// CANCELLED), whose relayer_id is the operator's name: an operator who
// acted is not a relayer, and listed as one would hide that none runs.
// It reads inflight once for every relayer (one pass, grouped): inflight
// has no index on relayer_id or lease_until (014 dropped the lease index,
// which every claim paid for), and holds what is in flight, as the
// snapshot's counts of it also read it whole. Every claim in flight
// counts, the expired ones too: a dead relayer's claims are listed until
// the reaper requeues them, even once its last archive write has left the
// window.
const liveRelayersSQL = `
SELECT relayer_id, max(at), sum(n)::bigint, sum(expired)::bigint, max(lease_until), min(expired_since) FROM (
  SELECT relayer_id, max(created_at) AS at, 0 AS n, 0 AS expired, NULL::timestamptz AS lease_until, NULL::timestamptz AS expired_since
  FROM {schema}.attempts
  WHERE created_at > now() - $1::interval AND state NOT IN ('REPLAYED', 'ACKNOWLEDGED', 'CANCELLED') GROUP BY relayer_id
  UNION ALL
  SELECT relayer_id, max(claimed_at), count(*) FILTER (WHERE lease_until >= now()), count(*) FILTER (WHERE lease_until < now()),
         max(lease_until), min(lease_until) FILTER (WHERE lease_until < now())
  FROM {schema}.inflight GROUP BY relayer_id
) x GROUP BY relayer_id ORDER BY relayer_id`

// LiveRelayers lists the relayers (and reapers) that wrote to the archive
// within `window` or hold claims in flight (live or expired leases);
// operators' actions do not count.
func (s *Store) LiveRelayers(ctx context.Context, db Querier, window time.Duration) ([]LiveRelayer, error) {
	rows, err := queryNoJIT(ctx, db, s.sql.liveRelayers, window)
	if err != nil {
		return nil, fmt.Errorf("live relayers: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[LiveRelayer])
}
