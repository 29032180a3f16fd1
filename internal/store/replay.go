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
	"github.com/jackc/pgx/v5/pgconn"

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
// existed; of an instruction in flight, it returns ErrDeadLetterInFlight
// and does nothing.
func (s *Store) Replay(ctx context.Context, db Querier, outboxID uuid.UUID, operator, reason string) (bool, error) {
	if err := CheckOperator(operator, reason); err != nil {
		return false, err
	}
	return s.actOnDeadLetter(ctx, db, s.sql.replay, "replay", outboxID, operator, reason)
}

// actOnDeadLetter runs the operator function query (a replay or an
// acknowledgement) and, when it found no dead letter to act on, says
// whether the instruction is in flight (ErrDeadLetterInFlight) or neither.
// Its failure may have committed between the function's look and the
// look in flight (an outcome write takes no lock either waits for): then
// it is a dead letter now, and the function is run again, at most three
// times in all (one a claim took back at every look was in flight
// throughout: ErrDeadLetterInFlight).
func (s *Store) actOnDeadLetter(ctx context.Context, db Querier, query, action string, outboxID uuid.UUID, operator, reason string) (bool, error) {
	for range 3 {
		var n int64
		if err := db.QueryRow(ctx, query, outboxID, operator, reason).Scan(&n); err != nil {
			return false, fmt.Errorf("%s %s: %w", action, outboxID, refusedInput(err))
		}
		if n == 1 {
			return true, nil
		}
		if s.notThere != nil {
			s.notThere()
		}
		inFlight, err := s.InFlight(ctx, db, outboxID)
		switch {
		case err != nil:
			return false, fmt.Errorf("%s %s: nothing done, not a dead letter: %w", action, outboxID, err)
		case inFlight:
			return false, fmt.Errorf("%s %s: %w", action, outboxID, ErrDeadLetterInFlight)
		}
		var open bool
		if err := db.QueryRow(ctx, s.Qualify(openDeadLetterSQL), outboxID, action == "acknowledge").Scan(&open); err != nil {
			return false, fmt.Errorf("%s %s: nothing done, not a dead letter: %w", action, outboxID, err)
		}
		if !open {
			return false, nil
		}
	}
	return false, fmt.Errorf("%s %s: %w", action, outboxID, ErrDeadLetterInFlight)
}

// openDeadLetterSQL reports whether $1 is a dead letter a replay (any) or,
// with $2, an acknowledgement (one not acknowledged) acts on.
const openDeadLetterSQL = `SELECT EXISTS (SELECT 1 FROM {schema}.dead_letters WHERE outbox_id = $1 AND (NOT $2 OR acknowledged_at IS NULL))`

const replaySQL = `SELECT {schema}.replay_dead_letter($1, $2, $3)`

// ErrOperatorAction is returned for an operator action (replay,
// acknowledge, cancel, pause, resume) without the operator's name or
// without a reason (both are archived with the action), or with a name
// containing "(database role": the archive records the database role that
// ran the action after the name (migration 035), and a name must not be
// able to pass for it; or with a name or a reason holding a control or
// format character (payment.ControlRune), which would change how the
// archive reads where it is shown; or with a name longer than
// MaxOperatorNameBytes or a reason longer than MaxReasonBytes. The
// database refuses the same (migration 051) for a caller without the
// store.
var ErrOperatorAction = errors.New("an operator action needs the operator's name and a reason")

// MaxOperatorNameBytes and MaxReasonBytes bound an operator action's name
// and reason (bytes of UTF-8), here and in the database (migration 051):
// both are archived with every action, in the hash chain, and shown on
// the console, in `outbox audit` and in logs; a name is a person or a
// service, a reason a few sentences, and a reason of megabytes would be
// kept for ever in every row that names it.
const (
	MaxOperatorNameBytes = 256
	MaxReasonBytes       = 4096
)

// roleMark opens the database role in an operator action's archived
// message ("cancelled by alice (database role ops_1): why").
const roleMark = "(database role"

// CheckOperator returns an error wrapping [ErrOperatorAction] when an
// operator action as operator for reason would be refused for its input.
// Every action checks it before it writes; callers that look an
// instruction up first (the admin API, the CLI) check it before that, so
// bad input is answered as such whatever the id names.
func CheckOperator(operator, reason string) error {
	switch {
	case strings.TrimSpace(operator) == "":
		return fmt.Errorf("%w: no operator", ErrOperatorAction)
	case strings.TrimSpace(reason) == "":
		return fmt.Errorf("%w: no reason", ErrOperatorAction)
	case strings.Contains(strings.ToLower(operator), roleMark):
		return fmt.Errorf("%w: the operator's name %q contains %q, which the archive keeps for the database role", ErrOperatorAction, operator, roleMark)
	case len(operator) > MaxOperatorNameBytes:
		return fmt.Errorf("%w: the operator's name is %d bytes, more than %d", ErrOperatorAction, len(operator), MaxOperatorNameBytes)
	case len(reason) > MaxReasonBytes:
		return fmt.Errorf("%w: the reason is %d bytes, more than %d", ErrOperatorAction, len(reason), MaxReasonBytes)
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

// invalidParameterValue is the SQLSTATE of the operator functions'
// refusals of their input.
const invalidParameterValue = "22023"

// refusedInput is err, or, where it is the database's refusal of an
// operator action's input (SQLSTATE 22023 naming the parameter:
// operator_check and pause_rail, migration 051), that refusal as the
// store's own error for it (ErrOperatorAction, ErrRailType), for input
// the store's checks let through: they are the same checks, so only a
// drift between the two would reach it.
func refusedInput(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != invalidParameterValue {
		return err
	}
	switch pgErr.ColumnName {
	case "operator", "reason":
		return fmt.Errorf("%w: the database refused it: %w", ErrOperatorAction, err)
	case "rail_type":
		return fmt.Errorf("%w: the database refused it: %w", ErrRailType, err)
	}
	return err
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
	return s.actOnShown(ctx, db, s.sql.replay, "REPLAYED", outboxID, failedAt, 0, operator, reason)
}

// ReplayAsRead is Replay of the dead letter dl, as DeadLetter read it: it
// replays only if nobody replayed or acknowledged it since that read, else
// it returns ErrDeadLetterChanged and does nothing (as ReplayShown; a dead
// letter read acknowledged is replayed if its acknowledgement is still the
// last action on it). A command that reads a dead letter to report on it
// (whether the rail may have acted) must not replay another failure in its
// place: one that came after another operator's replay of the one read.
func (s *Store) ReplayAsRead(ctx context.Context, db TxBeginner, dl DeadLetter, operator, reason string) (bool, error) {
	return s.actOnShown(ctx, db, s.sql.replay, "REPLAYED", dl.OutboxID, dl.FailedAt, actsSeen(dl), operator, reason)
}

// AcknowledgeAsRead is Acknowledge of the dead letter dl as DeadLetter read
// it, as ReplayAsRead.
func (s *Store) AcknowledgeAsRead(ctx context.Context, db TxBeginner, dl DeadLetter, operator, reason string) (bool, error) {
	return s.actOnShown(ctx, db, s.sql.acknowledge, "ACKNOWLEDGED", dl.OutboxID, dl.FailedAt, actsSeen(dl), operator, reason)
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
	return s.actOnShown(ctx, db, s.sql.acknowledge, "ACKNOWLEDGED", outboxID, failedAt, 0, operator, reason)
}

// actOnShown runs the operator function query and, in the same
// transaction, counts the replays and acknowledgements archived since
// failedAt: exactly this one, after the seen ones it had when shown, when
// the dead letter was the one shown. The
// count is a statement after the function's, so it sees an action that
// committed while the function waited for its row lock; a failure after a
// replay has a later failed_at, so the actions of earlier failures are
// before failedAt. Otherwise the transaction is rolled back. state is the
// state the action archives (REPLAYED or ACKNOWLEDGED).
//
// A connection that breaks once the transaction is under way leaves it
// unknown whether it committed: the commit's answer may be what was lost.
// Reported as a plain failure, the action was run again, and by then a
// replayed dead letter could have failed again: the second run replayed
// the new failure, which nobody had looked at. So what happened is
// settled on another connection (settleLostAction).
func (s *Store) actOnShown(ctx context.Context, db TxBeginner, query, state string, outboxID uuid.UUID, failedAt time.Time, seen int64, operator, reason string) (bool, error) {
	if err := CheckOperator(operator, reason); err != nil {
		return false, err
	}
	var done bool
	var sess actionSession
	err := pgx.BeginTxFunc(ctx, db, pgx.TxOptions{}, func(tx pgx.Tx) error {
		// Which transaction this is, to tell later whether it has ended.
		if err := tx.QueryRow(ctx, actionSessionSQL).Scan(&sess.pid, &sess.started); err != nil {
			return err
		}
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
	if err != nil && sess.pid != 0 && mayHaveCommitted(err) {
		done, err = s.settleLostAction(ctx, db, sess, err, state, outboxID, failedAt, seen, operator)
		if err != nil {
			return false, fmt.Errorf("dead letter %s: %w", outboxID, err)
		}
		return done, nil
	}
	if err != nil {
		return false, fmt.Errorf("dead letter %s: %w", outboxID, refusedInput(err))
	}
	return done, nil
}

// ErrCommitUnknown is returned by an operator action (ReplayShown,
// ReplayAsRead, AcknowledgeShown, AcknowledgeAsRead, Cancel, PauseRail,
// ResumeRail, a month's move in DetachArchive) whose connection broke
// once its transaction was under way, when it could not be settled whether
// it committed (the database could not be reached again, or the
// transaction was still open). It may have been done: read the
// instruction's trail before acting on it again, since a dead letter
// listed again may be a new failure.
var ErrCommitUnknown = errors.New("the action may have committed: its answer was lost")

// ErrActionNotDone is returned by an operator action whose connection
// broke before it committed, when the database shows that its transaction
// ended without it: nothing was done, and it can be run again.
var ErrActionNotDone = errors.New("the connection broke before the action committed: nothing done")

// actionSession is the server session and transaction start of an
// operator action's transaction.
type actionSession struct {
	pid     int32
	started time.Time
}

// actionSessionSQL reads them; now() is the transaction's start, which
// pg_stat_activity shows as xact_start while it is open.
const actionSessionSQL = `SELECT pg_backend_pid(), now()`

// lostActionWait bounds how long settleLostAction waits for the broken
// connection's transaction to end (its server notices the closed socket
// at once; a connection cut without a word keeps it open longer).
const lostActionWait = 30 * time.Second

// mayHaveCommitted reports whether err, an operator action's failure,
// leaves its commit unknown: an error the server did not send (a broken
// connection, a deadline), or one saying the server went away (SQLSTATE
// classes 08 and 57P). Any other server error rolled the transaction back.
func mayHaveCommitted(err error) bool {
	if errors.Is(err, ErrDeadLetterChanged) || errors.Is(err, ErrCancelInFlight) || errors.Is(err, ErrRailMayStillAct) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return strings.HasPrefix(pgErr.Code, "08") || strings.HasPrefix(pgErr.Code, "57P")
	}
	return true
}

// settleLostAction finds out, on another of db's connections, whether an
// operator action whose connection broke (lost) committed: it waits until
// the transaction sess is no longer open on the server, then reads the
// actions archived since failedAt. Only seen of them: nothing was done
// (ErrActionNotDone). One more, of the action's state by operator: done.
// Anything else, or a database it cannot read: ErrCommitUnknown.
func (s *Store) settleLostAction(ctx context.Context, db TxBeginner, sess actionSession, lost error, state string,
	outboxID uuid.UUID, failedAt time.Time, seen int64, operator string) (bool, error) {
	q, ok := db.(Querier)
	if !ok {
		return false, fmt.Errorf("%w (%v)", ErrCommitUnknown, lost)
	}
	unknown := func(why string, err error) (bool, error) {
		return false, fmt.Errorf("%w (%v), and %s: %v", ErrCommitUnknown, lost, why, err)
	}
	if err := waitTransactionEnded(ctx, q, sess); err != nil {
		return false, fmt.Errorf("%w (%v), and %w", ErrCommitUnknown, lost, err)
	}
	rows, err := q.Query(ctx, s.Qualify(operatorActsAfterSQL), outboxID, failedAt)
	if err != nil {
		return unknown("the archive could not be read", err)
	}
	type act struct{ state, by string }
	acts, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (act, error) {
		var a act
		err := r.Scan(&a.state, &a.by)
		return a, err
	})
	if err != nil {
		return unknown("the archive could not be read", err)
	}
	switch {
	case int64(len(acts)) == seen:
		return false, fmt.Errorf("%w (%v)", ErrActionNotDone, lost)
	case int64(len(acts)) == seen+1 && acts[seen].state == state && acts[seen].by == operator:
		return true, nil
	}
	return unknown("the archive shows other actions since", fmt.Errorf("%d since its failure, %d seen before", len(acts), seen))
}

// waitTransactionEnded waits, at most lostActionWait, until the
// transaction sess is no longer open on the server: committed, or rolled
// back when its server noticed the broken connection.
func waitTransactionEnded(ctx context.Context, q Querier, sess actionSession) error {
	for deadline := time.Now().Add(lostActionWait); ; {
		var open bool
		if err := q.QueryRow(ctx, openTransactionSQL, sess.pid, sess.started).Scan(&open); err != nil {
			return fmt.Errorf("the database could not be asked whether it did: %w", err)
		}
		if !open {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("its transaction is still open after %s", lostActionWait)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the wait for its transaction to end was cut short: %w", ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// settledAction runs act (an operator action of one statement, cancel,
// pause or resume) in a transaction of its own on db, when db opens them
// (a pool, a connection; in a caller's transaction it runs act as it is:
// the commit is the caller's). A connection that breaks once the
// transaction is under way leaves it unknown whether it committed: the
// commit's answer may be what was lost, and the operator who reads a
// failure runs it again (a second resume can end a pause someone made
// meanwhile). So it is settled on another connection: once that
// transaction has ended, mine (reading the archive or the pause record
// on q) says whether the action was done: done, or ErrActionNotDone;
// ErrCommitUnknown when that cannot be told.
func (s *Store) settledAction(ctx context.Context, db Querier, act func(Querier) (bool, error),
	mine func(q Querier, sess actionSession) (bool, error)) (bool, error) {
	b, ok := db.(interface {
		Begin(ctx context.Context) (pgx.Tx, error)
	})
	if _, inTx := db.(pgx.Tx); !ok || inTx {
		return act(db)
	}
	var done bool
	var sess actionSession
	err := pgx.BeginFunc(ctx, b, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, actionSessionSQL).Scan(&sess.pid, &sess.started); err != nil {
			return err
		}
		var err error
		done, err = act(tx)
		return err
	})
	if err == nil || sess.pid == 0 || !mayHaveCommitted(err) {
		return done, err
	}
	lost := err
	if err := waitTransactionEnded(ctx, db, sess); err != nil {
		return false, fmt.Errorf("%w (%v), and %w", ErrCommitUnknown, lost, err)
	}
	done, err = mine(db, sess)
	switch {
	case err != nil:
		return false, fmt.Errorf("%w (%v), and what was done could not be read: %v", ErrCommitUnknown, lost, err)
	case !done:
		return false, fmt.Errorf("%w (%v)", ErrActionNotDone, lost)
	}
	return true, nil
}

// cancelledSinceSQL reports whether operator $3 cancelled outbox id $1
// since $2.
const cancelledSinceSQL = `SELECT EXISTS (SELECT 1 FROM {schema}.archive
WHERE outbox_id = $1 AND state = 'CANCELLED' AND created_at >= $2 AND relayer_id = $3)`

// openTransactionSQL reports whether the transaction that started at $2
// on the server session $1 is still open. A session's own role sees its
// xact_start.
const openTransactionSQL = `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND xact_start = $2)`

// operatorActsAfterSQL lists the replays and acknowledgements archived
// since $2, oldest first, with who acted.
const operatorActsAfterSQL = `SELECT state, relayer_id FROM {schema}.archive
WHERE outbox_id = $1 AND created_at > $2 AND state IN ('REPLAYED', 'ACKNOWLEDGED')
ORDER BY created_at, attempt_id`

const operatorActsSinceSQL = `SELECT count(*) FROM {schema}.archive
WHERE outbox_id = $1 AND created_at > $2 AND state IN ('REPLAYED', 'ACKNOWLEDGED')`
