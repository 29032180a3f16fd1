package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"

	"github.com/ledgerline/outbox/payment"
)

// AllRails is the rail type of a pause of every rail.
const AllRails = "*"

// RailPause is a pause in force: no relayer claims an instruction of the
// rail (of every rail for [AllRails]) until an operator resumes it.
type RailPause struct {
	RailType string    `json:"rail_type"`
	PausedBy string    `json:"paused_by"`
	Reason   string    `json:"reason"`
	PausedAt time.Time `json:"paused_at"`
	// AgeSeconds is how long it has been in force, by the database's clock.
	AgeSeconds float64 `json:"age_seconds"`
}

// RailPauseEvent is one line of the append-only record of pauses.
type RailPauseEvent struct {
	ID       uuid.UUID `json:"id"`
	RailType string    `json:"rail_type"`
	Action   string    `json:"action"` // PAUSED or RESUMED
	Operator string    `json:"operator"`
	Reason   string    `json:"reason"`
	At       time.Time `json:"at"`
	// DatabaseRole is the role the pause or resume ran as (session_user,
	// whatever Operator says); nil for the events recorded before
	// migration 035.
	DatabaseRole *string `json:"database_role,omitempty"`
}

// ErrRailType is returned for a pause or resume without a rail type, and
// for a pause of a rail type no instruction may name (more than
// maxRailTypeBytes, or a control or format character: payment.ValidateText),
// refused by the database alike (migration 051).
var ErrRailType = errors.New("a pause needs a rail type (or * for every rail)")

// maxRailTypeBytes bounds a paused rail type as the validators bound an
// instruction's.
const maxRailTypeBytes = 200

// claimableRails is the claim's rail types ($3) less the paused ones: an
// uncorrelated subquery, so an init plan read once per statement (the
// pauses are a handful of rows). A statement whose snapshot was taken after
// a pause committed claims nothing of the paused rail; [Store.RailQuiet]
// waits for the ones that started before.
var claimableRails = claimableRailsOf("$3")

// claimableRailsOf is claimableRails for the rail types in parameter param,
// so that a statement with other parameters (suspectsDueSQL) asks exactly
// what a claim asks.
func claimableRailsOf(param string) string {
	return `ARRAY(SELECT r FROM unnest(` + param + `::text[]) AS r WHERE NOT EXISTS (
      SELECT 1 FROM {schema}.rail_pauses x WHERE x.rail_type = r OR x.rail_type = '` + AllRails + `'))`
}

// PauseRail pauses dispatch to railType (AllRails: every rail) for every
// relayer, through the schema's pause_rail function (migration 019), which
// records who and why in rail_pause_events. Claims and hand-offs that
// start after it returns leave the rail's instructions pending; instructions
// already in flight finish (see [Store.RailQuiet]). With ordering on, a
// participant whose next instruction is on a paused rail waits, whatever
// the rails of its later ones. It reports false if the rail was already
// paused (the first pause and its reason stay).
func (s *Store) PauseRail(ctx context.Context, db Querier, railType, operator, reason string) (bool, error) {
	return s.pauseAction(ctx, db, "pause_rail", railType, operator, reason)
}

// ResumeRail ends the pause of railType, records who and why, and wakes
// idle relayers. It reports false if the rail was not paused. Both settle
// a connection broken once they were sent (ErrActionNotDone,
// ErrCommitUnknown), as Cancel does. Resuming a
// rail does not end a pause of every rail ([AllRails]), nor the reverse.
func (s *Store) ResumeRail(ctx context.Context, db Querier, railType, operator, reason string) (bool, error) {
	return s.pauseAction(ctx, db, "resume_rail", railType, operator, reason)
}

// ErrPauseChanged is returned by ResumeRailShown when the rail's pause in
// force is not the one shown: someone resumed that one and paused the
// rail again since. Nothing was done. admin.ErrPauseChanged is this value,
// for programs outside the module.
var ErrPauseChanged = errors.New("the rail's pause changed since it was shown")

// ResumeRailShown is ResumeRail for the pause of railType made at pausedAt
// only ([RailPause].PausedAt, as its reader was shown it), through the
// schema's resume_rail_shown function (migration 047). It reports false
// if the rail is not paused, and returns ErrPauseChanged, nothing done,
// if its pause in force is another: a resume from a stale view must not
// end a pause made since, for a reason its resumer never saw. A pausedAt
// in whole milliseconds also names the pause made within that
// millisecond (a client that keeps times in milliseconds cuts the
// microseconds off).
func (s *Store) ResumeRailShown(ctx context.Context, db Querier, railType string, pausedAt time.Time, operator, reason string) (bool, error) {
	done, err := s.pauseAction(ctx, db, "resume_rail_shown", railType, operator, reason, pausedAt)
	if err != nil || done {
		return done, err
	}
	var paused bool
	if err := db.QueryRow(ctx, s.Qualify(`SELECT EXISTS (SELECT 1 FROM {schema}.rail_pauses WHERE rail_type = $1)`), railType).Scan(&paused); err != nil {
		return false, fmt.Errorf("resume rail %s: nothing done; is it paused: %w", railType, err)
	}
	if paused && pausedAt.Truncate(time.Millisecond).Equal(pausedAt) {
		// A client that keeps times in milliseconds (a JavaScript Date)
		// sends the pause's microseconds cut off: the pause in force is the
		// one shown if it was made within that millisecond (another pause
		// comes after a resume and a pause of its own).
		var current time.Time
		err := db.QueryRow(ctx, s.Qualify(`SELECT paused_at FROM {schema}.rail_pauses WHERE rail_type = $1`), railType).Scan(&current)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return false, nil
		case err != nil:
			return false, fmt.Errorf("resume rail %s: nothing done; is it paused: %w", railType, err)
		case !current.Equal(pausedAt) && current.Truncate(time.Millisecond).Equal(pausedAt):
			return s.ResumeRailShown(ctx, db, railType, current, operator, reason)
		}
	}
	if paused {
		return false, fmt.Errorf("resume rail %s: %w (shown paused at %s)", railType, ErrPauseChanged, pausedAt.UTC().Format(time.RFC3339Nano))
	}
	return false, nil
}

// pauseAction runs fn (pause_rail, resume_rail; resume_rail_shown with
// the pause's time in shown) for railType as operator.
func (s *Store) pauseAction(ctx context.Context, db Querier, fn, railType, operator, reason string, shown ...time.Time) (bool, error) {
	if strings.TrimSpace(railType) == "" {
		return false, ErrRailType
	}
	// A pause names a rail as an instruction does; a resume takes any
	// name, so that a pause made before the check can still be ended.
	if fn == "pause_rail" {
		if err := payment.ValidateText("rail", railType, maxRailTypeBytes); err != nil {
			return false, fmt.Errorf("%w: %v", ErrRailType, err)
		}
	}
	if err := CheckOperator(operator, reason); err != nil {
		return false, err
	}
	// A lost answer is settled (settledAction) by the record of pauses:
	// this operator's event of this rail since the transaction began.
	event := map[string]string{"pause_rail": "PAUSED", "resume_rail": "RESUMED", "resume_rail_shown": "RESUMED"}[fn]
	done, err := s.settledAction(ctx, db, func(q Querier) (bool, error) {
		var done bool
		var err error
		if len(shown) > 0 {
			err = q.QueryRow(ctx, s.Qualify(`SELECT {schema}.`+fn+`($1, $2, $3, $4)`), railType, shown[0], operator, reason).Scan(&done)
		} else {
			err = q.QueryRow(ctx, s.Qualify(`SELECT {schema}.`+fn+`($1, $2, $3)`), railType, operator, reason).Scan(&done)
		}
		return done, err
	}, func(q Querier, sess actionSession) (bool, error) {
		var mine bool
		err := q.QueryRow(ctx, s.Qualify(pauseEventSinceSQL), railType, event, operator, sess.started).Scan(&mine)
		return mine, err
	})
	if err != nil {
		return false, fmt.Errorf("%s %s: %w", strings.ReplaceAll(strings.TrimSuffix(fn, "_shown"), "_", " "), railType, refusedInput(err))
	}
	return done, nil
}

// pauseEventSinceSQL reports whether operator $3 recorded event $2 of
// rail $1 since $4.
const pauseEventSinceSQL = `SELECT EXISTS (SELECT 1 FROM {schema}.rail_pause_events
WHERE rail_type = $1 AND action = $2 AND operator = $3 AND at >= $4)`

// RailPauses returns the pauses in force, by rail type.
func (s *Store) RailPauses(ctx context.Context, db Querier) ([]RailPause, error) {
	rows, err := db.Query(ctx, s.Qualify(`SELECT rail_type, paused_by, reason, paused_at, extract(epoch FROM now() - paused_at)::float8 FROM {schema}.rail_pauses ORDER BY rail_type`))
	if err != nil {
		return nil, fmt.Errorf("rail pauses: %w", err)
	}
	pauses, err := pgx.CollectRows(rows, pgx.RowToStructByPos[RailPause])
	if err != nil {
		return nil, fmt.Errorf("rail pauses: %w", err)
	}
	return pauses, nil
}

// RailPauseEvents returns the newest limit lines of the record of pauses,
// newest first, through the index by time (migration 049): a page of it,
// however many pauses and resumes were ever recorded (without it, all of
// them were read and sorted).
func (s *Store) RailPauseEvents(ctx context.Context, db Querier, limit int) ([]RailPauseEvent, error) {
	// database_role through to_jsonb: a schema before migration 035 has no
	// such column, and its events have no role (NULL).
	rows, err := db.Query(ctx, s.Qualify(`SELECT event_id, rail_type, action, operator, reason, at, to_jsonb(e)->>'database_role'
FROM {schema}.rail_pause_events e ORDER BY at DESC, event_id DESC LIMIT $1`), limit)
	if err != nil {
		return nil, fmt.Errorf("rail pause events: %w", err)
	}
	events, err := pgx.CollectRows(rows, pgx.RowToStructByPos[RailPauseEvent])
	if err != nil {
		return nil, fmt.Errorf("rail pause events: %w", err)
	}
	return events, nil
}

// Quiet is what may still reach a paused rail.
type Quiet struct {
	// Transactions are the transactions that were using the queue before
	// the pause committed and are still open: each may still claim an
	// instruction of the rail, its snapshot taken before the pause.
	Transactions int `json:"open_transactions"`
	// InFlight are the rail's instructions in flight (all rails' for
	// AllRails): claimed, their outcome not yet recorded.
	InFlight int64 `json:"in_flight"`
	// Held are the rail's pending instructions when RailQuiet was called:
	// what the pause holds back (counted once; producers add more).
	Held int64 `json:"held"`
}

// Done reports whether nothing more can reach the rail.
func (q Quiet) Done() bool { return q.Transactions == 0 && q.InFlight == 0 }

// ErrNotQuiet is returned by RailQuiet when its context ends before the
// rail is quiet; the pause stays in force.
var ErrNotQuiet = errors.New("the paused rail is not quiet yet")

// RailQuiet waits until nothing more can reach a paused rail: first for the
// transactions that held a lock on pending when it was called (a claim
// or a hand-off takes its lock before its snapshot, so one that holds none
// yet will see the pause), then for the rail's in-flight instructions to
// be recorded (or reaped, if their relayer died). It polls every poll
// (a tenth of a second if 0) and returns the last Quiet it saw, with
// [ErrNotQuiet] when ctx ends first. Call it after [Store.PauseRail] has
// returned. It counts the rows of every tenant (outbox.tenant '*' for its
// own transactions).
func (s *Store) RailQuiet(ctx context.Context, db TxBeginner, railType string, poll time.Duration) (Quiet, error) {
	if poll <= 0 {
		poll = 100 * time.Millisecond
	}
	var (
		q     Quiet
		vxids []string
	)
	// The transactions to wait for are those using the queue now, and what
	// the pause holds is counted once.
	err := inEveryTenant(ctx, db, func(tx pgx.Tx) error {
		// Virtual transaction ids: every transaction has one before it
		// writes (a claim that has only read has no transaction id yet).
		// Locks of this database only: another database's tables may
		// have the same oids (a copy of the same template or dump).
		if err := tx.QueryRow(ctx, s.Qualify(`SELECT coalesce(array_agg(DISTINCT virtualtransaction), '{}') FROM pg_locks
WHERE locktype = 'relation' AND relation = '{schema}.pending'::regclass AND granted AND pid <> pg_backend_pid()
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`)).Scan(&vxids); err != nil {
			return err
		}
		if railType == AllRails {
			return tx.QueryRow(ctx, s.Qualify(`SELECT count(*) FROM {schema}.pending`)).Scan(&q.Held)
		}
		return tx.QueryRow(ctx, s.Qualify(railHeldSQL), railType).Scan(&q.Held)
	})
	for err == nil {
		err = inEveryTenant(ctx, db, func(tx pgx.Tx) error {
			if err := tx.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'virtualxid' AND virtualxid = ANY($1)`,
				vxids).Scan(&q.Transactions); err != nil {
				return err
			}
			return tx.QueryRow(ctx, s.Qualify(`SELECT count(*) FROM {schema}.inflight WHERE rail_type = $1 OR $1 = '`+AllRails+`'`),
				railType).Scan(&q.InFlight)
		})
		if err != nil || q.Done() {
			break
		}
		select {
		case <-ctx.Done():
			err = ctx.Err()
		case <-time.After(poll):
		}
	}
	switch {
	case err != nil && ctx.Err() != nil:
		return q, fmt.Errorf("rail %s: %w (%d transactions open, %d in flight)", railType, ErrNotQuiet, q.Transactions, q.InFlight)
	case err != nil:
		return q, fmt.Errorf("rail %s quiet: %w", railType, err)
	}
	return q, nil
}

// RailHasPending reports whether any instruction of railType (of any rail
// for AllRails) is pending, in every tenant: what a pause that does not
// wait for RailQuiet can tell of what it holds back (none most often means
// a misspelt rail type). One row is enough, however long a paused rail's
// backlog.
func (s *Store) RailHasPending(ctx context.Context, db TxBeginner, railType string) (bool, error) {
	var has bool
	err := inEveryTenant(ctx, db, func(tx pgx.Tx) error {
		if railType == AllRails {
			return tx.QueryRow(ctx, s.Qualify(`SELECT EXISTS (SELECT FROM {schema}.pending)`)).Scan(&has)
		}
		return tx.QueryRow(ctx, s.Qualify(railHasPendingSQL), railType).Scan(&has)
	})
	if err != nil {
		return false, fmt.Errorf("rail %s pending: %w", railType, err)
	}
	return has, nil
}

// railHasPendingSQL and railHeldSQL read rail $1's range of the due
// index, in its order, which only that index gives without a sort: a
// generic plan estimates an average rail's share of pending, and for
// "rail_type = $1" alone (or "rail_type = $1 OR $1 = '*'") read pending
// whole instead, however few the rail's rows, none for a misspelt rail
// (TestRailPendingReadsTheRailsRows). Every rail (AllRails) has
// statements of its own.
const (
	railHasPendingSQL = `SELECT coalesce((SELECT true FROM {schema}.pending WHERE rail_type = $1
  ORDER BY next_attempt_at, created_at LIMIT 1), false)`
	railHeldSQL = `SELECT count(*) FROM (SELECT FROM {schema}.pending WHERE rail_type = $1
  ORDER BY next_attempt_at, created_at) p`
)

// inEveryTenant runs fn in a read-only transaction that sees the rows of
// every tenant (outbox.tenant '*').
func inEveryTenant(ctx context.Context, db TxBeginner, fn func(pgx.Tx) error) error {
	return pgx.BeginTxFunc(ctx, db, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT set_config('outbox.tenant', '*', true)`); err != nil {
			return err
		}
		return fn(tx)
	})
}
