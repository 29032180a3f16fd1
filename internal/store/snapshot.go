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
	// VacuumHorizon is the oldest holder of the database's vacuum horizon
	// (see [Store.VacuumHorizon]); nil when nothing holds one, and on a
	// standby.
	VacuumHorizon *HorizonHolder `json:"vacuum_horizon,omitempty"`
	// VacuumHorizonPartial says the role that read the snapshot could not
	// see the details of other roles' sessions (Horizon.SeesAll false).
	VacuumHorizonPartial bool `json:"vacuum_horizon_partial,omitempty"`
	// PausedRails are the pauses in force ([Store.PauseRail]): their due
	// instructions count in Due and OldestPendingAge, and stay there.
	PausedRails []RailPause `json:"paused_rails"`
	// Archive is what keeps the archive sound over the years: checkpoints
	// taken, months made ahead, nothing in the default partition.
	Archive ArchiveHealth `json:"archive"`
}

// ArchiveHealth is what an operator watches to know that the archive's
// upkeep (the reapers' passes) keeps up, which otherwise fails silently:
// without checkpoints, deleting a whole finished instruction goes
// unnoticed by verify; without a month's partition, its rows go to the
// default partition, where that month can never be detached or exported
// until `outbox archive move-default` moves them.
type ArchiveHealth struct {
	// CheckpointAgeSecs is how long ago the last checkpoint's period
	// ended (rows archived since are covered by the hash chains only);
	// nil before the first checkpoint.
	CheckpointAgeSecs *float64 `json:"checkpoint_age_seconds"`
	// MonthsReady counts the archive's months, from the current one (in
	// UTC) on, that have their partition: upkeep keeps 4 (this one and 3
	// ahead); 0 means this month's rows go to the default partition.
	MonthsReady int `json:"months_ready"`
	// DefaultRows is the number of rows in the default partition, by the
	// statistics collector (an estimate, lost at a crash restart until
	// the table is next vacuumed or analyzed); 0 on a standby, which
	// counts nothing of the primary's writes.
	DefaultRows int64 `json:"default_partition_rows"`
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
		h, err := s.VacuumHorizon(ctx, db)
		if err != nil {
			return Snapshot{}, fmt.Errorf("snapshot: %w", err)
		}
		sn.VacuumHorizon, sn.VacuumHorizonPartial = h.Oldest, !h.SeesAll
	}
	if sn.PausedRails, err = s.RailPauses(ctx, db); err != nil {
		return Snapshot{}, fmt.Errorf("snapshot: %w", err)
	}
	if err := db.QueryRow(ctx, s.sql.archiveHealth, s.schema).Scan(
		&sn.Archive.CheckpointAgeSecs, &sn.Archive.MonthsReady, &sn.Archive.DefaultRows); err != nil {
		return Snapshot{}, fmt.Errorf("snapshot: archive: %w", err)
	}
	if sn.Standby {
		sn.Archive.DefaultRows = 0
	}
	sn.OldestPendingAge = time.Duration(sn.OldestPendingSecs * float64(time.Second))
	return sn, nil
}

// snapshotSQL reads pending in one pass for its three figures (the due
// ones filter it rather than scan it again). Every scrape of every
// process's metrics and every console overview reads it, also during a
// backlog: at 1,000,000 pending rows, 50,000 or all of them due, three
// passes took 65-276 ms after a vacuum and 665-1,571 ms before one; one
// pass takes 44-59 and 127-191 ms.
const snapshotSQL = `
SELECT p.n, p.due, coalesce(extract(epoch FROM now() - p.oldest), 0),
       (SELECT count(*) FROM {schema}.inflight),
       (SELECT count(*) FROM {schema}.inflight WHERE lease_until < now()),
       (SELECT count(*) FROM {schema}.dead_letters WHERE acknowledged_at IS NULL),
       pg_is_in_recovery()
FROM (SELECT count(*) AS n, count(*) FILTER (WHERE next_attempt_at <= now()) AS due,
             min(created_at) FILTER (WHERE next_attempt_at <= now()) AS oldest
      FROM {schema}.pending) p`

// archiveHealthSQL reads ArchiveHealth ($1: the schema's name): the last
// checkpoint by its primary key (periods are contiguous: the last to
// start is the last to end), the months' partitions by their names
// (ensure_attempt_partitions names them attempts_YYYY_MM), the default
// partition's rows from the statistics views, which every role may read
// (counting them would need SELECT on the partition itself).
const archiveHealthSQL = `
WITH months AS (
  SELECT to_date(substr(c.relname, 10), 'YYYY_MM') AS m
  FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
  WHERE i.inhparent = to_regclass(format('%I.attempts', $1::text))
    AND c.relname ~ '^attempts_[0-9]{4}_[0-9]{2}$'
)
SELECT (SELECT extract(epoch FROM now() - c.period_end)::float8
        FROM {schema}.checkpoints c ORDER BY c.period_start DESC LIMIT 1),
       coalesce((SELECT min(g)::int FROM generate_series(0, 25) g
                 WHERE (date_trunc('month', now() AT TIME ZONE 'UTC') + make_interval(months => g))::date NOT IN (SELECT m FROM months)), 26),
       coalesce((SELECT n_live_tup FROM pg_stat_user_tables
                 WHERE relid = to_regclass(format('%I.attempts_default', $1::text))), 0)`

const idleRelayersSQL = `SELECT count(*) FROM {schema}.relayer_idle WHERE idle_since > clock_timestamp() - interval '10 seconds'`

// DueOlderThan reports whether some due instruction was enqueued more than
// age ago, which is whether the oldest due instruction (Snapshot's
// OldestPendingAge) is older than age, without finding the oldest:
// readiness probes ask it every few seconds, and during a backlog the
// Snapshot reads the whole queue. It reads each rail's due range up to the
// first such instruction.
func (s *Store) DueOlderThan(ctx context.Context, db Querier, age time.Duration) (bool, error) {
	var late bool
	if err := db.QueryRow(ctx, s.sql.dueOlderThan, age).Scan(&late); err != nil {
		return false, fmt.Errorf("due older than %s: %w", age, err)
	}
	return late, nil
}

// dueOlderThanSQL asks, rail by rail, for the first match in the due
// index's order, which only that index gives without a sort; the rail types
// are found by skipping through the index's leading column (one probe per
// rail type), asked in the whole index's order so that the probes read
// that index too, which every claim keeps in memory, not pending's other
// index that leads with the rail type (migration 049's, for the
// listings). Asked as an EXISTS over the whole table, the planner read
// pending whole once it had statistics (TestDueOlderThanReadsOnlyDue): it
// expected an old, due row among the first few rows (it takes the two
// conditions for independent, while the old rows were mostly the ones not
// due), and where there is none that reads every row.
const dueOlderThanSQL = `
WITH RECURSIVE rails AS (
  (SELECT rail_type FROM {schema}.pending ORDER BY rail_type, next_attempt_at, created_at LIMIT 1)
  UNION ALL
  SELECT (SELECT p.rail_type FROM {schema}.pending p WHERE p.rail_type > r.rail_type
          ORDER BY p.rail_type, p.next_attempt_at, p.created_at LIMIT 1)
  FROM rails r WHERE r.rail_type IS NOT NULL
)
SELECT EXISTS (
  SELECT 1 FROM rails r
  CROSS JOIN LATERAL (SELECT 1 FROM {schema}.pending p
                      WHERE p.rail_type = r.rail_type AND p.next_attempt_at <= now() AND p.created_at < now() - $1::interval
                      ORDER BY p.next_attempt_at LIMIT 1) x
  WHERE r.rail_type IS NOT NULL)`
