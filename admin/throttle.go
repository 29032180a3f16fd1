package admin

import (
	"math"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"
)

// AuthFailureLimit is how many failed authentications (a wrong secret at
// the console's sign-in, as an API bearer token or to /readyz) one source
// may make within AuthFailureWindow; from then until the window ends, its
// requests that carry a secret are answered 429 with a Retry-After,
// without the secret being checked. Secrets have at least 16 characters,
// so this is not what keeps them from being guessed; it keeps a guesser
// from trying them as fast as the address answers, and keeps the log
// from growing by a line per guess.
const AuthFailureLimit = 10

// AuthFailureWindow is the window AuthFailureLimit counts in: from a
// source's first failure, and again from its first failure after.
const AuthFailureWindow = time.Minute

// maxThrottledSources bounds the table of sources with failures: past
// it, the source whose window began first is forgotten, so that a
// guesser with many addresses grows the table no further.
const maxThrottledSources = 4096

// guessSource is one source's failures in its window.
type guessSource struct {
	since    time.Time // the window's start: its first failure
	failures int
	logged   bool // its throttle was logged in this window
}

// guesses counts failed authentications per source (sourceOf): the
// client's address as this process sees it (behind a proxy, the
// proxy's; X-Forwarded-For is read only from Config.TrustedProxies, as
// anyone can send it).
type guesses struct {
	mu sync.Mutex
	m  map[netip.Addr]*guessSource
}

// sourceAddr is the IP of an address with or without its port (the
// zero Addr when it cannot be read).
func sourceAddr(remote string) netip.Addr {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		host = remote
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}
	}
	return a.Unmap()
}

// sourceOf is the source an address counts under: its IP, an IPv6
// address's /64 (one host commonly has a whole /64 to pick from); one
// source for whatever cannot be read.
func sourceOf(remote string) netip.Addr {
	a := sourceAddr(remote)
	if a.Is6() {
		if p, err := a.Prefix(64); err == nil {
			return p.Addr()
		}
	}
	return a
}

// len is how many sources the table holds.
func (g *guesses) len() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.m)
}

// current returns src's entry in its window (nil: none),
// forgetting one whose window has ended. g.mu is held.
func (g *guesses) current(src netip.Addr, now time.Time) *guessSource {
	e := g.m[src]
	if e != nil && !now.Before(e.since.Add(AuthFailureWindow)) {
		delete(g.m, src)
		return nil
	}
	return e
}

// throttled says whether remote's source has used up its failures in
// its window; retryAfter is then how long until the window ends.
func (g *guesses) throttled(remote string, now time.Time) (retryAfter time.Duration, throttled bool) {
	retryAfter, throttled, _ = g.check(remote, now)
	return retryAfter, throttled
}

// check is throttled, and log says this is the first request refused for
// the source in its window (the throttle is logged once per window).
func (g *guesses) check(remote string, now time.Time) (retryAfter time.Duration, throttled, log bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	e := g.current(sourceOf(remote), now)
	if e == nil || e.failures < AuthFailureLimit {
		return 0, false, false
	}
	log, e.logged = !e.logged, true
	return e.since.Add(AuthFailureWindow).Sub(now), true, log
}

// fail counts a failed authentication of remote's source.
func (g *guesses) fail(remote string, now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	src := sourceOf(remote)
	if e := g.current(src, now); e != nil {
		e.failures++
		return
	}
	if g.m == nil {
		g.m = map[netip.Addr]*guessSource{}
	}
	if len(g.m) >= maxThrottledSources {
		g.evict(now)
	}
	g.m[src] = &guessSource{since: now, failures: 1}
}

// evict makes room for a source: it forgets the sources whose windows
// have ended, and if none had, the one whose window began first. g.mu is
// held.
func (g *guesses) evict(now time.Time) {
	var oldest netip.Addr
	var first time.Time
	for src, e := range g.m {
		if !now.Before(e.since.Add(AuthFailureWindow)) {
			delete(g.m, src)
			continue
		}
		if first.IsZero() || e.since.Before(first) {
			oldest, first = src, e.since
		}
	}
	if len(g.m) >= maxThrottledSources {
		delete(g.m, oldest)
	}
}

// clientOf is the address r's failed authentications count against: the
// address it came from, or, from one of Config.TrustedProxies, the
// rightmost address of its X-Forwarded-For that is not itself a trusted
// proxy (the one the proxy nearest this process appended; those to its
// left the client may have written). An entry is an address, with or
// without its port (ip:port, [v6]:port, [v6]: proxies that write the
// port); one that cannot be read ends the walk at the last address read.
func (s *Server) clientOf(r *http.Request) string {
	if len(s.cfg.TrustedProxies) == 0 {
		return r.RemoteAddr
	}
	client := r.RemoteAddr
	peer := sourceAddr(r.RemoteAddr)
	if !s.trusted(peer) {
		return client
	}
	hops := strings.Split(strings.Join(r.Header.Values("X-Forwarded-For"), ","), ",")
	for i := len(hops) - 1; i >= 0; i-- {
		a, ok := hopAddr(hops[i])
		if !ok {
			break
		}
		client = a.String()
		if !s.trusted(a.Unmap()) {
			break
		}
	}
	return client
}

// hopAddr reads an X-Forwarded-For entry: an address, an address with its
// port (ip:port, [v6]:port) or an IPv6 address in brackets. Read only as
// an address, an entry with its port ended the trusted-proxy walk, and
// the proxy itself counted as the client.
func hopAddr(hop string) (netip.Addr, bool) {
	hop = strings.TrimSpace(hop)
	if a, err := netip.ParseAddr(hop); err == nil {
		return a, true
	}
	if host, _, err := net.SplitHostPort(hop); err == nil {
		a, err := netip.ParseAddr(host)
		return a, err == nil
	}
	if inner, ok := strings.CutPrefix(hop, "["); ok {
		if inner, ok = strings.CutSuffix(inner, "]"); ok {
			a, err := netip.ParseAddr(inner)
			return a, err == nil && a.Is6()
		}
	}
	return netip.Addr{}, false
}

// trusted says whether a is one of Config.TrustedProxies.
func (s *Server) trusted(a netip.Addr) bool {
	for _, p := range s.cfg.TrustedProxies {
		if a.IsValid() && p.Contains(a) {
			return true
		}
	}
	return false
}

// refuseThrottled answers r 429 when its source has used up its failed
// authentications (guesses), before its secret is checked, and logs the
// throttle once per source and window; ok false, r was answered.
func (s *Server) refuseThrottled(w http.ResponseWriter, r *http.Request) (ok bool) {
	client := s.clientOf(r)
	retry, throttled, log := s.guesses.check(client, s.now())
	if !throttled {
		return true
	}
	if log {
		s.log.Warn("admin: source throttled: too many failed authentications", "remote", r.RemoteAddr, "client", client,
			"failures", AuthFailureLimit, "window", AuthFailureWindow, "until", s.now().Add(retry).UTC())
	}
	w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(max(retry.Seconds(), 1)))))
	return false
}

// tooManyGuesses is the API's and /readyz's answer to a throttled
// source (refuseThrottled).
const tooManyGuesses = "too many failed authentications from this address: its secrets are not checked until Retry-After"

// failedAuth counts a failed authentication of r's source.
func (s *Server) failedAuth(r *http.Request) { s.guesses.fail(s.clientOf(r), s.now()) }
