package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Cancel removes a pending instruction so that it is never sent, and
// archives a CANCELLED row saying who (the operator's name and the
// database role that ran it) and why, through the schema's cancel_pending
// function (migrations 020, 035 and 044). An instruction in flight is
// not pending (its rail call may be under way): Cancel refuses it with an
// *CancelInFlightError (errors.Is ErrCancelInFlight) and writes nothing; it reports
// false for one already settled or unknown. The decision is taken under
// the participant's lock, found through the instruction's key (migration
// 044), after waiting for a claim or an outcome write of the instruction
// under way. An instruction whose rail call a relayer's
// stop cut off (CUT_OFF_AT_STOP) is refused with a *RailMayStillActError
// (errors.Is ErrRailMayStillAct) until its claim's lease has ended, and
// nothing is written. With ordering on, cancelling a participant's head
// makes its next instruction due. The key stays: enqueueing the
// instruction again answers with its receipt.
//
// On a db that opens transactions of its own (a pool, a connection; not a
// caller's transaction), a connection that breaks once the cancel was
// sent is settled on another connection (settledAction): done,
// ErrActionNotDone, or ErrCommitUnknown.
func (s *Store) Cancel(ctx context.Context, db Querier, outboxID uuid.UUID, operator, reason string) (bool, error) {
	if err := CheckOperator(operator, reason); err != nil {
		return false, err
	}
	done, err := s.settledAction(ctx, db, func(q Querier) (bool, error) {
		return s.cancel(ctx, q, outboxID, operator, reason)
	}, func(q Querier, sess actionSession) (bool, error) {
		var mine bool
		err := q.QueryRow(ctx, s.Qualify(cancelledSinceSQL), outboxID, sess.started, operator).Scan(&mine)
		return mine, err
	})
	if errors.Is(err, ErrCommitUnknown) || errors.Is(err, ErrActionNotDone) {
		err = fmt.Errorf("cancel %s: %w", outboxID, err)
	}
	return done, err
}

// cancel is Cancel's statement, in db's transaction.
func (s *Store) cancel(ctx context.Context, db Querier, outboxID uuid.UUID, operator, reason string) (bool, error) {
	var n int64
	if err := db.QueryRow(ctx, s.sql.cancel, outboxID, operator, reason).Scan(&n); err != nil {
		if until, ok := railMayStillAct(err); ok {
			return false, &RailMayStillActError{OutboxID: outboxID, Until: until, err: err}
		}
		return false, fmt.Errorf("cancel %s: %w", outboxID, refusedInput(err))
	}
	if n == cancelInFlight {
		return false, &CancelInFlightError{OutboxID: outboxID}
	}
	return n == 1, nil
}

// cancelInFlight is what cancel_pending answers, since migration 044, for
// an instruction in flight (1: cancelled, 0: not pending and not in
// flight). A build before it reads anything but 1 as "not pending".
const cancelInFlight = -1

// ErrCancelInFlight is what a *CancelInFlightError is (errors.Is): a cancel refused
// because the instruction is in flight.
var ErrCancelInFlight = errors.New("the instruction is in flight: its rail call may be under way")

// CancelInFlightError is Cancel's refusal of an instruction a relayer has
// claimed (or was handed): its rail call may be under way, so it cannot be
// withdrawn, and nothing was written. Its outcome settles it: dispatched,
// a dead letter, or back in pending (a retry, a reaped lease), where a
// cancel takes it.
type CancelInFlightError struct {
	OutboxID uuid.UUID
}

// Error says what was refused and why.
func (e *CancelInFlightError) Error() string {
	return fmt.Sprintf("cancel %s: refused, nothing done: it is in flight (a relayer claimed it and its rail call may be under way); cancel it again if it comes back to pending", e.OutboxID)
}

// Is makes errors.Is(err, ErrCancelInFlight) true.
func (e *CancelInFlightError) Is(target error) bool { return target == ErrCancelInFlight }

const cancelSQL = `SELECT {schema}.cancel_pending($1, $2, $3)`

// ErrRailMayStillAct is what a *RailMayStillActError is (errors.Is): a
// cancel refused because the rail may still be acting on the
// instruction's last call.
var ErrRailMayStillAct = errors.New("the rail may still be acting on the instruction's cut-off call")

// RailMayStillActError is Cancel's refusal of an instruction whose rail
// call a relayer's stop cut off (a RETRYABLE CUT_OFF_AT_STOP attempt,
// outcome unknown): until the cut-off claim's lease ends the rail may
// still act on that call, so "cancelled, never sent" could be false.
// Nothing was written; the cancel may be tried again from Until on.
type RailMayStillActError struct {
	OutboxID uuid.UUID
	// Until is when the window ends: the retry time the cut-off attempt's
	// relayer recorded, no earlier than its claim's lease end.
	Until time.Time
	err   error
}

// Error says what was refused and when to try again.
func (e *RailMayStillActError) Error() string {
	if e.Until.IsZero() {
		return fmt.Sprintf("cancel %s: %v", e.OutboxID, e.err)
	}
	return fmt.Sprintf("cancel %s: refused until %s: its rail call was cut off by a relayer's stop (CUT_OFF_AT_STOP, outcome unknown) and the rail may still be acting on it until its claim's lease ends; nothing was done, try again after then",
		e.OutboxID, e.Until.UTC().Format(time.RFC3339Nano))
}

// Is makes errors.Is(err, ErrRailMayStillAct) true.
func (e *RailMayStillActError) Is(target error) bool { return target == ErrRailMayStillAct }

// Unwrap returns the database's refusal.
func (e *RailMayStillActError) Unwrap() error { return e.err }

// railMayStillActCode is the SQLSTATE cancel_pending raises for an
// instruction whose cut-off call the rail may still act on (migration
// 035); the error's detail is the window's end, in UTC.
const railMayStillActCode = "OBCW1"

// railMayStillAct reports whether err is cancel_pending's refusal of a
// cut-off instruction, and until when.
func railMayStillAct(err error) (time.Time, bool) {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != railMayStillActCode {
		return time.Time{}, false
	}
	until, perr := time.Parse(time.RFC3339Nano, pgErr.Detail)
	if perr != nil {
		// The refusal stands without a readable time: the message names it.
		return time.Time{}, true
	}
	return until, true
}
