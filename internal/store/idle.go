package store

import (
	"context"
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
	unregisterIdleSQL = `DELETE FROM {schema}.relayer_idle WHERE relayer_id = $1`
	runningWritersSQL = `SELECT coalesce(array_agg(x::text), '{}') FROM pg_snapshot_xip(pg_current_snapshot()) AS x`
	allFinishedSQL    = `SELECT coalesce(bool_and(pg_xact_status(x::xid8) IS DISTINCT FROM 'in progress'), true)
FROM unnest($1::text[]) AS x`
)
