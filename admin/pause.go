package admin

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/ledgerline/outbox/internal/store"
)

// PauseResult is what a pause or resume did.
type PauseResult struct {
	RailType string `json:"rail_type"`
	Action   string `json:"action"` // pause or resume
	By       string `json:"by"`
	Reason   string `json:"reason"`
	// Done is false when the rail was already paused (pause) or was not
	// paused (resume).
	Done bool `json:"done"`
	// Quiet (pause only) says nothing more can reach the rail: no claim
	// that began before the pause is still open and none of its
	// instructions is in flight, as seen within QuietWait.
	Quiet bool `json:"quiet"`
	// OpenTransactions, InFlight and Held are what the wait last saw
	// (store.Quiet).
	OpenTransactions int   `json:"open_transactions"`
	InFlight         int64 `json:"in_flight"`
	Held             int64 `json:"held"`
	// Error is CommitUnknown or NotDone when the database connection
	// broke during the action (Note says what to do), as for
	// [ActionResult].
	Error string `json:"error,omitempty"`
	Note  string `json:"note,omitempty"`
	// Code is the API's code of an answer other than 200, as for
	// [ActionResult]: NotPaused for a resume of a rail that was not.
	Code string `json:"code,omitempty"`
}

func (r *PauseResult) setCode(code string) { r.Code = code }

// QuietWait is how long a pause through the admin address waits for the
// rail to go quiet before it answers (the CLI's `rails pause --wait` can
// wait longer).
const QuietWait = 5 * time.Second

// The rail actions [Server.PauseRail] takes.
const (
	ActionPause  = "pause"  // stop claiming the rail's instructions, for every relayer
	ActionResume = "resume" // claim them again
)

// PauseRail pauses (ActionPause) or resumes (ActionResume) dispatch to
// railType for every relayer, as operator, for reason, and logs it. A
// pause then waits up to QuietWait for the rail to go quiet. Any other
// action is refused with ErrUnknownAction, and nothing is done; on a
// standby (read-only), every action with ErrReadOnlyStandby.
func (s *Server) PauseRail(ctx context.Context, railType, operator, action, reason string) (PauseResult, error) {
	res := PauseResult{RailType: railType, Action: action, By: operator, Reason: reason}
	if action == ActionPause || action == ActionResume {
		if err := s.refuseOnStandby(ctx); err != nil {
			return res, err
		}
	}
	var err error
	switch action {
	case ActionResume:
		res.Done, err = s.store.ResumeRail(ctx, s.cfg.Pool, railType, operator, reason)
	case ActionPause:
		res.Done, err = s.store.PauseRail(ctx, s.cfg.Pool, railType, operator, reason)
	default:
		return res, fmt.Errorf("%w %q (want %s or %s)", ErrUnknownAction, action, ActionPause, ActionResume)
	}
	switch {
	case errors.Is(err, store.ErrCommitUnknown):
		res.Error, res.Note = CommitUnknown, "it may have been done: the database connection broke after it was sent and the database could not tell; read the pauses in force and their history before acting again (someone may have paused or resumed the rail since)"
		return res, err
	case errors.Is(err, store.ErrActionNotDone):
		res.Error, res.Note = NotDone, "nothing done: the database connection broke before it committed, and the database shows it was not done; try again"
		return res, err
	case err != nil:
		return res, err
	}
	s.overviewReads.Forget()
	if res.Done {
		s.log.Warn("admin: rail "+action, "rail_type", railType, "by", operator, "reason", reason)
	}
	if action == ActionResume {
		return res, nil
	}
	qctx, cancel := context.WithTimeout(ctx, QuietWait)
	defer cancel()
	q, err := s.store.RailQuiet(qctx, s.cfg.Pool, railType, 0)
	res.Quiet, res.OpenTransactions, res.InFlight, res.Held = err == nil, q.Transactions, q.InFlight, q.Held
	if errors.Is(err, store.ErrNotQuiet) && ctx.Err() == nil {
		err = nil // paused; still finishing
	}
	return res, err
}

// pauseRail is POST /api/v1/rails/{rail}/pause and .../resume, with a JSON
// body {"reason": "..."} (required); the rail "*" is every rail.
func (s *Server) pauseRail(w http.ResponseWriter, r *http.Request, who Token) {
	action := r.PathValue("action")
	if action != ActionPause && action != ActionResume {
		writeError(w, http.StatusNotFound, NotFound, "no such action: pause or resume")
		return
	}
	reason, ok := readReason(w, r)
	if !ok {
		return
	}
	res, err := s.PauseRail(r.Context(), r.PathValue("rail"), who.Name, action, reason)
	switch {
	case errors.Is(err, store.ErrOperatorAction), errors.Is(err, store.ErrRailType):
		writeError(w, http.StatusBadRequest, BadRequest, err.Error())
	case errors.Is(err, ErrReadOnlyStandby):
		writeStandby(w)
	case errors.Is(err, store.ErrCommitUnknown):
		s.log.Error("admin: request failed", "method", r.Method, "path", r.URL.Path, "err", err)
		writeResult(w, http.StatusInternalServerError, CommitUnknown, &res)
	case errors.Is(err, store.ErrActionNotDone):
		s.log.Warn("admin: request failed, nothing done", "method", r.Method, "path", r.URL.Path, "err", err)
		writeResult(w, http.StatusServiceUnavailable, NotDone, &res)
	case err != nil:
		s.internalError(w, r, err)
	case !res.Done && action == ActionResume:
		writeResult(w, http.StatusNotFound, NotPaused, &res)
	default:
		writeJSON(w, http.StatusOK, res)
	}
}

// pagePause is the console's pause and resume (POST /console/rails/pause
// and /console/rails/resume, the rail and the reason in the form): the
// overview again, with what was done.
func (s *Server) pagePause(w http.ResponseWriter, r *http.Request, p *page) {
	action := r.PathValue("action")
	if action != ActionPause && action != ActionResume {
		http.Error(w, "no such action", http.StatusNotFound)
		return
	}
	rail, reason := strings.TrimSpace(r.PostFormValue("rail")), strings.TrimSpace(r.PostFormValue("reason"))
	switch {
	case rail == "":
		p.Error = "Name the rail (* for every rail)."
		s.pageRails(w, r, p) // the form again, on the page that keeps it
		return
	case reason == "":
		p.Error = "A reason is required: it is recorded with your name."
		s.pageRails(w, r, p)
		return
	default:
		res, err := s.PauseRail(r.Context(), rail, p.Who.Name, action, reason)
		if errors.Is(err, ErrReadOnlyStandby) {
			p.Error = standbyRefusal
			s.pageRails(w, r, p)
			return
		}
		if errors.Is(err, store.ErrOperatorAction) {
			p.Error = operatorRefusal(err)
			s.pageRails(w, r, p)
			return
		}
		if errors.Is(err, store.ErrActionNotDone) {
			p.Error = actionNotDone
			s.pageRails(w, r, p)
			return
		}
		if errors.Is(err, store.ErrCommitUnknown) {
			s.commitUnknown(w, r, err, "Read the pauses in force (/console/rails; their history in rail_pause_events) before acting again: someone may have paused or resumed the rail since.")
			return
		}
		if err != nil {
			s.internalError(w, r, err)
			return
		}
		switch {
		case !res.Done && action == ActionPause:
			p.Error = "Rail " + rail + " was already paused."
		case !res.Done:
			p.Error = "Rail " + rail + " was not paused."
		case action == ActionResume:
			p.Notice = "Resumed rail " + rail + "."
		case res.Quiet:
			p.Notice = "Paused rail " + rail + ": nothing of it is in flight."
		default:
			p.Notice = "Paused rail " + rail + ": no new claims; what was in flight is still finishing (the in-flight count shows it)."
		}
		// As `outbox rails pause` warns: a pause of a name nothing uses
		// (a misspelling, another letter case) holds nothing, while the
		// rail meant goes on sending.
		// The admin process may serve no rail (it runs apart from the
		// relayers): a rail that sent in the overview's window is real.
		if res.Done && action == ActionPause && res.Held == 0 && rail != store.AllRails &&
			(s.cfg.Rails == nil || !contains(s.cfg.Rails.Types(), rail)) && !s.railSent(r.Context(), rail) {
			p.Error = fmt.Sprintf("No instruction of rail type %q is pending, none was sent in the last %s and this process has no such rail: is the name right? Rail types are case-sensitive; a pause of a name no relayer serves holds nothing.", rail, activityWindow)
		}
	}
	p.RefreshURL = "/console/"
	s.pageOverview(w, r, p)
}

// railSent says whether the archive has outcomes of rail in the overview's
// window (as the overview's rails table shows them); a failed read says
// no, which at worst warns of a name that is right.
func (s *Server) railSent(ctx context.Context, rail string) bool {
	ov, err := s.Overview(ctx)
	if err != nil {
		return false
	}
	for _, ro := range ov.Rails {
		if ro.Rail == rail && ro.Dispatched+ro.Retryable+ro.Failed > 0 {
			return true
		}
	}
	return false
}

// pageRails is the console's page to pause and resume rails (GET
// /console/rails): the pauses in force, each with its resume form, and
// the pause form. It does not refresh itself, unlike the overview, whose
// refresh would wipe a reason being typed.
func (s *Server) pageRails(w http.ResponseWriter, r *http.Request, p *page) {
	ov, err := s.Overview(r.Context())
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	p.Title, p.Nav, p.Data = "Pause or resume a rail", "overview", overviewPage{Overview: ov}
	s.render(w, r, "rails.html", p)
}
