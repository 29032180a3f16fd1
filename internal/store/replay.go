package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"

	"github.com/ledgerline/outbox/payment"
)

// Replay sends a dead letter back to pending with the same outbox and
// sequence id and a fresh retry budget (see budget.go), and archives a
// REPLAYED row naming the operator and the reason, through the schema's
// replay_dead_letter function (migration 008: the only way an operator
// role may write; its statements are replay_dead_letter_any_tenant's since
// migration 022). With ordering on the instruction becomes its
// participant's head again when nothing of the participant is in flight
// and no lower sequence is pending, decided after waiting for a claim of
// the participant's head that is under way (migration 026); else it waits,
// and becomes due when the instruction in flight ends or comes back to
// pending (requeuedSQL, reapSQL). It reports whether the dead letter
// existed.
func (s *Store) Replay(ctx context.Context, db Querier, outboxID uuid.UUID, operator, reason string) (bool, error) {
	if err := checkOperator(operator, reason); err != nil {
		return false, err
	}
	var n int64
	if err := db.QueryRow(ctx, s.sql.replay, outboxID, operator, reason).Scan(&n); err != nil {
		return false, fmt.Errorf("replay %s: %w", outboxID, err)
	}
	return n == 1, nil
}

const replaySQL = `SELECT {schema}.replay_dead_letter($1, $2, $3)`

// ErrOperatorAction is returned for an operator action (replay,
// acknowledge, cancel, pause, resume) without the operator's name or
// without a reason (both are archived with the action), or with a name
// containing "(database role": the archive records the database role that
// ran the action after the name (migration 035), and a name must not be
// able to pass for it; or with a name or a reason holding a control or
// format character (payment.ControlRune), which would change how the
// archive reads where it is shown.
var ErrOperatorAction = errors.New("an operator action needs the operator's name and a reason")

// roleMark opens the database role in an operator action's archived
// message ("cancelled by alice (database role ops_1): why").
const roleMark = "(database role"

func checkOperator(operator, reason string) error {
	switch {
	case strings.TrimSpace(operator) == "":
		return fmt.Errorf("%w: no operator", ErrOperatorAction)
	case strings.TrimSpace(reason) == "":
		return fmt.Errorf("%w: no reason", ErrOperatorAction)
	case strings.Contains(strings.ToLower(operator), roleMark):
		return fmt.Errorf("%w: the operator's name %q contains %q, which the archive keeps for the database role", ErrOperatorAction, operator, roleMark)
	}
	// Both are archived and read on the console, in `outbox audit` and in
	// logs: a line break starts a new line there, a bidi override reverses
	// the text after it. A producer's ids are refused them alike.
	for _, f := range [...]struct{ what, v string }{{"the operator's name", operator}, {"the reason", reason}} {
		if i := strings.IndexFunc(f.v, payment.ControlRune); i >= 0 {
			r, _ := utf8.DecodeRuneInString(f.v[i:])
			return fmt.Errorf("%w: %s contains the control or format character %U, which would change how the archive reads where it is shown",
				ErrOperatorAction, f.what, r)
		}
	}
	return nil
}

// ErrDeadLetterChanged is returned by ReplayShown and AcknowledgeShown when
// the dead letter is no longer the one the operator was shown: since the
// failure shown, someone replayed or acknowledged it (and it may have
// failed again under the same outbox id). Nothing is done.
var ErrDeadLetterChanged = errors.New("the dead letter changed since it was shown")

// ReplayShown is Replay of the dead letter an operator was shown, the one
// that failed at failedAt (DeadLetter.FailedAt): it replays only if nobody
// replayed or acknowledged it since, else it returns ErrDeadLetterChanged
// and does nothing. A form shown before another operator acknowledged the
// dead letter (a payment refunded by hand) must not send it, nor may a
// form submitted twice replay a failure that came after the first replay.
func (s *Store) ReplayShown(ctx context.Context, db TxBeginner, outboxID uuid.UUID, failedAt time.Time, operator, reason string) (bool, error) {
	return s.actOnShown(ctx, db, s.sql.replay, outboxID, failedAt, 0, operator, reason)
}

// ReplayAsRead is Replay of the dead letter dl, as DeadLetter read it: it
// replays only if nobody replayed or acknowledged it since that read, else
// it returns ErrDeadLetterChanged and does nothing (as ReplayShown; a dead
// letter read acknowledged is replayed if its acknowledgement is still the
// last action on it). A command that reads a dead letter to report on it
// (whether the rail may have acted) must not replay another failure in its
// place: one that came after another operator's replay of the one read.
func (s *Store) ReplayAsRead(ctx context.Context, db TxBeginner, dl DeadLetter, operator, reason string) (bool, error) {
	return s.actOnShown(ctx, db, s.sql.replay, dl.OutboxID, dl.FailedAt, actsSeen(dl), operator, reason)
}

// AcknowledgeAsRead is Acknowledge of the dead letter dl as DeadLetter read
// it, as ReplayAsRead.
func (s *Store) AcknowledgeAsRead(ctx context.Context, db TxBeginner, dl DeadLetter, operator, reason string) (bool, error) {
	return s.actOnShown(ctx, db, s.sql.acknowledge, dl.OutboxID, dl.FailedAt, actsSeen(dl), operator, reason)
}

// actsSeen is how many operator actions since its failure a dead letter
// read had: its acknowledgement, if it was acknowledged.
func actsSeen(dl DeadLetter) int64 {
	if dl.AcknowledgedAt != nil {
		return 1
	}
	return 0
}

// AcknowledgeShown is Acknowledge of the dead letter an operator was shown,
// as ReplayShown: a failure that came after a replay nobody has seen is
// not accepted in its place.
func (s *Store) AcknowledgeShown(ctx context.Context, db TxBeginner, outboxID uuid.UUID, failedAt time.Time, operator, reason string) (bool, error) {
	return s.actOnShown(ctx, db, s.sql.acknowledge, outboxID, failedAt, 0, operator, reason)
}

// actOnShown runs the operator function query and, in the same
// transaction, counts the replays and acknowledgements archived since
// failedAt: exactly this one, after the seen ones it had when shown, when
// the dead letter was the one shown. The
// count is a statement after the function's, so it sees an action that
// committed while the function waited for its row lock; a failure after a
// replay has a later failed_at, so the actions of earlier failures are
// before failedAt. Otherwise the transaction is rolled back.
func (s *Store) actOnShown(ctx context.Context, db TxBeginner, query string, outboxID uuid.UUID, failedAt time.Time, seen int64, operator, reason string) (bool, error) {
	if err := checkOperator(operator, reason); err != nil {
		return false, err
	}
	var done bool
	err := pgx.BeginTxFunc(ctx, db, pgx.TxOptions{}, func(tx pgx.Tx) error {
		var n int64
		if err := tx.QueryRow(ctx, query, outboxID, operator, reason).Scan(&n); err != nil || n != 1 {
			return err
		}
		var acts int64
		if err := tx.QueryRow(ctx, s.Qualify(operatorActsSinceSQL), outboxID, failedAt).Scan(&acts); err != nil {
			return err
		}
		if acts != seen+1 {
			return ErrDeadLetterChanged
		}
		done = true
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("dead letter %s: %w", outboxID, err)
	}
	return done, nil
}

const operatorActsSinceSQL = `SELECT count(*) FROM {schema}.archive
WHERE outbox_id = $1 AND created_at > $2 AND state IN ('REPLAYED', 'ACKNOWLEDGED')`
