package admin

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
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
	// [ActionResult]; PauseChanged when a resume of the pause shown
	// (ResumeRailShown) found another in force; SchemaBehind when the
	// schema lacks the function the action runs (ErrSchemaBehind).
	Error string `json:"error,omitempty"`
	Note  string `json:"note,omitempty"`
	// Code is the API's code of an answer other than 200, as for
	// [ActionResult]: NotPaused for a resume of a rail that was not.
	Code string `json:"code,omitempty"`
}

func (r *PauseResult) setCode(code string) { r.Code = code }

// ErrPauseChanged is returned by [Server.ResumeRailShown] (PauseResult's
// Error PauseChanged) when the rail's pause in force is not the one shown:
// someone resumed that one and paused the rail again since. Nothing was
// done. It is the internal store's sentinel, the same value, exported
// here so that a program embedding the server can tell it with errors.Is.
var ErrPauseChanged = store.ErrPauseChanged

// PauseChanged is the code (409) of a resume that named the pause it was
// shown (its paused_at) when the rail's pause in force is another: someone
// resumed that one and paused the rail again since. Nothing was done.
const PauseChanged = "PAUSE_CHANGED"

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
	return s.railAction(ctx, railType, nil, operator, action, reason)
}

// ResumeRailShown resumes railType as PauseRail does, but only from the
// pause its operator was shown, made at pausedAt (store.RailPause's
// PausedAt): when the rail's pause in force is another (someone resumed
// that one and paused the rail again since), it returns
// ErrPauseChanged (Error PauseChanged) and does nothing. Done is
// false when the rail is not paused.
func (s *Server) ResumeRailShown(ctx context.Context, railType string, pausedAt time.Time, operator, reason string) (PauseResult, error) {
	return s.railAction(ctx, railType, &pausedAt, operator, ActionResume, reason)
}

// railAction is PauseRail, and with shown ResumeRailShown.
func (s *Server) railAction(ctx context.Context, railType string, shown *time.Time, operator, action, reason string) (PauseResult, error) {
	res := PauseResult{RailType: railType, Action: action, By: operator, Reason: reason}
	if action == ActionPause || action == ActionResume {
		if err := CheckOperatorAction(operator, reason); err != nil {
			return res, err
		}
		if err := s.refuseOnStandby(ctx); err != nil {
			return res, err
		}
	}
	var err error
	switch action {
	case ActionResume:
		if shown != nil {
			res.Done, err = s.store.ResumeRailShown(ctx, s.cfg.Pool, railType, *shown, operator, reason)
		} else {
			res.Done, err = s.store.ResumeRail(ctx, s.cfg.Pool, railType, operator, reason)
		}
	case ActionPause:
		res.Done, err = s.store.PauseRail(ctx, s.cfg.Pool, railType, operator, reason)
	default:
		return res, fmt.Errorf("%w %q (want %s or %s)", ErrUnknownAction, action, ActionPause, ActionResume)
	}
	if behind := schemaBehind(err); behind != nil {
		res.Error, res.Note = SchemaBehind, schemaBehindNote
		s.log.Error("admin: "+action+" refused: the schema is behind this build; run outbox migrate", "rail_type", railType, "by", operator, "err", err)
		return res, behind
	}
	switch {
	case errors.Is(err, store.ErrPauseChanged):
		res.Error, res.Note = PauseChanged, "refused, nothing done: the rail's pause in force is not the one shown (someone resumed that one and paused the rail again since); read the pause in force before resuming it"
		s.log.Warn("admin: resume refused: the pause changed since it was shown", "rail_type", railType, "by", operator)
		return res, err
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
// body {"reason": "..."} (required); the rail "*" is every rail. A resume's
// body may name the pause it was shown, {"paused_at": "..."} (the
// overview's paused_at): it then ends that pause only (ResumeRailShown);
// without, whatever pause the rail has.
func (s *Server) pauseRail(w http.ResponseWriter, r *http.Request, who Token) {
	action := r.PathValue("action")
	if action != ActionPause && action != ActionResume {
		writeError(w, http.StatusNotFound, NotFound, "no such action: pause or resume")
		return
	}
	body, ok := readAction(w, r)
	if !ok {
		return
	}
	var shown *time.Time
	if action == ActionResume {
		shown = body.PausedAt
	}
	res, err := s.railAction(r.Context(), r.PathValue("rail"), shown, who.Name, action, body.Reason)
	switch {
	case errors.Is(err, store.ErrPauseChanged):
		writeResult(w, http.StatusConflict, PauseChanged, &res)
	case errors.Is(err, store.ErrOperatorAction), errors.Is(err, store.ErrRailType):
		writeError(w, http.StatusBadRequest, BadRequest, err.Error())
	case err != nil:
		s.actionFailed(w, r, err, &res)
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
	// A resume is of the pause the form was shown with: not of one
	// another operator made since.
	paused, perr := strconv.ParseInt(r.PostFormValue("paused"), 10, 64)
	shown := time.UnixMicro(paused)
	switch {
	case action == ActionResume && perr != nil:
		p.Error = "The form does not say which pause it was shown with: reload the page."
		s.pageRails(w, r, p)
		return
	case rail == "":
		p.Error = "Name the rail (* for every rail)."
		s.pageRails(w, r, p) // the form again, on the page that keeps it
		return
	case reason == "":
		p.Error = "A reason is required: it is recorded with your name."
		s.pageRails(w, r, p)
		return
	default:
		var at *time.Time
		if action == ActionResume {
			at = &shown
		}
		res, err := s.railAction(r.Context(), rail, at, p.Who.Name, action, reason)
		if errors.Is(err, store.ErrPauseChanged) {
			p.Error = "The pause of " + rail + " changed since this page was shown: someone resumed the pause you saw and paused the rail again. Nothing was done; read the pause in force below before you resume it."
			s.pageRails(w, r, p)
			return
		}
		if errors.Is(err, ErrReadOnlyStandby) {
			p.Error = standbyRefusal
			s.pageRails(w, r, p)
			return
		}
		if errors.Is(err, ErrSchemaBehind) {
			p.Error = schemaBehindRefusal
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
