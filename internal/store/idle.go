package store

import (
	"context"
	"fmt"
	"time"
)

// The adaptive NOTIFY protocol's statements (see the engine's wakeup): a
// relayer registers in relayer_idle while it waits for work, and the
// pending insert trigger notifies only while a fresh registration exists.

// RegisterIdle registers (or refreshes) a relayer as idle.
func (s *Store) RegisterIdle(ctx context.Context, db Querier, relayerID string) error {
	_, err := db.Exec(ctx, s.sql.registerIdle, relayerID)
	return err
}

// UnregisterIdle removes a relayer's idle registration.
func (s *Store) UnregisterIdle(ctx context.Context, db Querier, relayerID string) error {
	_, err := db.Exec(ctx, s.sql.unregisterIdle, relayerID)
	return err
}

// ForgetStaleIdle removes the idle registrations not refreshed for
// olderThan by the database's clock, and returns how many it removed. A
// relayer removes its own row when it stops; one that was killed (or
// stopped while the database was away) leaves it, under an id no relayer
// takes again, and the pending insert trigger, which ignores such rows,
// still reads each of them on every insert. Removing them changes no
// notification: a live idle relayer refreshes its row every few seconds
// (and re-inserts it if it is gone).
func (s *Store) ForgetStaleIdle(ctx context.Context, db Querier, olderThan time.Duration) (int64, error) {
	tag, err := db.Exec(ctx, s.sql.forgetStaleIdle, olderThan.Microseconds())
	if err != nil {
		return 0, fmt.Errorf("forget stale idle registrations: %w", err)
	}
	return tag.RowsAffected(), nil
}

// RunningWriters lists the transactions running right now that have a
// transaction id (the writers), as text.
func RunningWriters(ctx context.Context, db Querier) ([]string, error) {
	var xids []string
	err := db.QueryRow(ctx, runningWritersSQL).Scan(&xids)
	return xids, err
}

// AllFinished reports whether every listed transaction has ended.
func AllFinished(ctx context.Context, db Querier, xids []string) (bool, error) {
	var done bool
	err := db.QueryRow(ctx, allFinishedSQL, xids).Scan(&done)
	return done, err
}

const (
	registerIdleSQL = `INSERT INTO {schema}.relayer_idle (relayer_id, idle_since)
VALUES ($1, clock_timestamp())
ON CONFLICT (relayer_id) DO UPDATE SET idle_since = clock_timestamp()`
	unregisterIdleSQL  = `DELETE FROM {schema}.relayer_idle WHERE relayer_id = $1`
	forgetStaleIdleSQL = `DELETE FROM {schema}.relayer_idle
WHERE idle_since < clock_timestamp() - $1::bigint * interval '1 microsecond'`
	runningWritersSQL = `SELECT coalesce(array_agg(x::text), '{}') FROM pg_snapshot_xip(pg_current_snapshot()) AS x`
	allFinishedSQL    = `SELECT coalesce(bool_and(pg_xact_status(x::xid8) IS DISTINCT FROM 'in progress'), true)
FROM unnest($1::text[]) AS x`
)
