// Package admin is the relayer's admin address: health probes (/healthz,
// /readyz), a JSON API for operations (queue overview, instructions by
// participant, rail and state, cancelling a pending one, a participant's
// view of why it is not moving, dead letters with replay and acknowledge,
// pausing and resuming rails, attempt trails, audit verify on demand) and
// the operations console (/console/: the same views as HTML pages).
//
// Every API request needs a credential (Authorization: Bearer SECRET) of
// one of two roles: auditor (read) or operator (also replay, acknowledge,
// cancel, pause and resume); the console signs in with the same
// credentials. Secrets are compared in constant time and never logged; a
// refused request is logged without its credential, and a source that
// sends too many wrong secrets is throttled (AuthFailureLimit). Console
// sessions end after 12 h, or SessionIdleTimeout unused. Operators' actions
// are archived with the token's name as who acted and a required reason.
package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/engine"
	"github.com/ledgerline/outbox/internal/sharedread"
	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/rails"
)

// DefaultDegradedAfter is the oldest due instruction's age from which
// /readyz answers degraded.
const DefaultDegradedAfter = time.Minute

// DefaultHorizonDegradedAfter is how long a transaction may hold the
// database's vacuum horizon before /readyz answers degraded: every claim,
// outcome and enqueue meanwhile leaves row versions no vacuum can remove,
// and the relayers slow down the longer it lasts (docs/operations.md, "A
// held vacuum horizon").
const DefaultHorizonDegradedAfter = 5 * time.Minute

// ErrInvalidConfig is returned by New for a configuration it cannot use.
var ErrInvalidConfig = errors.New("admin: invalid config")

// Config configures a Server.
type Config struct {
	// Pool is the database; required. Give the server a pool of its own
	// rather than a relayer's: its requests (a verify, a page waiting for
	// a lock) would otherwise hold the connections the relayer claims and
	// records outcomes with (`outbox relay` does).
	Pool *pgxpool.Pool
	// AuditPool, if set, is where audit verify runs (the console's and the
	// API's): a hot standby of Pool's database. Verify reads the whole
	// archive in one snapshot, which on the primary holds back vacuum for
	// as long as it runs (7.4 s at 300,000 instructions on the benchmark
	// machine; docs/operations.md, "A held vacuum horizon"). Verify reads
	// it with up to attempts.DefaultVerifyWorkers connections sharing one
	// snapshot; on Pool, whose connections serve the probes and pages
	// too, with one. Nil: Pool.
	AuditPool *pgxpool.Pool
	// Schema holding the outbox tables; "" means the default.
	Schema string
	// Tokens are the credentials the API accepts. Without any, the API
	// is not served (the probes are).
	Tokens []Token
	// Rails, if set, reports its rails' breaker states (overview, readyz).
	Rails *rails.Set
	// Relayer, if set, is this process's relayer, whose listener and
	// running state /readyz checks.
	Relayer *engine.Relayer
	// DegradedAfter is the oldest due age that makes /readyz degraded
	// (0: DefaultDegradedAfter; negative: refused).
	DegradedAfter time.Duration
	// HorizonDegradedAfter is how long a transaction may hold back vacuum
	// (store.HorizonHolder) before /readyz is degraded (0:
	// DefaultHorizonDegradedAfter; negative: refused). An inactive replication slot holding
	// it makes /readyz degraded at once: its standby is gone, and the slot
	// holds the horizon until it is dropped.
	HorizonDegradedAfter time.Duration
	// SecureCookie marks the console's session cookie Secure on every
	// sign-in. Set it when a TLS-terminating proxy serves the console:
	// this process then sees plain HTTP, and without it the cookie is
	// Secure only on requests that came to this process over TLS, so the
	// browser would also send the session to the host's http:// address.
	SecureCookie bool
	// PrimaryConsole, if set, is the console of an admin address whose
	// database is the primary (an absolute http or https URL, e.g.
	// "https://outbox-admin.internal/console/"): a console on a standby
	// links to it where it says that actions are taken on the primary.
	PrimaryConsole string
	// MaxConcurrentRequests bounds how many API and console requests are
	// served at once (0: DefaultMaxConcurrentRequests); one that finds
	// them all busy waits up to BusyWait, then is answered 503. Each
	// holds a connection of Pool while it reads, and Pool may be a
	// relayer's, whose claims and outcome writes need the others.
	MaxConcurrentRequests int
	// TrustedProxies are the addresses of proxies in front of the admin
	// address whose X-Forwarded-For is believed: a request from one of
	// them counts its failed authentications (AuthFailureLimit) against
	// the client the proxy names, the rightmost address of the header
	// not itself in TrustedProxies (an entry may carry its port:
	// ip:port, [v6]:port). Nil: none; every request counts
	// against the address it came from (behind a proxy, the proxy's),
	// as anyone can send the header.
	TrustedProxies []netip.Prefix
	// Logger receives refused requests and operator actions (nil: none).
	Logger *slog.Logger
}

// DefaultMaxConcurrentRequests is Config.MaxConcurrentRequests' default:
// one fewer than the connections of the admin pool `outbox relay` opens
// (4), which leaves one for probes and scrapes, and a few of a relayer's
// pool where a program shares it; enough for a verify beside the
// console's pages.
const DefaultMaxConcurrentRequests = 3

// BusyWait is how long an API or console request waits for one of the
// Config.MaxConcurrentRequests before it is answered 503 (code Busy).
const BusyWait = 5 * time.Second

// Busy is the code (503, in the body's "code") of the API's answer to a
// request that found Config.MaxConcurrentRequests busy for BusyWait:
// nothing was read or done; try again (Retry-After).
const Busy = "BUSY"

// Server serves the admin address. Create it with New; mount Handler.
type Server struct {
	cfg      Config
	store    *store.Store
	log      *slog.Logger
	stopping atomic.Bool
	sessions sessions // the console's
	// readyLogged is the detail /readyz last logged, as its logKey
	// (logReadiness).
	readyMu     sync.Mutex
	readyLogged string
	// overviewReads shares the overview's database reads among callers.
	overviewReads *sharedread.Value[overviewReads]
	// readiness shares the readiness checks' database reads among the
	// callers that come while they are under way (Readiness).
	readiness *sharedread.Value[readinessReads]
	// standby says whether Pool's database is a standby (onStandby).
	standby *sharedread.Value[bool]
	// slots holds a token per request served (Config.MaxConcurrentRequests).
	slots chan struct{}
	// verifyMu guards verifying, the audit verify under way (startVerify).
	verifyMu  sync.Mutex
	verifying *verifyRun
	// guesses counts failed authentications per source (throttle.go).
	guesses guesses
	// now is the clock of sessions and throttles (time.Now; tests set
	// their own).
	now func() time.Time
	// trailPage is how many archive rows a trail's page holds (0:
	// maxPageSize); tests make it small.
	trailPage int
}

// New validates cfg and returns a Server.
func New(cfg Config) (*Server, error) {
	if cfg.Pool == nil {
		return nil, fmt.Errorf("%w: nil pool", ErrInvalidConfig)
	}
	st, err := store.New(cfg.Schema)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if err := CheckTokens(cfg.Tokens); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if cfg.PrimaryConsole != "" {
		u, err := url.Parse(cfg.PrimaryConsole)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("%w: the primary's console %q is not an absolute http or https URL", ErrInvalidConfig, cfg.PrimaryConsole)
		}
	}
	for _, p := range cfg.TrustedProxies {
		if !p.IsValid() {
			return nil, fmt.Errorf("%w: TrustedProxies holds an invalid prefix", ErrInvalidConfig)
		}
	}
	if cfg.MaxConcurrentRequests < 0 {
		return nil, fmt.Errorf("%w: MaxConcurrentRequests %d is negative (0: the default, %d)", ErrInvalidConfig, cfg.MaxConcurrentRequests, DefaultMaxConcurrentRequests)
	}
	if cfg.MaxConcurrentRequests == 0 {
		cfg.MaxConcurrentRequests = DefaultMaxConcurrentRequests
	}
	// A negative threshold is a mistake (a flipped sign): taking the
	// default for it would hide it, as for MaxConcurrentRequests.
	if cfg.DegradedAfter < 0 {
		return nil, fmt.Errorf("%w: DegradedAfter %v is negative (0: the default, %v)", ErrInvalidConfig, cfg.DegradedAfter, DefaultDegradedAfter)
	}
	if cfg.HorizonDegradedAfter < 0 {
		return nil, fmt.Errorf("%w: HorizonDegradedAfter %v is negative (0: the default, %v)", ErrInvalidConfig, cfg.HorizonDegradedAfter, DefaultHorizonDegradedAfter)
	}
	if cfg.DegradedAfter == 0 {
		cfg.DegradedAfter = DefaultDegradedAfter
	}
	if cfg.HorizonDegradedAfter == 0 {
		cfg.HorizonDegradedAfter = DefaultHorizonDegradedAfter
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, store: st, log: log, slots: make(chan struct{}, cfg.MaxConcurrentRequests), now: time.Now}
	s.overviewReads = sharedread.New(overviewMaxAge, s.readOverview)
	s.standby = sharedread.New(standbyMaxAge, s.readStandby)
	// Kept for no time: a probe gets reads that began before it asked
	// only while they are under way.
	s.readiness = sharedread.New(0, s.readReadiness)
	return s, nil
}

// auditPool is where audit verify runs (Config.AuditPool).
func (s *Server) auditPool() *pgxpool.Pool {
	if s.cfg.AuditPool != nil {
		return s.cfg.AuditPool
	}
	return s.cfg.Pool
}

// verifyWorkers is how many connections a verify reads with: several on
// the audit pool (its own connections, usually a standby's), one on the
// pool the relayer shares, whose connections its claims and outcome
// writes need.
func (s *Server) verifyWorkers() int {
	if s.cfg.AuditPool != nil {
		return store.DefaultVerifyWorkers
	}
	return 1
}

// SetStopping makes /readyz answer 503 from now on: the process is
// shutting down and should get no new traffic.
func (s *Server) SetStopping() { s.stopping.Store(true) }

// Handler routes the admin address: /healthz and /readyz without
// credentials (probes), /api/v1/... with them and the console under
// /console/ (only when Config.Tokens has some).
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", s.healthz)
	mux.HandleFunc("GET /readyz", s.readyz)
	if len(s.cfg.Tokens) == 0 {
		return mux
	}
	api := func(pattern string, role Role, h func(w http.ResponseWriter, r *http.Request, who Token)) {
		mux.Handle(pattern, s.authorize(role, h))
	}
	api("GET /api/v1/overview", RoleAuditor, s.overview)
	api("GET /api/v1/instructions", RoleAuditor, s.instructions)
	api("GET /api/v1/participants/{id}", RoleAuditor, s.participant)
	api("GET /api/v1/dead-letters", RoleAuditor, s.deadLetters)
	api("POST /api/v1/dead-letters/{id}/replay", RoleOperator, s.replay)
	api("POST /api/v1/dead-letters/{id}/acknowledge", RoleOperator, s.acknowledge)
	api("POST /api/v1/instructions/{id}/cancel", RoleOperator, s.cancel)
	api("GET /api/v1/trail/{id}", RoleAuditor, s.trail)
	api("GET /api/v1/trail", RoleAuditor, s.trail)
	api("POST /api/v1/verify", RoleAuditor, s.verify)
	api("POST /api/v1/rails/{rail}/{action}", RoleOperator, s.pauseRail)
	// Every other /api/ path and method: after the credential is checked
	// (a caller without one learns nothing of which paths exist), a JSON
	// 404 or 405 with its code, as every other error answer has.
	mux.Handle(apiRest, s.authorize(RoleAuditor, func(w http.ResponseWriter, r *http.Request, _ Token) {
		s.unknownAPI(mux, w, r)
	}))
	s.mountConsole(mux)
	return limitBodies(mux)
}

// apiRest is the pattern of the API's paths and methods that no route
// takes.
const apiRest = "/api/"

// apiMethods are the methods unknownAPI tries a path with to say which
// it takes.
var apiMethods = [...]string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete}

// unknownAPI answers a request no API route takes: 405 METHOD_NOT_ALLOWED
// with an Allow header when the path is a route's with another method,
// else 404 NOT_FOUND.
func (s *Server) unknownAPI(mux *http.ServeMux, w http.ResponseWriter, r *http.Request) {
	var allow []string
	for _, m := range apiMethods {
		probe := r.Clone(r.Context())
		probe.Method = m
		if _, pattern := mux.Handler(probe); pattern != "" && pattern != apiRest {
			allow = append(allow, m)
		}
	}
	if len(allow) > 0 {
		w.Header().Set("Allow", strings.Join(allow, ", "))
		writeError(w, http.StatusMethodNotAllowed, MethodNotAllowed, fmt.Sprintf("%s is not a method of %s: it takes %s", r.Method, r.URL.Path, strings.Join(allow, ", ")))
		return
	}
	writeError(w, http.StatusNotFound, NotFound, "the API has no path "+r.URL.Path)
}

// MaxRequestBody is the most a request to the admin address may send as
// its body. Every form and API body is a few hundred bytes (a token, a
// reason, a CSRF token); without a bound, the sign-in form, open to anyone
// who can reach the address, would read up to 10 MB per request into
// memory.
const MaxRequestBody = 64 << 10

// limitBodies answers 413 to a request that says its body is larger than
// MaxRequestBody, and cuts off one that sends more than it said (or did
// not say): its form then reads as empty, so it is refused as one
// without a token, a CSRF token or a reason.
func limitBodies(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > MaxRequestBody {
			writeError(w, http.StatusRequestEntityTooLarge, BodyTooLarge, fmt.Sprintf("a request body may be at most %d bytes", MaxRequestBody))
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, MaxRequestBody)
		next.ServeHTTP(w, r)
	})
}

// authorize wraps an API handler: a request without a known credential
// gets 401, one whose credential's role is too weak 403. The credential
// is never logged.
func (s *Server) authorize(need Role, h func(w http.ResponseWriter, r *http.Request, who Token)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		secret, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if ok && !s.refuseThrottled(w, r) {
			writeError(w, http.StatusTooManyRequests, TooManyFailures, tooManyGuesses)
			return
		}
		who, known := match(s.cfg.Tokens, secret)
		switch {
		case !ok || !known:
			reason := "no credential"
			if ok {
				reason = "unknown credential"
				s.failedAuth(r)
			}
			s.log.Warn("admin: refused request", "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr, "reason", reason)
			w.Header().Set("WWW-Authenticate", `Bearer realm="outbox"`)
			writeError(w, http.StatusUnauthorized, Unauthorized, "a valid credential is required")
		case need == RoleOperator && who.Role != RoleOperator:
			s.log.Warn("admin: refused request", "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr,
				"token", who.Name, "reason", "needs the operator role")
			writeError(w, http.StatusForbidden, Forbidden, "this needs an operator credential")
		default:
			release, ok := s.takeSlot(w, r)
			if !ok {
				writeError(w, http.StatusServiceUnavailable, Busy, busyWhy)
				return
			}
			sw := &slotWriter{ResponseWriter: w, release: release}
			defer sw.free()
			h(sw, r, who)
		}
	})
}

// slotWriter gives a request's slot (takeSlot) back once its handler
// begins to answer, its database reads done: an answer is written at the
// pace its client reads it, and the admin address has no write timeout
// (a verify answers late), so a client that reads nothing held its slot
// for as long as its connection lasted, with no database connection
// behind it; an auditor's requests side by side held every slot, and
// every operator's action was answered BUSY.
type slotWriter struct {
	http.ResponseWriter
	once    sync.Once
	release func()
}

// free gives the slot back, once.
func (w *slotWriter) free() { w.once.Do(w.release) }

// WriteHeader implements http.ResponseWriter.
func (w *slotWriter) WriteHeader(code int) {
	w.free()
	w.ResponseWriter.WriteHeader(code)
}

// Write implements http.ResponseWriter.
func (w *slotWriter) Write(p []byte) (int, error) {
	w.free()
	return w.ResponseWriter.Write(p)
}

// Unwrap returns the writer it wraps, for http.ResponseController.
func (w *slotWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// busyWhy says why a request was answered 503 with the code Busy.
const busyWhy = "nothing was read or done: the admin address is serving as many requests as it may at once (each holds one of its database connections); try again"

// takeSlot waits up to BusyWait for one of Config.MaxConcurrentRequests;
// ok false, the request is to be answered 503 (its Retry-After is set),
// unless it went away meanwhile. release gives the slot back.
func (s *Server) takeSlot(w http.ResponseWriter, r *http.Request) (release func(), ok bool) {
	select {
	case s.slots <- struct{}{}:
		return func() { <-s.slots }, true
	default:
	}
	t := time.NewTimer(BusyWait)
	defer t.Stop()
	select {
	case s.slots <- struct{}{}:
		return func() { <-s.slots }, true
	case <-t.C:
	case <-r.Context().Done():
	}
	s.log.Warn("admin: refused request", "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr,
		"reason", "busy: every concurrent request's slot taken")
	w.Header().Set("Retry-After", "1")
	return nil, false
}

// writeJSON writes v with status, as JSON only: a browser must not guess
// another type for a body that carries ids, reasons and rail messages.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// internalError logs err and answers 500 without its details.
func (s *Server) internalError(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, context.Canceled) {
		return
	}
	s.log.Error("admin: request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	writeError(w, http.StatusInternalServerError, Internal, "internal error (logged)")
}
