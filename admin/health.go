package admin

import (
	"context"
	"fmt"
	"net/http"
	"slices"
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
	// public is Cause for a request without a credential.
	public string
}

// Readiness is /readyz's body. Status is "ready", "degraded" (still ready,
// with Reasons) or "not_ready" (Checks says which failed).
type Readiness struct {
	Status  string   `json:"status"`
	Checks  []Check  `json:"checks"`
	Reasons []string `json:"degraded_reasons,omitempty"`
	// Notes say what is worth knowing but degrades nothing (a breaker
	// waiting for an instruction to probe its rail with).
	Notes []string `json:"notes,omitempty"`
	// publicReasons and publicNotes are Reasons and Notes for a request
	// without a credential.
	publicReasons, publicNotes []string
	// reasonKeys name Reasons without the figures that change from one
	// probe to the next (a holder's age), for logReadiness.
	reasonKeys []string
}

// Public is rd as /readyz answers a request without a valid credential:
// the same status and checks, with generic causes and reasons. The
// detailed ones name the database's user, host and port (a connect
// error) or the role and application holding back vacuum, and the probe
// is open to anyone who reaches the admin address.
func (rd Readiness) Public() Readiness {
	out := Readiness{Status: rd.Status, Checks: make([]Check, len(rd.Checks)), Reasons: rd.publicReasons, Notes: rd.publicNotes}
	for i, c := range rd.Checks {
		out.Checks[i] = Check{Name: c.Name, OK: c.OK, Cause: c.public}
	}
	return out
}

// detail is rd's causes and reasons on one line, for the log.
func (rd Readiness) detail() string {
	var parts []string
	for _, c := range rd.Checks {
		if !c.OK {
			parts = append(parts, c.Name+": "+c.Cause)
		}
	}
	return strings.Join(append(parts, rd.Reasons...), "; ")
}

// logKey is detail without the figures that change while the state does
// not (a holder's age), so that a held horizon is logged once, not at
// every probe.
func (rd Readiness) logKey() string {
	var parts []string
	for _, c := range rd.Checks {
		if !c.OK {
			parts = append(parts, c.Name+": "+c.Cause)
		}
	}
	return strings.Join(append(parts, rd.reasonKeys...), "; ")
}

func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "alive"})
}

// readyz answers 200 when the process can do its work (database reachable,
// schema at this build's version, listener connected or poll-only by
// choice, not stopping), degraded when it can but the queue is late or a
// rail's breaker is open (or half-open with its probe in flight; waiting
// for an instruction to probe with, it is a note) or its secret file was
// changed into one that is refused, and 503 otherwise. The causes and reasons are
// detailed only for a request with a valid API credential (any role);
// otherwise they are generic (Readiness.Public), and the detail is logged
// when it changes (probes come every few seconds).
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), probeTimeout)
	defer cancel()
	rd := s.Readiness(ctx)
	status := http.StatusOK
	if rd.Status == "not_ready" {
		status = http.StatusServiceUnavailable
	}
	if secret, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		// A throttled source's secret is not checked: the detail tells a
		// valid secret from another (probes send none, and are answered).
		if !s.refuseThrottled(w, r) {
			writeError(w, http.StatusTooManyRequests, TooManyFailures, tooManyGuesses)
			return
		}
		if _, known := match(s.cfg.Tokens, secret); known {
			writeJSON(w, status, rd)
			return
		}
		// A guess is logged and counted, as the API's are.
		s.failedAuth(r)
		s.log.Warn("admin: refused request", "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr, "reason", "unknown credential")
	}
	s.logReadiness(rd)
	writeJSON(w, status, rd.Public())
}

// logReadiness logs what /readyz withheld, once per change of it: not
// of its figures (logKey), which for a held vacuum horizon change at
// every probe, and made one line per probe for as long as it was held.
func (s *Server) logReadiness(rd Readiness) {
	key := rd.logKey()
	s.readyMu.Lock()
	changed := key != s.readyLogged
	s.readyLogged = key
	s.readyMu.Unlock()
	if changed && key != "" {
		s.log.Warn("admin: readiness", "status", rd.Status, "detail", rd.detail())
	}
}

// readinessReads are what the readiness checks read of the database.
type readinessReads struct {
	ping, schema error
	// late says the oldest due instruction is older than DegradedAfter;
	// horizon is horizonReason ("": none), horizonKey its holder.
	late                bool
	horizon, horizonKey string
}

// probeTimeout is how long /readyz waits for its answer.
const probeTimeout = 3 * time.Second

// readinessTimeout bounds the readiness reads. They run on behalf of every
// caller waiting for them, so the first caller leaving does not stop them;
// they end before any probe that waits for them gives up (a probe that
// stopped waiting would answer not_ready where its own reads would have
// answered).
const readinessTimeout = probeTimeout - 500*time.Millisecond

// readReadiness reads what the readiness checks need of the database;
// its error is always nil (a failed read is a check's cause).
func (s *Server) readReadiness(ctx context.Context) (readinessReads, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), readinessTimeout)
	defer cancel()
	var r readinessReads
	if r.ping = s.cfg.Pool.Ping(ctx); r.ping != nil {
		return r, nil
	}
	if _, r.schema = migrations.Ready(ctx, s.cfg.Pool, s.store.Schema()); r.schema != nil {
		return r, nil
	}
	// Not the Snapshot, which reads the whole queue: probes come every few
	// seconds, backlog or not.
	late, err := s.store.DueOlderThan(ctx, s.cfg.Pool, s.cfg.DegradedAfter)
	r.late = err == nil && late
	r.horizon, r.horizonKey = s.horizonReason(ctx)
	return r, nil
}

// Readiness runs the readiness checks, with detailed causes and reasons
// (Public withholds them). Callers that come while another's database
// reads are under way share them (Server.readiness): /readyz needs no
// credential, and each probe's reads took a connection of Config.Pool,
// which a relayer in the same process may share for its claims and
// outcome writes, so that probes side by side could hold them all.
func (s *Server) Readiness(ctx context.Context) Readiness {
	var rd Readiness
	reads, err := s.readiness.Get(ctx)
	if err != nil {
		// This caller's ctx ended while another's reads were under way.
		reads.ping = fmt.Errorf("readiness reads: %w", err)
	}
	// public is the cause shown without a credential; "": err's text,
	// for the causes this file words itself.
	add := func(name string, err error, public string) bool {
		c := Check{Name: name, OK: err == nil}
		if err != nil {
			c.Cause, c.public = err.Error(), public
			if public == "" {
				c.public = c.Cause
			}
		}
		rd.Checks = append(rd.Checks, c)
		return err == nil
	}
	dbOK := add("database", reads.ping, "database unreachable")
	if dbOK {
		add("schema", reads.schema, "schema not ready")
	} else {
		add("schema", fmt.Errorf("not checked: the database is unreachable"), "")
	}
	sharedID := "" // the relayer's other live runs of its id
	if rl := s.cfg.Relayer; rl != nil {
		h := rl.Health()
		sharedID = h.SharedID
		var err error
		public := ""
		switch {
		case !h.Running:
			err = fmt.Errorf("the relayer is not running")
		case h.ReadOnly:
			err = fmt.Errorf("the database refuses the relayer's claims as read-only: its connections reach a standby, not the primary")
		case h.ClaimError != nil:
			// The relayer's own pool: this address's may be another,
			// and its LISTEN connection, opened earlier, stays up.
			err, public = fmt.Errorf("the relayer's claims fail: %w", h.ClaimError), "the relayer's claims fail"
		case h.RecordError != nil:
			err, public = fmt.Errorf("the relayer's outcome writes fail (retried until they succeed): %w", h.RecordError),
				"the relayer's outcome writes fail"
		case !h.Listening && !h.PollOnly:
			err = fmt.Errorf("the LISTEN connection is down (polling meanwhile)")
		}
		add("relayer", err, public)
	}
	var stopping error
	if s.stopping.Load() {
		stopping = fmt.Errorf("shutting down")
	}
	add("not_stopping", stopping, "")
	for _, c := range rd.Checks {
		if !c.OK {
			rd.Status = "not_ready"
			return rd
		}
	}
	rd.Status = "ready"
	// key is reason without its changing figures ("": reason).
	degraded := func(reason, key, public string) {
		if key == "" {
			key = reason
		}
		rd.Reasons, rd.reasonKeys = append(rd.Reasons, reason), append(rd.reasonKeys, key)
		if !slices.Contains(rd.publicReasons, public) {
			rd.publicReasons = append(rd.publicReasons, public)
		}
	}
	if reads.late {
		degraded(fmt.Sprintf("the oldest due instruction was enqueued more than %s ago (the threshold)", s.cfg.DegradedAfter),
			"", "the queue is late")
	}
	if reads.horizon != "" {
		degraded(reads.horizon, reads.horizonKey, "a transaction or replication slot holds back vacuum")
	}
	if sharedID != "" {
		// Degraded, not not-ready: the relayer sends nothing twice on its
		// own account (a lost claim's rows are left to the reaper), and
		// taking both processes out would stop the work.
		degraded(fmt.Sprintf("another relayer is running under this relayer's id (%s): give each its own --relayer-id", sharedID),
			"another relayer is running under this relayer's id", "another relayer is running under this relayer's id")
	}
	if set := s.cfg.Rails; set != nil {
		for _, t := range set.Types() {
			switch st := set.State(t); {
			case st == rails.BreakerHalfOpen && set.ProbesInFlight(t) == 0:
				// The open period is over and the breaker lets the rail's
				// next instruction through as its probe; until one comes
				// nothing is known that was not when it opened, and
				// nothing waits on the rail (a due instruction is claimed
				// as the probe at once, or the queue check above says it
				// is late). Degraded, this stayed so on a quiet rail for
				// hours after the outage.
				rd.Notes = append(rd.Notes, fmt.Sprintf("rail %s: breaker half-open, waiting for an instruction of the rail to probe it with", t))
				if note := "a rail's breaker waits for an instruction to probe its rail with"; !slices.Contains(rd.publicNotes, note) {
					rd.publicNotes = append(rd.publicNotes, note)
				}
			case st == rails.BreakerHalfOpen:
				degraded(fmt.Sprintf("rail %s: breaker half-open, its probe in flight", t), "", "a rail's breaker is not closed")
			case st != rails.BreakerClosed:
				degraded(fmt.Sprintf("rail %s: breaker %s", t, st), "", "a rail's breaker is not closed")
			}
			// The error names the file, never the secret.
			if sec, ok := set.SecretStatus(t); ok && sec.Err != nil {
				degraded(fmt.Sprintf("rail %s: its secret file was changed to one that is refused (%v); requests are still signed with the secret read at %s",
					t, sec.Err, sec.LoadedAt.UTC().Format(time.RFC3339)), "", "a rail's secret file is refused")
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
// an unreachable database), and key names its holder, without the age
// and the state that change while it holds the horizon.
func (s *Server) horizonReason(ctx context.Context) (reason, key string) {
	h, err := s.store.VacuumHorizon(ctx, s.cfg.Pool)
	if err != nil {
		return "", ""
	}
	if reason = horizonReason(h.Oldest, s.cfg.HorizonDegradedAfter); reason != "" {
		key = "vacuum held back by " + h.Oldest.Kind + " " + h.Oldest.ID
		if o := h.Oldest; o.Kind == "replication slot" && o.State == "inactive" {
			key += " (inactive)" // its standby is gone: a change worth a line
		}
	}
	return reason, key
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
