package store

import (
	"context"
	"fmt"
	"time"
)

// Snapshot is the operational state of the queue at one instant. Every
// figure is read from the small hot tables (never the archive), so it is
// cheap enough to scrape every few seconds.
type Snapshot struct {
	Pending           int64         `json:"pending"` // waiting, due or not
	Due               int64         `json:"due"`     // pending and due now
	OldestPendingAge  time.Duration `json:"-"`       // age of the oldest due instruction (0 if none)
	OldestPendingSecs float64       `json:"oldest_pending_age_seconds"`
	InFlight          int64         `json:"in_flight"`
	Stuck             int64         `json:"stuck_dispatching"` // in flight past their lease: a relayer died
	DeadLetters       int64         `json:"dead_letters"`      // not yet acknowledged
	IdleRelayers      int64         `json:"idle_relayers"`     // fresh registrations in relayer_idle (0 on a standby)
	// Standby says the snapshot was read on a hot standby (an auditors'
	// replica): as of its last replayed transaction, and without the idle
	// relayers, whose table is unlogged and so not replicated.
	Standby bool `json:"standby"`
}

// Snapshot reads the queue's operational state.
func (s *Store) Snapshot(ctx context.Context, db Querier) (Snapshot, error) {
	var sn Snapshot
	err := db.QueryRow(ctx, s.sql.snapshot).Scan(
		&sn.Pending, &sn.Due, &sn.OldestPendingSecs, &sn.InFlight, &sn.Stuck, &sn.DeadLetters, &sn.Standby)
	if err != nil {
		return Snapshot{}, fmt.Errorf("snapshot: %w", err)
	}
	// A standby refuses even to plan a read of an unlogged table.
	if !sn.Standby {
		if err := db.QueryRow(ctx, s.sql.idleRelayers).Scan(&sn.IdleRelayers); err != nil {
			return Snapshot{}, fmt.Errorf("snapshot: idle relayers: %w", err)
		}
	}
	sn.OldestPendingAge = time.Duration(sn.OldestPendingSecs * float64(time.Second))
	return sn, nil
}

const snapshotSQL = `
SELECT (SELECT count(*) FROM {schema}.pending),
       (SELECT count(*) FROM {schema}.pending WHERE next_attempt_at <= now()),
       coalesce((SELECT extract(epoch FROM now() - min(created_at)) FROM {schema}.pending WHERE next_attempt_at <= now()), 0),
       (SELECT count(*) FROM {schema}.inflight),
       (SELECT count(*) FROM {schema}.inflight WHERE lease_until < now()),
       (SELECT count(*) FROM {schema}.dead_letters WHERE acknowledged_at IS NULL),
       pg_is_in_recovery()`

const idleRelayersSQL = `SELECT count(*) FROM {schema}.relayer_idle WHERE idle_since > clock_timestamp() - interval '10 seconds'`
