package store

import (
	"context"
	"fmt"
	"time"
)

// HorizonHolder is what holds back the vacuum horizon of the outbox's
// database: while it is held, the dead row versions every claim, outcome
// and enqueue leaves in the hot tables cannot be removed, and every later
// statement walks past them (docs/operations.md, "A held vacuum horizon").
type HorizonHolder struct {
	// Kind is "session" (a transaction, or a query, holding a snapshot),
	// "standby" (a standby's hot_standby_feedback, without a slot),
	// "prepared transaction" or "replication slot" (a standby's feedback
	// through its slot; it stays when the standby is gone).
	Kind string `json:"kind"`
	// ID is the session's pid, the prepared transaction's gid or the
	// slot's name: what pg_terminate_backend, ROLLBACK PREPARED or
	// pg_drop_replication_slot take.
	ID          string `json:"id"`
	Role        string `json:"role,omitempty"`
	Application string `json:"application,omitempty"`
	Client      string `json:"client,omitempty"`
	// State is a session's state (e.g. "idle in transaction") or a slot's
	// ("active", "inactive").
	State string `json:"state,omitempty"`
	// XIDAge is how many transaction ids old the horizon it holds is: about
	// how many write transactions ran since, each of which may have left
	// dead row versions behind. Every kind has it.
	XIDAge int64 `json:"xid_age"`
	// Since is when a session's transaction or a prepared transaction
	// began; nil for slots and standbys, whose age is known in transaction
	// ids only.
	Since      *time.Time `json:"since,omitempty"`
	AgeSeconds float64    `json:"age_seconds,omitempty"` // since Since
}

// Horizon is what VacuumHorizon found.
type Horizon struct {
	// Oldest is the holder of the oldest horizon; nil when nothing holds
	// one.
	Oldest *HorizonHolder
	// SeesAll is false when the role could not see the details of other
	// roles' sessions: their holders are found all the same (by pid, role
	// and transaction ids), but without State, Since or Client, and an
	// autovacuum worker, which holds nothing back, may be named. The
	// schema's roles see the details through the owner (roles.sql); any
	// other role needs pg_read_all_stats.
	SeesAll bool
}

// VacuumHorizon finds the oldest holder of the database's vacuum horizon
// (migration 018's vacuum_horizon): shared memory views only, cheap enough
// for every readiness probe. On a standby it finds the standby's own
// sessions, which hold back nothing on the primary unless
// hot_standby_feedback is on (then they show on the primary as its slot or
// its standby).
func (s *Store) VacuumHorizon(ctx context.Context, db Querier) (Horizon, error) {
	var (
		h                                  Horizon
		kind, id, role, app, client, state *string
		xidAge                             *int64
		since                              *time.Time
		ageSeconds                         *float64
	)
	err := db.QueryRow(ctx, s.sql.vacuumHorizon).Scan(&kind, &id, &role, &app, &client, &state, &xidAge, &since, &ageSeconds, &h.SeesAll)
	if err != nil {
		return Horizon{}, fmt.Errorf("vacuum horizon: %w", err)
	}
	if kind != nil {
		h.Oldest = &HorizonHolder{Kind: *kind, ID: deref(id), Role: deref(role), Application: deref(app),
			Client: deref(client), State: deref(state), Since: since}
		if xidAge != nil {
			h.Oldest.XIDAge = *xidAge
		}
		if ageSeconds != nil {
			h.Oldest.AgeSeconds = *ageSeconds
		}
	}
	return h, nil
}

const vacuumHorizonSQL = `SELECT kind, holder, role_name, application, client, state, xid_age, since,
       extract(epoch FROM clock_timestamp() - since)::float8, sees_all
FROM {schema}.vacuum_horizon()`
