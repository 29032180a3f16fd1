package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// Run is one run of a relayer (a Start, a RelayOnce pass) as registered
// in relayer_runs (migration 052).
type Run struct {
	RunID     uuid.UUID
	RelayerID string
	Host      string
	PID       int
	// StartedAt is when the run first registered, SeenAt when it last
	// refreshed its registration, by the database's clock.
	StartedAt, SeenAt time.Time
	// ClaimsUntil bounds the claims the run dispatches: each began before
	// it (see RegisterRun).
	ClaimsUntil time.Time
}

// RunParams registers a run (RegisterRun).
type RunParams struct {
	RunID     uuid.UUID
	RelayerID string
	Host      string
	PID       int
	// ClaimsFor is how long from now, by the database's clock, the
	// registration covers the run's claims: ClaimsUntil becomes now plus
	// ClaimsFor, never earlier than it was.
	ClaimsFor time.Duration
	// Refresh refreshes a registration made before and never makes one:
	// a registration removed meanwhile (EndRun, ForgetEndedRuns) stays
	// removed and RegisterRun returns ErrRunNotRegistered. A run's
	// periodic refresh uses it, so that a refresh whose statement the
	// server runs late (its caller gave up on it at a stop, its cancel
	// request arrived before the statement did) cannot bring back the
	// registration the stop removed after it.
	Refresh bool
}

// ErrRunNotRegistered is returned by a refresh (RunParams.Refresh) of a
// registration that does not exist: it was removed, by the run's own
// EndRun or by ForgetEndedRuns after the run could not refresh it for
// longer than ForgetEndedRuns's age.
var ErrRunNotRegistered = errors.New("relayer run not registered")

// RegisterRun registers a run of a relayer under its relayer id, or
// refreshes its registration, and returns it and the other runs
// registered under the same relayer id, in one statement.
//
// The caller promises what ClaimsUntil says: every claim the run
// dispatches is one whose statement began before ClaimsUntil of a
// registration that committed before that claim was sent (the engine
// claims only while the reply of a refresh covers the claim's round
// trip). LostClaims relies on it to leave another run's claims alone: it
// returns nothing while another run of the id has a ClaimsUntil after the
// last claim the looking run heard of.
func (s *Store) RegisterRun(ctx context.Context, db Querier, p RunParams) (self Run, others []Run, err error) {
	runID := pgtype.UUID{Bytes: p.RunID, Valid: true}
	var rows pgx.Rows
	if p.Refresh {
		rows, err = db.Query(ctx, s.sql.refreshRun, runID, p.RelayerID, p.ClaimsFor.Microseconds())
	} else {
		rows, err = db.Query(ctx, s.sql.registerRun, runID, p.RelayerID, p.Host, p.PID, p.ClaimsFor.Microseconds())
	}
	if err != nil {
		return Run{}, nil, fmt.Errorf("register relayer run: %w", err)
	}
	defer rows.Close()
	mine := false
	for rows.Next() {
		var r Run
		var isMine bool
		if err := rows.Scan(&isMine, &r.RunID, &r.RelayerID, &r.Host, &r.PID, &r.StartedAt, &r.SeenAt, &r.ClaimsUntil); err != nil {
			return Run{}, nil, fmt.Errorf("register relayer run: %w", err)
		}
		if isMine {
			self, mine = r, true
		} else {
			others = append(others, r)
		}
	}
	if err := rows.Err(); err != nil {
		return Run{}, nil, fmt.Errorf("register relayer run: %w", err)
	}
	if !mine && p.Refresh {
		return Run{}, nil, fmt.Errorf("refresh relayer run %s: %w", p.RunID, ErrRunNotRegistered)
	}
	if !mine {
		return Run{}, nil, fmt.Errorf("register relayer run %s: no row returned", p.RunID)
	}
	return self, others, nil
}

// EndRun removes a run's registration: the run ended, and no claim it
// dispatched is still in flight (a run that leaves one in flight keeps its
// registration until ForgetEndedRuns removes it). A removed run no longer
// keeps other runs of its relayer id from handing back lost claims.
func (s *Store) EndRun(ctx context.Context, db Querier, runID uuid.UUID) error {
	if _, err := db.Exec(ctx, s.sql.endRun, pgtype.UUID{Bytes: runID, Valid: true}); err != nil {
		return fmt.Errorf("end relayer run: %w", err)
	}
	return nil
}

// ForgetEndedRuns removes the registrations whose ClaimsUntil is more than
// olderThan past, by the database's clock, and that no claim still in
// flight under their relayer id may be of (claimed before their
// ClaimsUntil), and returns how many it removed. A run removes its own
// registration when it stops gracefully; one that was killed, or stopped
// leaving claims in flight, leaves it, under an id often no relayer takes
// again. The condition on the in-flight table keeps what LostClaims
// relies on: a registration is not removed while a claim it covers may be
// dispatched.
func (s *Store) ForgetEndedRuns(ctx context.Context, db Querier, olderThan time.Duration) (int64, error) {
	tag, err := db.Exec(ctx, s.sql.forgetEndedRuns, olderThan.Microseconds())
	if err != nil {
		return 0, fmt.Errorf("forget ended relayer runs: %w", err)
	}
	return tag.RowsAffected(), nil
}

// Runs lists the registered runs of every relayer, by relayer id and
// start.
func (s *Store) Runs(ctx context.Context, db Querier) ([]Run, error) {
	rows, err := db.Query(ctx, s.sql.runs)
	if err != nil {
		return nil, fmt.Errorf("relayer runs: %w", err)
	}
	runs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Run, error) {
		var r Run
		err := row.Scan(&r.RunID, &r.RelayerID, &r.Host, &r.PID, &r.StartedAt, &r.SeenAt, &r.ClaimsUntil)
		return r, err
	})
	if err != nil {
		return nil, fmt.Errorf("relayer runs: %w", err)
	}
	return runs, nil
}

const (
	runColumns = `run_id, relayer_id, host, pid, started_at, seen_at, claims_until`
	// mineAndOthersSQL ends both registration statements: the run's row
	// (me, $1) first, then the other runs of its relayer id ($2).
	mineAndOthersSQL = `
SELECT true, ` + runColumns + ` FROM me
UNION ALL
SELECT false, ` + runColumns + ` FROM {schema}.relayer_runs o WHERE o.relayer_id = $2 AND o.run_id <> $1`
	// registerRunSQL: $1 run id, $2 relayer id, $3 host, $4 pid, $5 how
	// long the registration covers claims, in microseconds. Mine first.
	// One clock reading for the row's times: the columns' defaults read
	// the clock once each, and a new registration's seen_at could be
	// later than its started_at, as if refreshed.
	registerRunSQL = `
WITH t AS (SELECT clock_timestamp() AS now),
me AS (
  INSERT INTO {schema}.relayer_runs AS r (run_id, relayer_id, host, pid, started_at, seen_at, claims_until)
  SELECT $1, $2, $3, $4, t.now, t.now, t.now + $5::bigint * interval '1 microsecond' FROM t
  ON CONFLICT (run_id) DO UPDATE SET seen_at = excluded.seen_at, claims_until = greatest(r.claims_until, excluded.claims_until)
  RETURNING ` + runColumns + `
)
` + mineAndOthersSQL
	// refreshRunSQL: $1 run id, $2 relayer id, $3 as registerRunSQL's $5.
	// An UPDATE, never an INSERT: no row of the run, no row returned as
	// mine.
	refreshRunSQL = `
WITH t AS (SELECT clock_timestamp() AS now),
me AS (
  UPDATE {schema}.relayer_runs r SET seen_at = t.now,
    claims_until = greatest(r.claims_until, t.now + $3::bigint * interval '1 microsecond')
  FROM t
  WHERE r.run_id = $1
  RETURNING ` + runColumns + `
)
` + mineAndOthersSQL
	endRunSQL          = `DELETE FROM {schema}.relayer_runs WHERE run_id = $1`
	forgetEndedRunsSQL = `
DELETE FROM {schema}.relayer_runs r
WHERE r.claims_until < clock_timestamp() - $1::bigint * interval '1 microsecond'
  AND NOT EXISTS (SELECT 1 FROM {schema}.inflight i WHERE i.relayer_id = r.relayer_id AND i.claimed_at <= r.claims_until)`
	runsSQL = `SELECT ` + runColumns + ` FROM {schema}.relayer_runs ORDER BY relayer_id, started_at, run_id`
)
