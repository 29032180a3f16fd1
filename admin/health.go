package admin

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/migrations"
	"github.com/ledgerline/outbox/rails"
)

// Check is one readiness check's result.
type Check struct {
	Name  string `json:"name"`
	OK    bool   `json:"ok"`
	Cause string `json:"cause,omitempty"`
}

// Readiness is /readyz's body. Status is "ready", "degraded" (still ready,
// with Reasons) or "not_ready" (Checks says which failed).
type Readiness struct {
	Status  string   `json:"status"`
	Checks  []Check  `json:"checks"`
	Reasons []string `json:"degraded_reasons,omitempty"`
}

func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "alive"})
}

// readyz answers 200 when the process can do its work (database reachable,
// schema at this build's version, listener connected or poll-only by
// choice, not stopping), degraded when it can but the queue is late or a
// rail's breaker is open, and 503 otherwise.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
	defer cancel()
	rd := s.Readiness(ctx)
	status := http.StatusOK
	if rd.Status == "not_ready" {
		status = http.StatusServiceUnavailable
	}
	writeJSON(w, status, rd)
}

// Readiness runs the readiness checks.
func (s *Server) Readiness(ctx context.Context) Readiness {
	var rd Readiness
	add := func(name string, err error) bool {
		c := Check{Name: name, OK: err == nil}
		if err != nil {
			c.Cause = err.Error()
		}
		rd.Checks = append(rd.Checks, c)
		return err == nil
	}
	dbOK := add("database", s.cfg.Pool.Ping(ctx))
	if dbOK {
		_, err := migrations.Ready(ctx, s.cfg.Pool, s.store.Schema())
		add("schema", err)
	} else {
		add("schema", fmt.Errorf("not checked: the database is unreachable"))
	}
	if rl := s.cfg.Relayer; rl != nil {
		h := rl.Health()
		var err error
		switch {
		case !h.Running:
			err = fmt.Errorf("the relayer is not running")
		case !h.Listening && !h.PollOnly:
			err = fmt.Errorf("the LISTEN connection is down (polling meanwhile)")
		}
		add("relayer", err)
	}
	var err error
	if s.stopping.Load() {
		err = fmt.Errorf("shutting down")
	}
	add("not_stopping", err)
	for _, c := range rd.Checks {
		if !c.OK {
			rd.Status = "not_ready"
			return rd
		}
	}
	rd.Status = "ready"
	// Not the Snapshot, which reads the whole queue: probes come every few
	// seconds, backlog or not.
	if late, err := s.store.DueOlderThan(ctx, s.cfg.Pool, s.cfg.DegradedAfter); err == nil && late {
		rd.Reasons = append(rd.Reasons, fmt.Sprintf("the oldest due instruction was enqueued more than %s ago (the threshold)",
			s.cfg.DegradedAfter))
	}
	if reason := s.horizonReason(ctx); reason != "" {
		rd.Reasons = append(rd.Reasons, reason)
	}
	if set := s.cfg.Rails; set != nil {
		for _, t := range set.Types() {
			if st := set.State(t); st != rails.BreakerClosed {
				rd.Reasons = append(rd.Reasons, fmt.Sprintf("rail %s: breaker %s", t, st))
			}
		}
	}
	if len(rd.Reasons) > 0 {
		rd.Status = "degraded"
	}
	return rd
}

// horizonReason says why the database's vacuum horizon makes the process
// degraded, or "" (also when it cannot be read: the other checks report
// an unreachable database).
func (s *Server) horizonReason(ctx context.Context) string {
	h, err := s.store.VacuumHorizon(ctx, s.cfg.Pool)
	if err != nil {
		return ""
	}
	return horizonReason(h.Oldest, s.cfg.HorizonDegradedAfter)
}

// horizonReason says why holder, the oldest holder of the vacuum horizon
// (nil: none), makes the process degraded with threshold after, or "".
func horizonReason(holder *store.HorizonHolder, after time.Duration) string {
	switch o := holder; {
	case o == nil:
		return ""
	case o.Kind == "replication slot" && o.State == "inactive":
		return fmt.Sprintf("the inactive replication slot %s holds back vacuum (%d transaction ids): its standby is gone; drop the slot or reconnect the standby",
			o.ID, o.XIDAge)
	case o.Since != nil && o.AgeSeconds > after.Seconds():
		who := o.Kind + " " + o.ID
		var about []string
		for _, d := range []string{o.Application, o.Role, o.State} {
			if d != "" {
				about = append(about, d)
			}
		}
		if len(about) > 0 {
			who += " (" + strings.Join(about, ", ") + ")"
		}
		return fmt.Sprintf("%s has held back vacuum for %s (the threshold is %s): the hot tables keep every dead row until it ends",
			who, time.Duration(o.AgeSeconds)*time.Second, after)
	}
	return ""
}
