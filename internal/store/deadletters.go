package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"
)

// DeadLetter is an instruction that failed terminally.
type DeadLetter struct {
	OutboxID       uuid.UUID  `json:"outbox_id"`
	InstructionID  string     `json:"instruction_id"`
	ParticipantID  string     `json:"participant_id"`
	SequenceID     int64      `json:"sequence_id"`
	RailType       string     `json:"rail"`
	TenantID       *string    `json:"tenant_id,omitempty"`
	CorrelationID  *string    `json:"correlation_id,omitempty"`
	AttemptCount   int        `json:"attempt_count"`
	ErrorCode      string     `json:"error_code"`
	ErrorMessage   *string    `json:"error_message,omitempty"`
	EnqueuedAt     time.Time  `json:"enqueued_at"`
	FailedAt       time.Time  `json:"failed_at"`
	AcknowledgedAt *time.Time `json:"acknowledged_at,omitempty"`
	AcknowledgedBy *string    `json:"acknowledged_by,omitempty"`
	// OutcomeUnknown is true when the rail may or may not have acted on
	// the last attempt (a poison instruction whose relayer died during the
	// call). A replay reuses the same idempotency key, so a rail that did
	// act answers it as a duplicate instead of paying twice.
	OutcomeUnknown bool `json:"outcome_unknown"`
}

// DeadLetters lists dead letters, oldest failure first; acknowledged ones
// only when all is true.
func (s *Store) DeadLetters(ctx context.Context, db Querier, all bool, limit int) ([]DeadLetter, error) {
	return s.DeadLettersAfter(ctx, db, all, Cursor{}, limit)
}

// DeadLettersAfter is one page of DeadLetters: those after the cursor
// (failed_at, outbox_id) of the previous page's last row.
func (s *Store) DeadLettersAfter(ctx context.Context, db Querier, all bool, after Cursor, limit int) ([]DeadLetter, error) {
	if after.At.IsZero() {
		after.At = time.Unix(0, 0)
	}
	q := s.sql.openDeadLetters
	if all {
		q = s.sql.allDeadLetters
	}
	rows, err := db.Query(ctx, q, limit, after.At, after.ID)
	if err != nil {
		return nil, fmt.Errorf("dead letters: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[DeadLetter])
}

// DeadLettersOf is DeadLettersAfter for the dead letters of one
// participant ("": everyone's, DeadLettersAfter itself): the participant
// page's link, ?participant= on the console's list and the API. Among
// everyone's, a participant's own may be pages away. No index leads with
// participant_id: each page walks the list's own index in failure order
// and filters, as Participant's count of them scans.
func (s *Store) DeadLettersOf(ctx context.Context, db Querier, all bool, participant string, after Cursor, limit int) ([]DeadLetter, error) {
	if participant == "" {
		return s.DeadLettersAfter(ctx, db, all, after, limit)
	}
	if after.At.IsZero() {
		after.At = time.Unix(0, 0)
	}
	q := s.sql.participantOpenDeadLetters
	if all {
		q = s.sql.participantAllDeadLetters
	}
	rows, err := db.Query(ctx, q, limit, after.At, after.ID, participant)
	if err != nil {
		return nil, fmt.Errorf("dead letters of participant %s: %w", participant, err)
	}
	items, err := pgx.CollectRows(rows, pgx.RowToStructByPos[DeadLetter])
	if err != nil {
		return nil, fmt.Errorf("dead letters of participant %s: %w", participant, err)
	}
	return items, nil
}

// deadLetterSelect reads dead_letters rows as DeadLetter, in field order.
const deadLetterSelect = `
SELECT outbox_id, instruction_id, participant_id, sequence_id, rail_type, tenant_id, correlation_id,
       attempt_count, error_code, error_message, created_at, failed_at, acknowledged_at, acknowledged_by, outcome_unknown
FROM {schema}.dead_letters`

// The open and the whole list are two statements, each with an index in
// its order (dead_letters_open_idx, partial, and dead_letters_failed_idx):
// one statement with the choice as a parameter could use neither index in
// a generic plan, and sorted the table for every page.
const (
	openDeadLettersSQL = deadLetterSelect + ` WHERE acknowledged_at IS NULL AND (failed_at, outbox_id) > ($2, $3)
ORDER BY failed_at, outbox_id LIMIT $1`
	allDeadLettersSQL = deadLetterSelect + ` WHERE (failed_at, outbox_id) > ($2, $3)
ORDER BY failed_at, outbox_id LIMIT $1`
	// DeadLettersOf's: the same, $4 the participant.
	participantOpenDeadLettersSQL = deadLetterSelect + ` WHERE participant_id = $4 AND acknowledged_at IS NULL
  AND (failed_at, outbox_id) > ($2, $3)
ORDER BY failed_at, outbox_id LIMIT $1`
	participantAllDeadLettersSQL = deadLetterSelect + ` WHERE participant_id = $4 AND (failed_at, outbox_id) > ($2, $3)
ORDER BY failed_at, outbox_id LIMIT $1`
)

// CountDeadLetters counts the dead letters DeadLettersOf lists (open ones,
// or all with all; participant's, or everyone's for ""), up to upTo of
// them: the count stops there, as acknowledged dead letters stay until
// their archive month is detached, and an exact count of years of them
// would read every one on each view of the list. A caller that asks for one more than it shows knows when
// there are more.
func (s *Store) CountDeadLetters(ctx context.Context, db Querier, all bool, participant string, upTo int) (int64, error) {
	q := s.sql.countOpenDeadLetters
	if all {
		q = s.sql.countAllDeadLetters
	}
	if participant != "" {
		// A statement of its own: with "$2 = '' OR participant_id = $2"
		// a generic plan cannot use the index by participant (045).
		q = s.sql.countParticipantOpenDeadLetters
		if all {
			q = s.sql.countParticipantAllDeadLetters
		}
	}
	var n int64
	if err := db.QueryRow(ctx, q, upTo, participant).Scan(&n); err != nil {
		return 0, fmt.Errorf("count of dead letters: %w", err)
	}
	return n, nil
}

// The open count keeps acknowledged_at IS NULL in its text, so that it can
// read the partial index of the open ones; an empty $2 is everyone's.
const (
	countOpenDeadLettersSQL = `
SELECT count(*) FROM (SELECT FROM {schema}.dead_letters
  WHERE acknowledged_at IS NULL AND ($2 = '' OR participant_id = $2) LIMIT $1) AS d`
	countAllDeadLettersSQL = `
SELECT count(*) FROM (SELECT FROM {schema}.dead_letters WHERE $2 = '' OR participant_id = $2 LIMIT $1) AS d`
	countParticipantOpenDeadLettersSQL = `
SELECT count(*) FROM (SELECT FROM {schema}.dead_letters
  WHERE acknowledged_at IS NULL AND participant_id = $2 LIMIT $1) AS d`
	countParticipantAllDeadLettersSQL = `
SELECT count(*) FROM (SELECT FROM {schema}.dead_letters WHERE participant_id = $2 LIMIT $1) AS d`
)

// DeadLetter returns the dead letter of an outbox id, or nil if there is
// none.
func (s *Store) DeadLetter(ctx context.Context, db Querier, outboxID uuid.UUID) (*DeadLetter, error) {
	rows, err := db.Query(ctx, s.sql.deadLetter, outboxID)
	if err != nil {
		return nil, fmt.Errorf("dead letter: %w", err)
	}
	dls, err := pgx.CollectRows(rows, pgx.RowToStructByPos[DeadLetter])
	if err != nil || len(dls) == 0 {
		return nil, err
	}
	return &dls[0], nil
}

const deadLetterSQL = deadLetterSelect + ` WHERE outbox_id = $1`

// InFlight reports whether the instruction outboxID is in flight (a
// relayer claimed it and its rail call may be under way), among the rows
// the reader's tenant scope lets it read. A replay or an acknowledgement
// of an id that is not a dead letter says so (ErrDeadLetterInFlight): "not
// a dead letter" alone reads as an id unknown, and an operator told so of
// a payment could send it another way while its rail call was under way.
func (s *Store) InFlight(ctx context.Context, db Querier, outboxID uuid.UUID) (bool, error) {
	var inFlight bool
	if err := db.QueryRow(ctx, s.Qualify(inFlightSQL), outboxID).Scan(&inFlight); err != nil {
		return false, fmt.Errorf("in flight: %w", err)
	}
	return inFlight, nil
}

// DeadLetterOrInFlight is DeadLetter and, when there is no dead letter,
// InFlight: what an operator's replay or acknowledgement reads before it
// acts (the dead letter it acts on), or says (in flight, or neither). An
// instruction whose failure commits between the two looks is read as the
// dead letter it became.
func (s *Store) DeadLetterOrInFlight(ctx context.Context, db Querier, outboxID uuid.UUID) (*DeadLetter, bool, error) {
	dl, err := s.DeadLetter(ctx, db, outboxID)
	if err != nil || dl != nil {
		return dl, false, err
	}
	if s.notThere != nil {
		s.notThere()
	}
	inFlight, err := s.InFlight(ctx, db, outboxID)
	if err != nil || inFlight {
		return nil, inFlight, err
	}
	// Neither, unless its failure committed between the two looks (an
	// outcome write takes no lock either look waits for): one more look
	// at the dead letters. Not there either, it was neither at some moment
	// since the look in flight (any way back into flight is through
	// pending).
	dl, err = s.DeadLetter(ctx, db, outboxID)
	return dl, false, err
}

const inFlightSQL = `SELECT EXISTS (SELECT 1 FROM {schema}.inflight WHERE outbox_id = $1)`

// ErrDeadLetterInFlight is a replay or an acknowledgement refused, nothing
// done, because the instruction is not a dead letter but in flight (see
// InFlight): its outcome settles it, and a failure makes it a dead letter.
var ErrDeadLetterInFlight = errors.New("not a dead letter: the instruction is in flight, its rail call may be under way")
