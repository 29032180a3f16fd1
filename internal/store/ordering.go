package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// ErrInFlight is returned by SetOrdered while instructions are in flight:
// switching must not meet relayers at work.
var ErrInFlight = errors.New("instructions are in flight: stop the relayers before switching ordering")

// Ordered reports whether per-participant ordering is on.
func (s *Store) Ordered(ctx context.Context, db Querier) (bool, error) {
	var on bool
	if err := db.QueryRow(ctx, s.Qualify(`SELECT ordered FROM {schema}.settings`)).Scan(&on); err != nil {
		return false, fmt.Errorf("ordering: %w", err)
	}
	return on, nil
}

// SetOrdered switches per-participant ordering on or off, in one
// transaction that locks out writers of the hot tables. Switching on
// recounts every participant's queued instructions and makes each
// participant's lowest pending sequence its only due row (the others
// wait); switching off makes every waiting row due. It refuses with
// [ErrInFlight] while anything is in flight.
func (s *Store) SetOrdered(ctx context.Context, db TxBeginner, on bool) error {
	return pgx.BeginTxFunc(ctx, db, pgx.TxOptions{}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, s.Qualify(`LOCK TABLE {schema}.sequences, {schema}.pending, {schema}.inflight IN SHARE ROW EXCLUSIVE MODE`)); err != nil {
			return fmt.Errorf("ordering: %w", err)
		}
		var inflight int64
		if err := tx.QueryRow(ctx, s.Qualify(`SELECT count(*) FROM {schema}.inflight`)).Scan(&inflight); err != nil {
			return fmt.Errorf("ordering: %w", err)
		}
		if inflight > 0 {
			return fmt.Errorf("ordering: %w (%d)", ErrInFlight, inflight)
		}
		statements := []string{`UPDATE {schema}.settings SET ordered = $1`}
		if on {
			statements = append(statements,
				`UPDATE {schema}.sequences s SET queued = coalesce((SELECT count(*) FROM {schema}.pending p WHERE p.participant_id = s.participant_id), 0)`,
				// A row put waiting keeps a retry time still ahead
				// (retry_at, waiting.go); one made due is due at it.
				`UPDATE {schema}.pending p SET (next_attempt_at, retry_at) = (SELECT CASE
				   WHEN w.waits THEN 'infinity'
				   WHEN p.next_attempt_at = 'infinity' THEN CASE WHEN p.retry_at > now() THEN p.retry_at ELSE now() END
				   ELSE p.next_attempt_at END,
				   CASE WHEN NOT w.waits THEN NULL
				   WHEN p.next_attempt_at = 'infinity' THEN p.retry_at
				   WHEN p.next_attempt_at > now() THEN p.next_attempt_at END
				 FROM (SELECT EXISTS (SELECT 1 FROM {schema}.pending q
				                      WHERE q.participant_id = p.participant_id AND q.sequence_id < p.sequence_id) AS waits) w)`)
		} else {
			statements = append(statements, `UPDATE {schema}.pending p SET `+dueAgainSQL+` WHERE next_attempt_at = 'infinity'`)
		}
		for i, st := range statements {
			var args []any
			if i == 0 {
				args = []any{on}
			}
			if _, err := tx.Exec(ctx, s.Qualify(st), args...); err != nil {
				return fmt.Errorf("ordering: %w", err)
			}
		}
		return nil
	})
}
