package admin

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gofrs/uuid/v5"

	"github.com/ledgerline/outbox/attempts"
	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/rails"
)

// Page limits for the listing endpoints.
const (
	defaultPageSize = 50
	maxPageSize     = 500
)

// activityWindow is how far back the overview counts outcomes and looks
// for live relayers.
const activityWindow = 5 * time.Minute

// Overview is the queue at a glance.
type Overview struct {
	Queue store.Snapshot `json:"queue"`
	Rails []RailOverview `json:"rails"`
	// Relayers wrote to the archive in the last 5 minutes or hold claims
	// in flight, live or with their leases expired (a dead relayer's,
	// waiting for the reaper).
	Relayers []store.LiveRelayer `json:"relayers"`
	Window   string              `json:"activity_window"`
	// Warnings are conditions that slow the whole queue down without
	// stopping it: today, a transaction or slot that has held back vacuum
	// past Config.HorizonDegradedAfter (the reason /readyz gives).
	Warnings []string `json:"warnings,omitempty"`
	// ArchiveWarnings say that the archive's upkeep (the reapers' passes)
	// has fallen behind, at the thresholds of the shipped alert rules:
	// the last checkpoint ended more than 15 minutes ago, fewer than 3
	// months from this one on have their partition, or rows went to the
	// default partition.
	ArchiveWarnings []string `json:"archive_warnings,omitempty"`
}

// archiveWarnings words what Overview.ArchiveWarnings says of a.
func archiveWarnings(a store.ArchiveHealth) []string {
	var out []string
	if a.CheckpointAgeSecs != nil && *a.CheckpointAgeSecs > 15*60 {
		out = append(out, fmt.Sprintf("The archive's last checkpoint ended %s ago: rows archived since are covered by their hash chains only (docs/audit.md, \"What checkpoints detect\")",
			(time.Duration(*a.CheckpointAgeSecs)*time.Second).String()))
	}
	if a.MonthsReady < 3 {
		out = append(out, fmt.Sprintf("Only %d months of the archive from this one on have their partition (upkeep keeps 4): check the reapers (docs/operations.md, \"The archive's lifecycle\")", a.MonthsReady))
	}
	if a.DefaultRows > 0 {
		out = append(out, fmt.Sprintf("%d archive rows are in the default partition: their months cannot be detached until outbox archive move-default (docs/operations.md, \"The archive's lifecycle\")", a.DefaultRows))
	}
	return out
}

// RailOverview is one rail's breaker and its last five minutes.
type RailOverview struct {
	Rail    string `json:"rail"`
	Breaker string `json:"breaker"` // closed, half-open, open; "" when this process has no rail set
	// ProbeInFlight says, of a half-open breaker, that its probe (the
	// rail's one instruction let through) is under way; false, it waits
	// for an instruction of the rail to probe with, which on a quiet rail
	// may take hours.
	ProbeInFlight bool `json:"probe_in_flight,omitempty"`
	store.RailActivity
	// ErrorRate is the share of outcomes that were retryable or failed.
	ErrorRate float64 `json:"error_rate"`
	// Paused is the pause that holds the rail (its own, or that of every
	// rail), if any.
	Paused *store.RailPause `json:"paused,omitempty"`
}

func (s *Server) overview(w http.ResponseWriter, r *http.Request, _ Token) {
	ov, err := s.Overview(r.Context())
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, ov)
}

// overviewMaxAge is how old the overview's figures may be. The console's
// overview refreshes itself every 5 s; every open console and every API
// caller of this process shares one read per period (see sharedread).
const overviewMaxAge = 5 * time.Second

// overviewReads are the overview's database reads. Each costs a pass over
// a queue table or over the archive's last five minutes, so they are
// shared (Server.overviewReads); what callers get is read-only.
type overviewReads struct {
	queue    store.Snapshot
	activity []store.RailActivity
	relayers []store.LiveRelayer
}

// overviewTimeout bounds the overview's reads. They run on behalf of
// every caller waiting for them, so the first caller leaving (its request
// cancelled) does not stop them.
const overviewTimeout = 30 * time.Second

func (s *Server) readOverview(ctx context.Context) (r overviewReads, err error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), overviewTimeout)
	defer cancel()
	if r.queue, err = s.store.Snapshot(ctx, s.cfg.Pool); err != nil {
		return r, err
	}
	if r.activity, err = s.store.RailActivity(ctx, s.cfg.Pool, activityWindow); err != nil {
		return r, err
	}
	r.relayers, err = s.store.LiveRelayers(ctx, s.cfg.Pool, activityWindow)
	return r, err
}

// Overview reads the queue's overview. Its figures may be up to 5 s old:
// one read serves every caller in that time.
func (s *Server) Overview(ctx context.Context) (Overview, error) {
	ov := Overview{Window: activityWindow.String()}
	reads, err := s.overviewReads.Get(ctx)
	if err != nil {
		return ov, err
	}
	ov.Queue, ov.Relayers = reads.queue, reads.relayers
	if reason := horizonReason(ov.Queue.VacuumHorizon, s.cfg.HorizonDegradedAfter); reason != "" {
		ov.Warnings = append(ov.Warnings, reason)
	}
	ov.ArchiveWarnings = archiveWarnings(ov.Queue.Archive)
	activity := reads.activity
	byRail := map[string]store.RailActivity{}
	for _, a := range activity {
		byRail[a.RailType] = a
	}
	var names []string
	if s.cfg.Rails != nil {
		names = s.cfg.Rails.Types()
	}
	for _, a := range activity {
		if !contains(names, a.RailType) {
			names = append(names, a.RailType)
		}
	}
	for _, p := range ov.Queue.PausedRails {
		if p.RailType != store.AllRails && !contains(names, p.RailType) {
			names = append(names, p.RailType)
		}
	}
	for _, n := range names {
		a, ok := byRail[n]
		if !ok {
			a = store.RailActivity{RailType: n, ErrorCodes: map[string]int64{}}
		}
		ro := RailOverview{Rail: n, RailActivity: a}
		if total := a.Dispatched + a.Retryable + a.Failed; total > 0 {
			ro.ErrorRate = float64(a.Retryable+a.Failed) / float64(total)
		}
		if s.cfg.Rails != nil && contains(s.cfg.Rails.Types(), n) {
			st := s.cfg.Rails.State(n)
			ro.Breaker = st.String()
			ro.ProbeInFlight = st == rails.BreakerHalfOpen && s.cfg.Rails.ProbesInFlight(n) > 0
		}
		ro.Paused = pauseOf(ov.Queue.PausedRails, n)
		ov.Rails = append(ov.Rails, ro)
	}
	return ov, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Page is a listing's page: Next is the cursor of the next page ("" at
// the end).
type Page[T any] struct {
	Items []T    `json:"items"`
	Next  string `json:"next"`
}

// pageOf makes a page of items: a full page has a next one (which may turn
// out empty), whose cursor is the last item's position.
func pageOf[T any](items []T, limit int, position func(T) store.Cursor) Page[T] {
	p := Page[T]{Items: items}
	if p.Items == nil {
		p.Items = []T{}
	}
	if len(items) == limit && limit > 0 {
		p.Next = encodeCursor(position(items[len(items)-1]))
	}
	return p
}

// The listings' keyset positions.
func queuedCursor(q store.Queued) store.Cursor { return store.Cursor{At: q.EnqueuedAt, ID: q.OutboxID} }
func deadLetterCursor(d store.DeadLetter) store.Cursor {
	return store.Cursor{At: d.FailedAt, ID: d.OutboxID}
}
func attemptCursor(a store.Attempt) store.Cursor {
	return store.Cursor{At: a.CreatedAt, ID: a.AttemptID}
}

// encodeCursor and decodeCursor turn a keyset position into an opaque
// token and back.
func encodeCursor(c store.Cursor) string {
	return base64.RawURLEncoding.EncodeToString(fmt.Appendf(nil, "%d:%s", c.At.UnixNano(), c.ID))
}

func decodeCursor(s string) (store.Cursor, error) {
	if s == "" {
		return store.Cursor{}, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return store.Cursor{}, errors.New("malformed cursor")
	}
	ns, id, ok := strings.Cut(string(b), ":")
	n, err1 := strconv.ParseInt(ns, 10, 64)
	u, err2 := uuid.FromString(id)
	if !ok || err1 != nil || err2 != nil {
		return store.Cursor{}, errors.New("malformed cursor")
	}
	return store.Cursor{At: time.Unix(0, n), ID: u}, nil
}

// pageParams reads ?after= and ?limit=.
func pageParams(r *http.Request) (store.Cursor, int, error) {
	after, err := decodeCursor(r.URL.Query().Get("after"))
	if err != nil {
		return after, 0, err
	}
	limit := defaultPageSize
	if l := r.URL.Query().Get("limit"); l != "" {
		if limit, err = strconv.Atoi(l); err != nil || limit < 1 || limit > maxPageSize {
			return after, 0, fmt.Errorf("limit must be 1 to %d", maxPageSize)
		}
	}
	return after, limit, nil
}

// instructions lists pending (?state=pending, the default) or in-flight
// (?state=in_flight) instructions, filtered by ?participant= and ?rail=.
func (s *Server) instructions(w http.ResponseWriter, r *http.Request, _ Token) {
	after, limit, err := pageParams(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, BadRequest, err.Error())
		return
	}
	q := r.URL.Query()
	f := store.QueuedFilter{Participant: q.Get("participant"), Rail: q.Get("rail"), After: after, Limit: limit}
	switch q.Get("state") {
	case "", "pending":
	case "in_flight":
		f.InFlight = true
	default:
		writeError(w, http.StatusBadRequest, BadRequest, "state must be pending or in_flight")
		return
	}
	items, err := s.store.ListQueued(r.Context(), s.cfg.Pool, f)
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, pageOf(items, limit, queuedCursor))
}

func (s *Server) participant(w http.ResponseWriter, r *http.Request, _ Token) {
	v, err := s.participantView(r.Context(), r.PathValue("id"))
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

// DeadLetterPage is a page of dead letters with how many the filter
// matches, every page together: the same figure the console's list shows.
type DeadLetterPage struct {
	Page[store.DeadLetter]
	// Total is the count, up to DeadLetterCountBound.
	Total int64 `json:"total"`
	// TotalIsLowerBound says more than Total dead letters match: the count
	// stops at its bound, as acknowledged dead letters stay until their
	// archive month is detached and counting years of them on every call
	// would read them all.
	TotalIsLowerBound bool `json:"total_is_lower_bound"`
}

// deadLetters lists unacknowledged dead letters (?all=true: every one),
// oldest failure first; ?participant= only that participant's; with how
// many match.
func (s *Server) deadLetters(w http.ResponseWriter, r *http.Request, _ Token) {
	after, limit, err := pageParams(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, BadRequest, err.Error())
		return
	}
	q := r.URL.Query()
	all, participant := q.Get("all") == "true", q.Get("participant")
	items, err := s.store.DeadLettersOf(r.Context(), s.cfg.Pool, all, participant, after, limit)
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	p := DeadLetterPage{Page: pageOf(items, limit, deadLetterCursor)}
	if p.Total, p.TotalIsLowerBound, err = s.countDeadLetters(r.Context(), all, participant); err != nil {
		s.internalError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, p)
}

// The operator actions [Server.Act] takes.
const (
	ActionReplay      = "replay"      // send a dead letter back to pending
	ActionAcknowledge = "acknowledge" // accept a dead letter's failure
	ActionCancel      = "cancel"      // cancel a pending instruction: never sent
)

// ErrUnknownAction is returned by [Server.Act] for an action that is not
// one of ActionReplay, ActionAcknowledge and ActionCancel; nothing is done.
var ErrUnknownAction = errors.New("admin: unknown operator action")

// ActionResult is the answer to a replay, an acknowledgement or a cancel.
type ActionResult struct {
	OutboxID       uuid.UUID `json:"outbox_id"`
	Action         string    `json:"action"` // ActionReplay, ActionAcknowledge or ActionCancel
	Done           bool      `json:"done"`
	By             string    `json:"by"`
	Reason         string    `json:"reason"`
	OutcomeUnknown bool      `json:"outcome_unknown"`
	Note           string    `json:"note,omitempty"`
	// Error is RailMayStillAct when a cancel was refused because the rail
	// may still be acting on the instruction's cut-off call (RetryAfter
	// is then when the cancel may be tried again), InFlight when it (or
	// a replay or an acknowledgement) was refused because the instruction
	// is in flight, SchemaBehind when the schema lacks a function the
	// action runs (ErrSchemaBehind).
	Error      string     `json:"error,omitempty"`
	RetryAfter *time.Time `json:"retry_after,omitempty"`
	// Code is the API's code of an answer other than 200 (its table is in
	// docs/operations.md, "The API's error codes"): Error's code where
	// Error is set, NotFound for a 404.
	Code string `json:"code,omitempty"`
}

func (r *ActionResult) setCode(code string) { r.Code = code }

// RailMayStillAct is [ActionResult.Error] for a cancel refused with
// store.ErrRailMayStillAct: a relayer's stop cut the instruction's rail
// call off (CUT_OFF_AT_STOP, outcome unknown) and until its claim's lease
// ends the rail may still act on it. Nothing was done; the API answers 409
// with a Retry-After header.
const RailMayStillAct = "RAIL_MAY_STILL_ACT"

// DeadLetterChanged is [ActionResult.Error] for a replay or an
// acknowledgement refused with store.ErrDeadLetterChanged: someone
// replayed or acknowledged the dead letter since it was read (or shown),
// and it may have failed again. Nothing was done; the API answers 409.
const DeadLetterChanged = "DEAD_LETTER_CHANGED"

// CommitUnknown is [ActionResult.Error] for a replay, an acknowledgement
// or a cancel whose database connection broke once it was sent and
// whose outcome the server could not settle (store.ErrCommitUnknown): it
// may have been done. The API answers 500; read the instruction's trail
// before acting on it again (a dead letter listed again may be a new
// failure).
const CommitUnknown = "COMMIT_UNKNOWN"

// NotDone is [ActionResult.Error] for a replay, an acknowledgement or a
// cancel whose database connection broke before it committed, when the database shows
// it was not done (store.ErrActionNotDone). Nothing was done; the API
// answers 503, and it can be tried again.
const NotDone = "NOT_DONE"

// InFlight is [ActionResult.Error] for a cancel refused with
// store.ErrCancelInFlight, or a replay or an acknowledgement with
// store.ErrDeadLetterInFlight: a relayer claimed the instruction and its
// rail call may be under way. Nothing was done; the API answers 409.
const InFlight = "IN_FLIGHT"

func (s *Server) replay(w http.ResponseWriter, r *http.Request, who Token) {
	s.act(w, r, who, ActionReplay)
}

func (s *Server) acknowledge(w http.ResponseWriter, r *http.Request, who Token) {
	s.act(w, r, who, ActionAcknowledge)
}

func (s *Server) cancel(w http.ResponseWriter, r *http.Request, who Token) {
	s.act(w, r, who, ActionCancel)
}

// act replays or acknowledges the dead letter {id}, or cancels the pending
// instruction {id}, as the token's name, for the reason in the JSON body
// (readReason).
func (s *Server) act(w http.ResponseWriter, r *http.Request, who Token, action string) {
	id, err := uuid.FromString(r.PathValue("id"))
	if err != nil {
		writeError(w, http.StatusBadRequest, BadRequest, "not an outbox id")
		return
	}
	reason, ok := readReason(w, r)
	if !ok {
		return
	}
	res, err := s.Act(r.Context(), id, who.Name, action, reason)
	switch {
	case errors.Is(err, store.ErrRailMayStillAct):
		if res.RetryAfter != nil {
			w.Header().Set("Retry-After", strconv.FormatInt(int64(math.Ceil(max(time.Until(*res.RetryAfter).Seconds(), 1))), 10))
		}
		writeResult(w, http.StatusConflict, res.Error, &res)
	case errors.Is(err, store.ErrCancelInFlight), errors.Is(err, store.ErrDeadLetterInFlight), errors.Is(err, store.ErrDeadLetterChanged):
		writeResult(w, http.StatusConflict, res.Error, &res)
	case errors.Is(err, store.ErrOperatorAction), errors.Is(err, ErrUnknownAction):
		writeError(w, http.StatusBadRequest, BadRequest, err.Error())
	case err != nil:
		s.actionFailed(w, r, err, &res)
	case !res.Done:
		writeResult(w, http.StatusNotFound, NotFound, &res)
	default:
		writeJSON(w, http.StatusOK, res)
	}
}

// actionFailed answers an operator action (a replay, acknowledgement or
// cancel; a pause or resume) that failed in a way every action can: on a
// standby, with its commit unknown or not done after a broken connection
// (the result v carried with its code), on a schema older than this
// build (503, SchemaBehind), or otherwise (500, logged).
func (s *Server) actionFailed(w http.ResponseWriter, r *http.Request, err error, v coded) {
	switch {
	case errors.Is(err, ErrReadOnlyStandby):
		writeStandby(w)
	case errors.Is(err, ErrSchemaBehind):
		writeResult(w, http.StatusServiceUnavailable, SchemaBehind, v)
	case errors.Is(err, store.ErrCommitUnknown):
		s.log.Error("admin: request failed", "method", r.Method, "path", r.URL.Path, "err", err)
		writeResult(w, http.StatusInternalServerError, CommitUnknown, v)
	case errors.Is(err, store.ErrActionNotDone):
		s.log.Warn("admin: request failed, nothing done", "method", r.Method, "path", r.URL.Path, "err", err)
		writeResult(w, http.StatusServiceUnavailable, NotDone, v)
	default:
		s.internalError(w, r, err)
	}
}

// actionBody is an operator action's JSON body: the reason (required)
// and, for a resume, the pause it was shown (paused_at, optional).
type actionBody struct {
	Reason   string     `json:"reason"`
	PausedAt *time.Time `json:"paused_at"`
}

// readReason reads an operator action's JSON body, {"reason": "..."}, and
// answers 400 itself when there is no reason.
func readReason(w http.ResponseWriter, r *http.Request) (string, bool) {
	body, ok := readAction(w, r)
	return body.Reason, ok
}

// readAction reads an operator action's JSON body, and answers 400
// itself when there is no reason or it is malformed.
func readAction(w http.ResponseWriter, r *http.Request) (actionBody, bool) {
	var body actionBody
	if err := json.NewDecoder(io.LimitReader(r.Body, 64<<10)).Decode(&body); err != nil || strings.TrimSpace(body.Reason) == "" {
		writeError(w, http.StatusBadRequest, BadRequest, `a JSON body {"reason": "..."} with a non-empty reason is required (a resume's "paused_at", if given, an RFC 3339 time)`)
		return actionBody{}, false
	}
	return body, true
}

// Act replays or acknowledges a dead letter, or cancels a pending
// instruction (action ActionReplay, ActionAcknowledge or ActionCancel), as
// operator, for reason, and logs it. Done is false when there was no such
// (unacknowledged) dead letter, or the instruction was not pending; a
// cancel of an instruction in flight is refused with
// store.ErrCancelInFlight (Error InFlight), a replay or an acknowledgement
// of an instruction in flight with store.ErrDeadLetterInFlight (Error
// InFlight), and a replay or an
// acknowledgement of a dead letter someone replayed or acknowledged between
// Act's read of it and its action with store.ErrDeadLetterChanged (Error
// DeadLetterChanged), nothing done. Any
// other action is refused with ErrUnknownAction before anything is read:
// a misspelled action must not fall through to another one. A name or a
// reason the archive refuses (CheckOperatorAction) is refused with
// store.ErrOperatorAction before anything is read. On a standby
// (read-only) every action is refused with ErrReadOnlyStandby before it
// is tried.
func (s *Server) Act(ctx context.Context, id uuid.UUID, operator, action, reason string) (ActionResult, error) {
	return s.takeAction(ctx, id, nil, operator, action, reason)
}

// takeAction is Act. With shown (the failure time of the dead letter the
// console's form was shown with), a replay or an acknowledgement acts only
// on that dead letter, and returns store.ErrDeadLetterChanged when someone
// replayed or acknowledged it since (store.ReplayShown); without, only on
// the dead letter it read first (store.ReplayAsRead), alike.
func (s *Server) takeAction(ctx context.Context, id uuid.UUID, shown *time.Time, operator, action, reason string) (ActionResult, error) {
	res := ActionResult{OutboxID: id, Action: action, By: operator, Reason: reason}
	if action == ActionCancel || action == ActionReplay || action == ActionAcknowledge {
		// Bad input is refused as such before anything is read: a replay
		// of an id that is no open dead letter answered "not found" for a
		// reason it would have refused.
		if err := CheckOperatorAction(operator, reason); err != nil {
			return res, err
		}
		if err := s.refuseOnStandby(ctx); err != nil {
			return res, err
		}
	}
	var err error
	switch action {
	case ActionCancel:
		res.Done, err = s.store.Cancel(ctx, s.cfg.Pool, id, operator, reason)
		if wait := (*store.RailMayStillActError)(nil); errors.As(err, &wait) {
			res.Error, res.Note = RailMayStillAct, "refused, nothing done: its rail call was cut off by a relayer's stop (CUT_OFF_AT_STOP, outcome unknown) and the rail may still be acting on it; cancel again after retry_after"
			if !wait.Until.IsZero() {
				until := wait.Until.UTC()
				res.RetryAfter = &until
			}
			s.log.Warn("admin: cancel refused: the rail may still be acting on the cut-off call", "outbox_id", id, "by", operator, "retry_after", wait.Until)
			return res, err
		}
		if errors.Is(err, store.ErrCancelInFlight) {
			res.Error, res.Note = InFlight, "refused, nothing done: in flight (a relayer claimed it and its rail call may be under way); its outcome settles it, and a cancel takes it if it comes back to pending"
			s.log.Warn("admin: cancel refused: the instruction is in flight", "outbox_id", id, "by", operator)
			return res, err
		}
		if err == nil && !res.Done {
			res.Note = "not pending: already settled, or unknown"
		}
	case ActionReplay, ActionAcknowledge:
		var dl *store.DeadLetter
		var inFlight bool
		if dl, inFlight, err = s.store.DeadLetterOrInFlight(ctx, s.cfg.Pool, id); err != nil {
			return res, err
		}
		if dl == nil {
			// Not a dead letter: one in flight is said so, as a cancel's
			// is; "not found" reads as an id unknown.
			if !inFlight {
				return res, nil
			}
			res.Error, res.Note = InFlight, "nothing done: not a dead letter but in flight (a relayer claimed it and its rail call may be under way); its outcome settles it, and a failure makes it a dead letter"
			return res, fmt.Errorf("%s %s: %w", action, id, store.ErrDeadLetterInFlight)
		}
		res.OutcomeUnknown = dl.OutcomeUnknown
		switch {
		case action == ActionReplay && shown != nil:
			res.Done, err = s.store.ReplayShown(ctx, s.cfg.Pool, id, *shown, operator, reason)
		case action == ActionReplay:
			// The dead letter read, whose outcome_unknown the answer
			// reports: not a failure that came after another operator's
			// replay of it meanwhile.
			res.Done, err = s.store.ReplayAsRead(ctx, s.cfg.Pool, *dl, operator, reason)
		case shown != nil:
			res.Done, err = s.store.AcknowledgeShown(ctx, s.cfg.Pool, id, *shown, operator, reason)
		default:
			res.Done, err = s.store.AcknowledgeAsRead(ctx, s.cfg.Pool, *dl, operator, reason)
		}
		if errors.Is(err, store.ErrDeadLetterChanged) {
			res.Error, res.Note = DeadLetterChanged, "nothing done: someone replayed or acknowledged this dead letter since it was read (it may have failed again); read it again before acting"
			return res, err
		}
		if action == ActionReplay && res.OutcomeUnknown {
			res.Note = attempts.OutcomeUnknownReplay
		}
	default:
		return res, fmt.Errorf("%w %q (want %s, %s or %s)", ErrUnknownAction, action, ActionReplay, ActionAcknowledge, ActionCancel)
	}
	if behind := schemaBehind(err); behind != nil {
		res.Error, res.Note = SchemaBehind, schemaBehindNote
		s.log.Error("admin: "+action+" refused: the schema is behind this build; run outbox migrate", "outbox_id", id, "by", operator, "err", err)
		return res, behind
	}
	if errors.Is(err, store.ErrCommitUnknown) {
		res.Error, res.Note = CommitUnknown, "it may have been done: the database connection broke after it was sent and the database could not tell; read the instruction's trail before acting on it again (a dead letter listed again may be a new failure)"
		return res, err
	}
	if errors.Is(err, store.ErrActionNotDone) {
		res.Error, res.Note = NotDone, "nothing done: the database connection broke before it committed, and the database shows it was not done; try again"
		return res, err
	}
	if err != nil || !res.Done {
		return res, err
	}
	// The overview's queue counts changed: the next read is fresh.
	s.overviewReads.Forget()
	if action == ActionCancel {
		s.log.Warn("admin: instruction cancelled", "outbox_id", id, "by", operator, "reason", reason)
	} else {
		s.log.Info("admin: dead letter "+action, "outbox_id", id, "by", operator, "reason", reason, "outcome_unknown", res.OutcomeUnknown)
	}
	return res, nil
}

// trail returns an instruction's attempts, oldest first: /trail/{outbox
// id} or /trail?instruction_id=.
func (s *Server) trail(w http.ResponseWriter, r *http.Request, _ Token) {
	after, limit, err := pageParams(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, BadRequest, err.Error())
		return
	}
	if r.URL.Query().Get("limit") == "" {
		limit = s.trailPageSize()
	}
	var trail []store.Attempt
	if idText := r.PathValue("id"); idText != "" {
		id, perr := uuid.FromString(idText)
		if perr != nil {
			writeError(w, http.StatusBadRequest, BadRequest, "not an outbox id")
			return
		}
		trail, err = s.store.TrailAfter(r.Context(), s.cfg.Pool, id, after, limit+1)
	} else if ins := r.URL.Query().Get("instruction_id"); ins != "" {
		trail, err = s.store.TrailByInstructionAfter(r.Context(), s.cfg.Pool, ins, after, limit+1)
	} else {
		writeError(w, http.StatusBadRequest, BadRequest, "an outbox id or ?instruction_id= is required")
		return
	}
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	trail, next := trailPageOf(trail, limit)
	writeJSON(w, http.StatusOK, map[string]any{"attempts": trail, "next": next})
}

// trailPageOf cuts rows, read with one more than limit, to a page, and
// gives the cursor of the next page ("" when the extra row was not there:
// the trail's last page links to nothing, not to an empty page).
func trailPageOf(rows []store.Attempt, limit int) ([]store.Attempt, string) {
	if rows == nil {
		rows = []store.Attempt{}
	}
	if len(rows) <= limit {
		return rows, ""
	}
	rows = rows[:limit]
	return rows, encodeCursor(attemptCursor(rows[limit-1]))
}

// trailPageSize is how many archive rows a trail's page holds, in the API
// (without ?limit=) and the console: a trail of up to that many comes
// whole, as before trails were paged.
func (s *Server) trailPageSize() int {
	if s.trailPage > 0 {
		return s.trailPage
	}
	return maxPageSize
}

// VerifyRunning is the code (409, in the body's "code") of the API's
// answer to an audit verify asked for while one runs on the same admin
// address: nothing was started.
const VerifyRunning = "VERIFY_RUNNING"

// verifyRun is an audit verify under way: who asked for it, and when.
type verifyRun struct {
	by    string
	since time.Time
}

// startVerify claims the admin address's one audit verify for who, or
// returns the one already under way (done is then nil). done may be
// called more than once: once the verify has read, and deferred, for a
// panic (the report is written at the pace its client reads it, and a
// client that reads none must not hold the verify). A verify holds a
// connection of its pool for as long as it reads the archive; without
// Config.AuditPool that is Pool, which a relayer in the same process
// shares for its claims and outcome writes: verifies without a bound,
// each asked for by a read-only auditor, would take every connection and
// stop the payments.
func (s *Server) startVerify(who string) (done func(), running verifyRun) {
	s.verifyMu.Lock()
	defer s.verifyMu.Unlock()
	if s.verifying != nil {
		return nil, *s.verifying
	}
	s.verifying = &verifyRun{by: who, since: time.Now()}
	var once sync.Once
	return func() {
		once.Do(func() {
			s.verifyMu.Lock()
			defer s.verifyMu.Unlock()
			s.verifying = nil
		})
	}, verifyRun{}
}

// verifyRefusal says why a verify was not started, for the console and
// the API.
func (v verifyRun) refusal() string {
	return fmt.Sprintf("An audit verify is already running on this admin address (asked for by %s at %s UTC): nothing was started; run it again when that one has ended (one at a time, as each holds a database connection while it reads the whole archive)",
		v.by, v.since.UTC().Format("2006-01-02 15:04:05"))
}

// verify runs audit verify (the ordering invariants unless
// ?unordered=true), on Config.AuditPool when set; one at a time
// (startVerify), a second one answered 409 with the code VerifyRunning.
func (s *Server) verify(w http.ResponseWriter, r *http.Request, who Token) {
	done, running := s.startVerify(who.Name)
	if done == nil {
		s.log.Warn("admin: verify refused: one is running", "token", who.Name, "running_for", running.by, "since", running.since)
		writeError(w, http.StatusConflict, VerifyRunning, running.refusal(),
			"started_by", running.by, "started_at", running.since.UTC().Format(time.RFC3339Nano))
		return
	}
	defer done()
	rep, err := s.store.Verify(r.Context(), s.auditPool(), store.VerifyOptions{Ordered: r.URL.Query().Get("unordered") != "true", Workers: s.verifyWorkers()})
	done()
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	violations := make([]string, len(rep.Violations))
	for i, v := range rep.Violations {
		violations[i] = v.String()
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"ok": rep.OK(), "instructions": rep.Instructions, "pending": rep.Pending, "in_flight": rep.InFlight,
		"dispatched": rep.Dispatched, "cancelled": rep.Cancelled, "dead_letters": rep.DeadLetters, "dispatched_twice": rep.DispatchedTwice,
		"attempts": rep.Attempts, "chained_rows": rep.Chained, "checkpoints": rep.Checkpoints, "violations": violations,
		"standby": rep.Standby, "seconds": rep.Duration.Seconds(),
	})
}

// CheckOperatorAction returns an error wrapping store.ErrOperatorAction
// (attempts.ErrOperatorAction) when an operator action (a replay, an
// acknowledgement, a cancel, a pause, a resume) as operator for reason
// would be refused for its input: no name or no reason, a name holding
// "(database role", a control or format character in either
// (payment.ControlRune), or a name or reason past its bound
// (attempts.MaxOperatorNameBytes, attempts.MaxReasonBytes). It is the
// store's own check, which an action
// makes only once it acts, after its instruction was looked up; made
// first, bad input is answered as such (400, exit status 2) whatever the
// id names.
func CheckOperatorAction(operator, reason string) error {
	return store.CheckOperator(operator, reason)
}
