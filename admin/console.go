package admin

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gofrs/uuid/v5"

	"github.com/ledgerline/outbox/internal/store"
)

// The operations console: the API's views as HTML pages, readable without
// JavaScript, behind a sign-in that turns a token into a session cookie
// (HttpOnly, SameSite=Strict). Every form that changes something carries
// the session's CSRF token; the sign-in, before there is a session, is
// refused from another origin (signinOrigin).

//go:embed console
var consoleFiles embed.FS

// sessionTTL is how long a console session lasts.
const sessionTTL = 12 * time.Hour

// SessionIdleTimeout is how long a console session lasts unused: each
// page or form it opens keeps it for this long again, up to its 12 h. A
// console left signed in on an unattended machine would otherwise act
// as its operator for the rest of the 12 h.
const SessionIdleTimeout = 30 * time.Minute

// sessionCookie names the console's session cookie.
const sessionCookie = "outbox_session"

// session is a signed-in console user.
type session struct {
	who     Token
	csrf    string
	expires time.Time // sessionTTL after the sign-in
	used    time.Time // its last page or form (SessionIdleTimeout)
}

// ended says whether s has ended at now: its 12 h are up, or it has been
// unused for SessionIdleTimeout.
func (s *session) ended(now time.Time) bool {
	return now.After(s.expires) || !now.Before(s.used.Add(SessionIdleTimeout))
}

// sessions holds the console's sessions in memory: a restart signs
// everyone out, and several admin processes behind one address need
// sticky sessions.
type sessions struct {
	mu sync.Mutex
	m  map[string]*session
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}

// create opens a session for who at now, forgetting the ended ones.
func (ss *sessions) create(who Token, now time.Time) (id string, s *session) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.m == nil {
		ss.m = map[string]*session{}
	}
	for k, v := range ss.m {
		if v.ended(now) {
			delete(ss.m, k)
		}
	}
	id = randomHex(32)
	s = &session{who: who, csrf: randomHex(32), expires: now.Add(sessionTTL), used: now}
	ss.m[id] = s
	return id, s
}

// get returns the session id names if it has not ended at now, and
// with use marks it used then; an ended one is forgotten.
func (ss *sessions) get(id string, now time.Time, use bool) *session {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	s := ss.m[id]
	if s == nil {
		return nil
	}
	if s.ended(now) {
		delete(ss.m, id)
		return nil
	}
	if use {
		s.used = now
	}
	return s
}

func (ss *sessions) delete(id string) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	delete(ss.m, id)
}

var consoleTemplates = template.Must(template.New("").Funcs(template.FuncMap{
	"since": func(t time.Time) string { return time.Since(t).Round(time.Second).String() },
	"ts":    func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05.000") },
	"tsp": func(t *time.Time) string {
		if t == nil {
			return ""
		}
		return t.UTC().Format("2006-01-02 15:04:05.000")
	},
	"str": func(s *string) string {
		if s == nil {
			return ""
		}
		return *s
	},
	"pct": func(f float64) string { return fmt.Sprintf("%.1f%%", f*100) },
	"seconds": func(f float64) string {
		return time.Duration(f * float64(time.Second)).Round(time.Second).String()
	},
	"lower": strings.ToLower,
	// words is a state as its badge says it: the raw name (the API's
	// value, kept in the badge's title and class) reads as code.
	"words": stateWords,
	// prev is the sequence id before n: what a queued instruction waits
	// on (with ordering on, the one before it settles first).
	"prev": func(n int64) int64 { return n - 1 },
	// at is the list's cursor of a page that starts with dead letter d:
	// just before it (a microsecond earlier, the failure times' precision,
	// and the greatest id), whatever page of the list holds it.
	"at": func(d store.DeadLetter) string {
		return encodeCursor(store.Cursor{At: d.FailedAt.Add(-time.Microsecond), ID: uuid.Max})
	},
	// micros is a time as the dead letters' forms carry it back.
	"micros": func(t time.Time) int64 { return t.UnixMicro() },
	"query": func(kv ...string) template.URL {
		v := url.Values{}
		for i := 0; i+1 < len(kv); i += 2 {
			if kv[i+1] != "" {
				v.Set(kv[i], kv[i+1])
			}
		}
		return template.URL(v.Encode())
	},
}).ParseFS(consoleFiles, "console/*.html"))

// stateWords says a queued instruction's or a participant's state
// (store.Queued.State, store.ParticipantView.State) in an operator's
// words; the page's next cell says until when, since when or behind
// what. The states that read as words already ("due", "queued",
// "clear") and any unknown one are shown as they are.
func stateWords(state string) string {
	switch state {
	case "retry_wait":
		return "waiting to retry"
	case "in_flight":
		return "in flight"
	case "stuck":
		return "stuck: lease ended"
	}
	return state
}

// errBadState is the instructions page's answer to an unknown state.
var errBadState = errors.New("state must be pending or in_flight")

// page is what every console template gets.
type page struct {
	Title    string
	Nav      string
	Who      Token
	Operator bool
	CSRF     string
	Refresh  int // seconds; 0: none
	// RefreshURL is where the refresh goes ("": this page), for a page
	// that answers a form.
	RefreshURL string
	Error      string
	Notice     string // what an action did
	Data       any
	// Standby says the database is a read-only standby: the page says so
	// and shows no operator's form, which could only fail there.
	Standby bool
	// PrimaryConsole is Config.PrimaryConsole, linked from the standby's
	// line.
	PrimaryConsole string
}

// Acts says the page shows the operator's forms (replay, acknowledge,
// cancel, pause, resume): to an operator, on a database that can take
// them.
func (p *page) Acts() bool { return p.Operator && !p.Standby }

// mountConsole adds the console's routes to mux.
func (s *Server) mountConsole(mux *http.ServeMux) {
	static, _ := fs.Sub(consoleFiles, "console/static") // the directory is embedded
	mux.Handle("GET /console/static/", http.StripPrefix("/console/static/", http.FileServerFS(static)))
	mux.HandleFunc("GET /console/signin", s.signinForm)
	mux.HandleFunc("POST /console/signin", s.signin)
	mux.Handle("POST /console/signout", s.console(RoleAuditor, true, s.signout))
	mux.Handle("GET /console/{$}", s.console(RoleAuditor, false, s.pageOverview))
	mux.Handle("GET /console/instructions", s.console(RoleAuditor, false, s.pageInstructions))
	mux.Handle("POST /console/instructions/{id}/cancel", s.console(RoleOperator, true, s.pageCancel))
	mux.Handle("GET /console/participant", s.console(RoleAuditor, false, s.pageParticipant))
	mux.Handle("GET /console/dead-letters", s.console(RoleAuditor, false, s.pageDeadLetters))
	mux.Handle("POST /console/dead-letters/{id}/{action}", s.console(RoleOperator, true, s.pageAct))
	mux.Handle("GET /console/trail", s.console(RoleAuditor, false, s.pageTrail))
	mux.Handle("POST /console/verify", s.console(RoleAuditor, true, s.pageVerify))
	mux.Handle("GET /console/rails", s.console(RoleOperator, false, s.pageRails))
	mux.Handle("POST /console/rails/{action}", s.console(RoleOperator, true, s.pagePause))
	mux.HandleFunc("GET /console", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/console/", http.StatusSeeOther)
	})
}

// console wraps a console page: no session → the sign-in page; a role too
// weak → 403; a form without the session's CSRF token → 403.
func (s *Server) console(need Role, form bool, h func(w http.ResponseWriter, r *http.Request, p *page)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var sess *session
		if c, err := r.Cookie(sessionCookie); err == nil {
			// A page refreshing itself is not its user: it does not
			// keep the session open (SessionIdleTimeout).
			sess = s.sessions.get(c.Value, s.now(), r.URL.Query().Get(autoRefresh) == "")
		}
		if sess == nil {
			if form {
				s.log.Warn("admin: refused request", "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr, "reason", "no session")
				http.Error(w, "sign in first", http.StatusUnauthorized)
				return
			}
			http.Redirect(w, r, "/console/signin", http.StatusSeeOther)
			return
		}
		if need == RoleOperator && sess.who.Role != RoleOperator {
			s.log.Warn("admin: refused request", "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr,
				"token", sess.who.Name, "reason", "needs the operator role")
			http.Error(w, "this needs an operator credential", http.StatusForbidden)
			return
		}
		if form && subtle.ConstantTimeCompare([]byte(r.PostFormValue("csrf")), []byte(sess.csrf)) != 1 {
			s.log.Warn("admin: refused request", "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr,
				"token", sess.who.Name, "reason", "missing or wrong CSRF token")
			http.Error(w, "the form is stale or forged: reload the page", http.StatusForbidden)
			return
		}
		release, ok := s.takeSlot(w, r)
		if !ok {
			http.Error(w, "The admin address is busy: "+busyWhy+".", http.StatusServiceUnavailable)
			return
		}
		sw := &slotWriter{ResponseWriter: w, release: release}
		defer sw.free()
		w = sw
		pageHeaders(w)
		h(w, r, &page{Who: sess.who, Operator: sess.who.Role == RoleOperator, CSRF: sess.csrf, Standby: s.onStandby(r.Context()),
			PrimaryConsole: s.cfg.PrimaryConsole})
	})
}

// pageHeaders sets what every console page answers with: not cached, not
// framed by another site (clickjacking), nothing loaded or posted
// elsewhere, its type not guessed.
func pageHeaders(w http.ResponseWriter) {
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("X-Frame-Options", "DENY")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; form-action 'self'; frame-ancestors 'none'")
}

// signinOrigin refuses a browser's cross-origin sign-in (Sec-Fetch-Site,
// else Origin against Host). There is no session yet whose CSRF token the
// form could carry, and without this another site could sign a visitor in
// with its own token (login CSRF), so that what the visitor then does is
// recorded under that token's name.
var signinOrigin = http.NewCrossOriginProtection()

// autoRefresh is the query parameter a page's own refresh adds to its
// URL: the request is the page refreshing itself, not its user, and does
// not keep the session from its idle timeout.
const autoRefresh = "auto"

// render writes a page with its template. A page that refreshes itself
// does so to its RefreshURL (itself by default) marked autoRefresh.
func (s *Server) render(w http.ResponseWriter, r *http.Request, name string, p *page) {
	if p.Refresh > 0 {
		to := p.RefreshURL
		if to == "" {
			to = r.URL.RequestURI()
		}
		if u, err := url.Parse(to); err == nil {
			q := u.Query()
			q.Set(autoRefresh, "1")
			u.RawQuery = q.Encode()
			p.RefreshURL = u.RequestURI()
		}
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if err := consoleTemplates.ExecuteTemplate(w, name, p); err != nil {
		s.log.Error("admin: console template", "page", name, "path", r.URL.Path, "err", err)
	}
}

func (s *Server) signinForm(w http.ResponseWriter, r *http.Request) {
	pageHeaders(w)
	s.render(w, r, "signin.html", &page{Title: "Sign in"})
}

func (s *Server) signin(w http.ResponseWriter, r *http.Request) {
	pageHeaders(w)
	if err := signinOrigin.Check(r); err != nil {
		s.log.Warn("admin: refused request", "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr,
			"reason", "cross-origin sign-in", "origin", r.Header.Get("Origin"), "sec_fetch_site", r.Header.Get("Sec-Fetch-Site"))
		http.Error(w, "sign in from the console's own sign-in page", http.StatusForbidden)
		return
	}
	if !s.refuseThrottled(w, r) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.WriteHeader(http.StatusTooManyRequests)
		s.render(w, r, "signin.html", &page{Title: "Sign in", Error: "Too many wrong tokens from this address: wait a minute, then sign in again."})
		return
	}
	who, ok := match(s.cfg.Tokens, r.PostFormValue("token"))
	if !ok {
		s.failedAuth(r)
		s.log.Warn("admin: refused request", "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr, "reason", "unknown credential")
		// Before the status: headers set after it are not sent.
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.WriteHeader(http.StatusUnauthorized)
		s.render(w, r, "signin.html", &page{Title: "Sign in", Error: "That token is not valid."})
		return
	}
	// The session this browser had, if any, ends: its cookie is replaced
	// by the new one, and a copy of it must not stay signed in unseen.
	if c, err := r.Cookie(sessionCookie); err == nil {
		s.sessions.delete(c.Value)
	}
	id, _ := s.sessions.create(who, s.now())
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: id, Path: "/console", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: s.secureCookie(r), MaxAge: int(sessionTTL.Seconds())})
	s.log.Info("admin: console sign-in", "token", who.Name, "role", who.Role, "remote", r.RemoteAddr)
	http.Redirect(w, r, "/console/", http.StatusSeeOther)
}

// secureCookie says whether the session cookie is Secure: always with
// Config.SecureCookie, else when r came over TLS to this process.
func (s *Server) secureCookie(r *http.Request) bool {
	return s.cfg.SecureCookie || r.TLS != nil
}

func (s *Server) signout(w http.ResponseWriter, r *http.Request, _ *page) {
	if c, err := r.Cookie(sessionCookie); err == nil {
		s.sessions.delete(c.Value)
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: "/console", HttpOnly: true, SameSite: http.SameSiteStrictMode,
		Secure: s.secureCookie(r), MaxAge: -1})
	http.Redirect(w, r, "/console/signin", http.StatusSeeOther)
}

func (s *Server) pageOverview(w http.ResponseWriter, r *http.Request, p *page) {
	ov, err := s.Overview(r.Context())
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	p.Title, p.Nav, p.Refresh, p.Data = "Overview", "overview", 5, overviewPage{Overview: ov, DegradedAfterSecs: s.cfg.DegradedAfter.Seconds(),
		VerifyOnPrimary: s.cfg.AuditPool == nil && !p.Standby}
	s.render(w, r, "overview.html", p)
}

// overviewPage is the overview page's data: the overview, and the oldest
// due age /readyz calls degraded (Config.DegradedAfter), past which the
// page shows that figure as bad: the page and the probe agree.
type overviewPage struct {
	Overview
	DegradedAfterSecs float64
	// VerifyOnPrimary says audit verify runs on the primary (no
	// Config.AuditPool, and Pool is not a standby), where its snapshot
	// holds back vacuum: the button says so before it is pressed.
	VerifyOnPrimary bool
}

// instructionsPage is the instructions page's data.
type instructionsPage struct {
	State, Participant, Rail string
	Items                    []store.Queued
	Next                     string
	// Paused are the pauses in force: a pending instruction of a paused
	// rail is marked, as it is not claimed whatever its state says.
	Paused []store.RailPause
}

// HeldBy returns the pause that holds rail's pending instructions, if any.
func (d instructionsPage) HeldBy(rail string) *store.RailPause { return pauseOf(d.Paused, rail) }

func (s *Server) pageInstructions(w http.ResponseWriter, r *http.Request, p *page) {
	q := r.URL.Query()
	d := instructionsPage{State: q.Get("state"), Participant: q.Get("participant"), Rail: q.Get("rail")}
	after, limit, err := pageParams(r)
	if err == nil && d.State != "" && d.State != "pending" && d.State != "in_flight" {
		err = errBadState
	}
	if err != nil {
		p.Error = err.Error()
	} else {
		items, err := s.store.ListQueued(r.Context(), s.cfg.Pool, store.QueuedFilter{InFlight: d.State == "in_flight",
			Participant: d.Participant, Rail: d.Rail, After: after, Limit: limit})
		if err != nil {
			s.internalError(w, r, err)
			return
		}
		pg := pageOf(items, limit, queuedCursor)
		d.Items, d.Next = pg.Items, pg.Next
		if d.Paused, err = s.store.RailPauses(r.Context(), s.cfg.Pool); err != nil {
			s.internalError(w, r, err)
			return
		}
	}
	p.Title, p.Nav, p.Data = "Instructions", "instructions", d
	s.render(w, r, "instructions.html", p)
}

// pageCancel cancels a pending instruction (the reason in the form) and
// shows the pending instructions again, with what was done.
func (s *Server) pageCancel(w http.ResponseWriter, r *http.Request, p *page) {
	id, err := uuid.FromString(r.PathValue("id"))
	if err != nil {
		http.Error(w, "not an outbox id", http.StatusNotFound)
		return
	}
	if reason := strings.TrimSpace(r.PostFormValue("reason")); reason == "" {
		p.Error = "A reason is required: it is recorded in the archive with your name."
	} else {
		res, err := s.Act(r.Context(), id, p.Who.Name, ActionCancel, reason)
		switch {
		case errors.Is(err, ErrReadOnlyStandby):
			p.Error = standbyRefusal
		case errors.Is(err, ErrSchemaBehind):
			p.Error = schemaBehindRefusal
		case errors.Is(err, store.ErrOperatorAction):
			p.Error = operatorRefusal(err)
		case errors.Is(err, store.ErrRailMayStillAct):
			p.Error = "Not cancelled, nothing was done: a relayer's stop cut this instruction's rail call off (outcome unknown), and the rail may still be acting on it until its claim's lease ends."
			if res.RetryAfter != nil {
				p.Error += " Try the cancel again after " + res.RetryAfter.UTC().Format("2006-01-02 15:04:05.000 MST") + "."
			}
		case errors.Is(err, store.ErrCancelInFlight):
			p.Error = "Not cancelled, nothing was done: this instruction is in flight (a relayer claimed it and its rail call may be under way). Its outcome settles it; if it comes back to pending, it can be cancelled then."
		case errors.Is(err, store.ErrActionNotDone):
			p.Error = actionNotDone
		case errors.Is(err, store.ErrCommitUnknown):
			s.commitUnknown(w, r, err, "Read the instruction's trail (/console/trail?id="+id.String()+") before acting on it again.")
			return
		case err != nil:
			s.internalError(w, r, err)
			return
		case res.Done:
			p.Notice = "Cancelled " + id.String() + s.instructionOf(r.Context(), id) + " as " + p.Who.Name + ": it will not be sent."
		default:
			p.Error = "That instruction is no longer pending: already settled."
		}
	}
	s.pageInstructions(w, r, p)
}

// actionNotDone is the console's notice of an action whose database
// connection broke before it committed, the database showing it not done
// (store.ErrActionNotDone).
const actionNotDone = "Nothing was done: the database connection broke before the action committed, and the database shows it was not done. Try again."

// commitUnknown answers an action whose database connection broke once it
// was sent and whose outcome the database could not tell
// (store.ErrCommitUnknown): it may have been done, and look says where to
// look before acting again. A page of its own, read from nowhere: the
// database may be out of reach. As the internal error it was, it read as
// a failure, and an operator who acted again could undo what was done (a
// second resume ends a pause someone made meanwhile).
func (s *Server) commitUnknown(w http.ResponseWriter, r *http.Request, err error, look string) {
	s.log.Error("admin: request failed, outcome unknown", "method", r.Method, "path", r.URL.Path, "err", err)
	http.Error(w, "It may have been done: the database connection broke after the action was sent, and the database could not tell whether it committed. "+look, http.StatusInternalServerError)
}

// schemaBehindRefusal is the console's notice of an action refused with
// ErrSchemaBehind.
const schemaBehindRefusal = "Nothing was done: the database's schema is older than this build of the outbox (a function this action needs is not there). Run outbox migrate, then try again."

// operatorRefusal words an action refused with store.ErrOperatorAction
// (a name or a reason it does not archive) for the console.
func operatorRefusal(err error) string {
	return "Nothing was done: " + strings.TrimPrefix(err.Error(), store.ErrOperatorAction.Error()+": ") + "."
}

// instructionOf names the instruction of an outbox id from its trail, as
// " (instruction ... of participant ...)", for a notice; "" when the trail
// cannot be read (the action is done: its notice still says so).
func (s *Server) instructionOf(ctx context.Context, id uuid.UUID) string {
	// Its first row: every row of an outbox id names the same instruction,
	// and its whole trail may be thousands.
	atts, err := s.store.TrailAfter(ctx, s.cfg.Pool, id, store.Cursor{}, 1)
	if err != nil || len(atts) == 0 {
		return ""
	}
	a := atts[0]
	return " (instruction " + a.InstructionID + " of participant " + a.ParticipantID + ")"
}

// participantPage is the participant page's data: the view, and whether
// the page refreshes itself (?watch=1). It does only when asked: a refresh
// wipes an id being typed into its box.
type participantPage struct {
	store.ParticipantView
	Watch bool
}

func (s *Server) pageParticipant(w http.ResponseWriter, r *http.Request, p *page) {
	p.Title, p.Nav = "Participant", "participant"
	if id := r.URL.Query().Get("id"); id != "" {
		v, err := s.participantView(r.Context(), id)
		if err != nil {
			s.internalError(w, r, err)
			return
		}
		d := participantPage{ParticipantView: v, Watch: r.URL.Query().Get("watch") != ""}
		if d.Watch {
			p.Refresh = 5
		}
		p.Data = d
	}
	s.render(w, r, "participant.html", p)
}

// deadLettersPage is the dead letters page's data.
type deadLettersPage struct {
	All bool
	// Participant filters the list ("": everyone's); the forms carry it
	// back, so that the page that answers an action is the same list.
	Participant string
	Items       []store.DeadLetter
	Next        string
	// After says the list is a later page (from ?after=), which links
	// to the first.
	After bool
	Done  *ActionResult // the action just taken, if any
	// DoneOf is the dead letter Done acted on, as it was shown: its
	// notice names the instruction and participant, not only the outbox id.
	DoneOf *store.DeadLetter
	// Total is how many dead letters the filter matches, all pages
	// together, up to DeadLetterCountBound; More says there are more than
	// that. Counted says they were counted (not on a page refused for
	// its parameters, which shows no list).
	Total         int64
	More, Counted bool
}

// DeadLetterCountBound is as far as the dead letters' counts go (the
// console's list, the API's total): the acknowledged ones stay until their
// archive month is detached, and counting years of them on every view
// would read them all.
const DeadLetterCountBound = 10000

// countDeadLetters counts the dead letters of a filter up to
// DeadLetterCountBound; more says there are more than that.
func (s *Server) countDeadLetters(ctx context.Context, all bool, participant string) (n int64, more bool, err error) {
	n, err = s.store.CountDeadLetters(ctx, s.cfg.Pool, all, participant, DeadLetterCountBound+1)
	return min(n, DeadLetterCountBound), n > DeadLetterCountBound, err
}

// countPage sets d's Total, More and Counted.
func (s *Server) countPage(r *http.Request, d *deadLettersPage) (err error) {
	d.Total, d.More, err = s.countDeadLetters(r.Context(), d.All, d.Participant)
	d.Counted = err == nil
	return err
}

func (s *Server) pageDeadLetters(w http.ResponseWriter, r *http.Request, p *page) {
	after, limit, err := pageParams(r)
	if err != nil {
		p.Error = err.Error()
	}
	d := deadLettersPage{All: r.URL.Query().Get("all") == "true", Participant: r.URL.Query().Get("participant")}
	if err == nil {
		items, err := s.store.DeadLettersOf(r.Context(), s.cfg.Pool, d.All, d.Participant, after, limit)
		if err != nil {
			s.internalError(w, r, err)
			return
		}
		pg := pageOf(items, limit, deadLetterCursor)
		d.Items, d.Next, d.After = pg.Items, pg.Next, after != store.Cursor{}
		if err := s.countPage(r, &d); err != nil {
			s.internalError(w, r, err)
			return
		}
	}
	p.Title, p.Nav, p.Data = "Dead letters", "dead", d
	s.render(w, r, "deadletters.html", p)
}

// pageAct replays or acknowledges a dead letter from the console's form,
// as the session's token name, for the form's reason.
func (s *Server) pageAct(w http.ResponseWriter, r *http.Request, p *page) {
	action := r.PathValue("action")
	id, err := uuid.FromString(r.PathValue("id"))
	if err != nil || (action != ActionReplay && action != ActionAcknowledge) {
		http.Error(w, "no such action", http.StatusNotFound)
		return
	}
	reason := strings.TrimSpace(r.PostFormValue("reason"))
	// The failure the form was shown with: the action is for that one
	// only, not for a later failure under the same outbox id, nor for one
	// acknowledged or replayed since by someone else.
	failed, ferr := strconv.ParseInt(r.PostFormValue("failed"), 10, 64)
	shown := time.UnixMicro(failed)
	d := deadLettersPage{Participant: r.PostFormValue("participant")}
	// Checked before the dead letter is read: an id that is no open dead
	// letter read as "already replayed" for a reason never accepted.
	refused := CheckOperatorAction(p.Who.Name, reason)
	switch {
	case ferr != nil:
		p.Error = "The form does not say which failure it was shown with: reload the page."
	case reason == "":
		p.Error = "A reason is required: it is recorded in the archive with your name."
	case refused != nil:
		p.Error = operatorRefusal(refused)
	default:
		of, err := s.store.DeadLetter(r.Context(), s.cfg.Pool, id)
		if err != nil {
			s.internalError(w, r, err)
			return
		}
		res, err := s.takeAction(r.Context(), id, &shown, p.Who.Name, action, reason)
		if errors.Is(err, ErrReadOnlyStandby) {
			p.Error = standbyRefusal
			break
		}
		if errors.Is(err, ErrSchemaBehind) {
			p.Error = schemaBehindRefusal
			break
		}
		if errors.Is(err, store.ErrOperatorAction) {
			p.Error = operatorRefusal(err)
			break
		}
		if errors.Is(err, store.ErrDeadLetterChanged) {
			p.Error = "That dead letter changed since this page was shown: someone replayed or acknowledged it (it may have failed again). Nothing was done; look at it again below before you act."
			break
		}
		if errors.Is(err, store.ErrDeadLetterInFlight) {
			p.Error = "That dead letter was already replayed and is in flight now: a relayer claimed it and its rail call may be under way. Nothing was done; its outcome settles it, and a failure makes it a dead letter again."
			break
		}
		if errors.Is(err, store.ErrActionNotDone) {
			p.Error = actionNotDone
			break
		}
		if errors.Is(err, store.ErrCommitUnknown) {
			s.commitUnknown(w, r, err, "Read the instruction's trail (/console/trail?id="+id.String()+") before acting on it again: a dead letter listed again may be a new failure.")
			return
		}
		if err != nil {
			s.internalError(w, r, err)
			return
		}
		if !res.Done {
			p.Error = "That dead letter was already replayed or acknowledged."
		}
		d.Done, d.DoneOf = &res, of
	}
	items, err := s.store.DeadLettersOf(r.Context(), s.cfg.Pool, false, d.Participant, store.Cursor{}, defaultPageSize)
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	// The first page as the list shows it, with its link to the next: a
	// full page without one reads as every open dead letter.
	pg := pageOf(items, defaultPageSize, deadLetterCursor)
	d.Items, d.Next = pg.Items, pg.Next
	if err := s.countPage(r, &d); err != nil {
		s.internalError(w, r, err)
		return
	}
	p.Title, p.Nav, p.Data = "Dead letters", "dead", d
	s.render(w, r, "deadletters.html", p)
}

// trailPage is the trail page's data.
type trailPage struct {
	ID, InstructionID string
	Attempts          []store.Attempt
	Searched          bool
	// After is this page's cursor ("" on the first), Next the cursor of
	// the later attempts ("" when there are none): a trail is shown a page
	// of archive rows at a time.
	After, Next string
	// Instructions is how many outbox ids the attempts are of: more than
	// one for an instruction id of several tenants (or, enqueued before
	// migration 030 refused it, under several keys), whose trails the
	// timeline interleaves (each event then names its outbox id and
	// tenant).
	Instructions int
	// DeadLetters are those of the attempts' instructions that are dead
	// letters now, which the page links to: from a failure's history to
	// where it is replayed or acknowledged.
	DeadLetters []store.DeadLetter
}

func (s *Server) pageTrail(w http.ResponseWriter, r *http.Request, p *page) {
	q := r.URL.Query()
	d := trailPage{ID: q.Get("id"), InstructionID: q.Get("instruction_id"), After: q.Get("after")}
	after, err := decodeCursor(d.After)
	if err != nil {
		p.Error = "That link's position in the trail is not valid: start from its first page."
		d.ID, d.InstructionID, d.After = "", "", ""
	}
	limit := s.trailPageSize()
	switch {
	case d.ID != "":
		id, perr := uuid.FromString(d.ID)
		if perr != nil {
			p.Error = "That is not an outbox id."
			break
		}
		d.Searched = true
		d.Attempts, err = s.store.TrailAfter(r.Context(), s.cfg.Pool, id, after, limit+1)
	case d.InstructionID != "":
		d.Searched = true
		d.Attempts, err = s.store.TrailByInstructionAfter(r.Context(), s.cfg.Pool, d.InstructionID, after, limit+1)
	}
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	if d.Searched {
		d.Attempts, d.Next = trailPageOf(d.Attempts, limit)
	}
	ids := map[uuid.UUID]bool{}
	for _, a := range d.Attempts {
		if ids[a.OutboxID] {
			continue
		}
		ids[a.OutboxID] = true
		dl, err := s.store.DeadLetter(r.Context(), s.cfg.Pool, a.OutboxID)
		if err != nil {
			s.internalError(w, r, err)
			return
		}
		if dl != nil {
			d.DeadLetters = append(d.DeadLetters, *dl)
		}
	}
	d.Instructions = len(ids)
	p.Title, p.Nav, p.Data = "Trail", "trail", d
	s.render(w, r, "trail.html", p)
}

func (s *Server) pageVerify(w http.ResponseWriter, r *http.Request, p *page) {
	done, running := s.startVerify(p.Who.Name)
	if done == nil {
		s.log.Warn("admin: verify refused: one is running", "token", p.Who.Name, "running_for", running.by, "since", running.since)
		p.Error, p.RefreshURL = running.refusal()+".", "/console/"
		s.pageOverview(w, r, p)
		return
	}
	defer done()
	rep, err := s.store.Verify(r.Context(), s.auditPool(), store.VerifyOptions{Ordered: r.PostFormValue("unordered") == "", Workers: s.verifyWorkers()})
	done()
	if err != nil {
		s.internalError(w, r, err)
		return
	}
	p.Title, p.Nav, p.Data = "Verify", "overview", rep
	s.render(w, r, "verify.html", p)
}
