package store

import (
	"context"
	"errors"
	"fmt"
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
	// Ordered claims only the lowest pending sequence of a participant
	// that has nothing in flight, and marks the in-flight row so the
	// database allows one per participant.
	Ordered bool
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
// one statement (one implicit transaction): it deletes them from pending,
// appends one DISPATCHING attempt each (attempt number: see budget.go) and
// inserts one in-flight row each with its lease. Rows locked by a
// concurrent claim are skipped, so relayers never claim the same
// instruction.
func (s *Store) Claim(ctx context.Context, db Querier, p ClaimParams) ([]Claimed, error) {
	if p.Limit <= 0 || len(p.Leases) == 0 {
		return nil, nil
	}
	railTypes := make([]string, 0, len(p.Leases))
	leaseMS := make([]int64, 0, len(p.Leases))
	for t, d := range p.Leases {
		railTypes = append(railTypes, t)
		leaseMS = append(leaseMS, d.Milliseconds())
	}
	query := s.sql.claimUnordered
	if p.Ordered {
		query = s.sql.claimOrdered
	}
	rows, err := db.Query(ctx, query, p.RelayerID, p.Limit, railTypes, leaseMS, p.Ordered)
	if err != nil {
		return nil, claimError(err)
	}
	claimed, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Claimed, error) {
		var (
			c            Claimed
			tenant, corr *string
		)
		err := row.Scan(&c.OutboxID, &c.AttemptID, &c.AttemptNo, &c.InstructionID, &c.ParticipantID, &c.SequenceID,
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
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.ConstraintName == "inflight_ordered_participant_idx" {
		return fmt.Errorf("%w: %v", ErrOrderingConflict, err)
	}
	return fmt.Errorf("claim: %w", err)
}

// orderedHeadsCTE finds each participant's lowest pending sequence with a
// recursive skip scan over UNIQUE(participant_id, sequence_id): one index
// probe per participant, however deep each participant's queue is. Only
// heads that are due, on a claimable rail and whose participant has nothing
// in flight are candidates; a head waiting for its retry holds its
// participant back.
const orderedHeadsCTE = `
WITH RECURSIVE heads AS (
  (SELECT participant_id, sequence_id FROM {schema}.pending ORDER BY participant_id, sequence_id LIMIT 1)
  UNION ALL
  SELECT nx.participant_id, nx.sequence_id
  FROM heads h CROSS JOIN LATERAL (
    SELECT p.participant_id, p.sequence_id FROM {schema}.pending p
    WHERE p.participant_id > h.participant_id
    ORDER BY p.participant_id, p.sequence_id LIMIT 1) nx
), heads_due AS (
  SELECT p.outbox_id, p.next_attempt_at, p.created_at
  FROM heads h JOIN {schema}.pending p USING (participant_id, sequence_id)
  WHERE p.next_attempt_at <= now() AND p.rail_type = ANY($3::text[])
    AND NOT EXISTS (SELECT 1 FROM {schema}.inflight f WHERE f.participant_id = p.participant_id)
),`

// claimSQL is the claim proper, taking candidates from the named relation:
// "due" (every due row, for unordered claims) or "heads_due".
func claimSQL(candidates string) string {
	source := `
  SELECT p.outbox_id FROM {schema}.pending p
  WHERE p.next_attempt_at <= now() AND p.rail_type = ANY($3::text[])
  ORDER BY p.next_attempt_at, p.created_at
  LIMIT $2 FOR UPDATE SKIP LOCKED`
	if candidates == "heads_due" {
		source = `
  SELECT p.outbox_id FROM {schema}.pending p
  WHERE p.outbox_id IN (SELECT outbox_id FROM heads_due)
    AND p.next_attempt_at <= now()
  ORDER BY p.next_attempt_at, p.created_at
  LIMIT $2 FOR UPDATE SKIP LOCKED`
	}
	return `
locked AS (` + source + `
), leases AS (
  SELECT * FROM unnest($3::text[], $4::bigint[]) AS l(rail_type, lease_ms)
), claimed AS (
  DELETE FROM {schema}.pending p USING locked WHERE p.outbox_id = locked.outbox_id
  RETURNING p.*, ` + claimAttemptNo + ` AS attempt_no
), dispatching AS (
  INSERT INTO {schema}.attempts (` + archiveColumns + `)
  SELECT {schema}.uuidv7(), ` + identityColumns + `,
         payload, attempt_no, 'DISPATCHING', $1, NULL,
         now(), NULL, NULL, NULL, NULL, NULL, NULL, NULL, false
  FROM claimed
  RETURNING attempt_id, outbox_id, attempt_no, claimed_at
), leased AS (
  INSERT INTO {schema}.inflight (` + inflightColumns + `)
  SELECT ` + from("c", identityColumns) + `,
         c.payload, c.created_at, d.attempt_id, d.attempt_no, $1, $5, d.claimed_at, d.claimed_at + l.lease_ms * interval '1 millisecond'
  FROM claimed c JOIN dispatching d USING (outbox_id) JOIN leases l USING (rail_type)
  RETURNING outbox_id, lease_until
)
SELECT c.outbox_id, d.attempt_id, d.attempt_no, c.instruction_id, c.participant_id, c.sequence_id, c.idempotency_key,
       c.rail_type, c.tenant_id, c.correlation_id, c.payload, d.claimed_at, l.lease_until, c.created_at
FROM claimed c JOIN dispatching d USING (outbox_id) JOIN leased l USING (outbox_id)
ORDER BY c.next_attempt_at, c.created_at`
}
