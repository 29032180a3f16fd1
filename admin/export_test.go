package admin

import (
	"sync"
	"time"

	"github.com/ledgerline/outbox/internal/sharedread"
)

// SetOverviewMaxAge replaces overviewMaxAge for s, for tests that must
// not depend on how fast the machine is.
func SetOverviewMaxAge(s *Server, d time.Duration) {
	s.overviewReads = sharedread.New(d, s.readOverview)
}

// SetTrailPageSize makes s's trails (API and console) n archive rows a
// page, for tests that would otherwise need hundreds of attempts.
func SetTrailPageSize(s *Server, n int) { s.trailPage = n }

// Clock is a test's clock for a Server: it starts at the real time and
// moves only when a test moves it.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock on by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// UseClock makes s read the time from a new Clock, which it returns; call
// it before s serves anything.
func UseClock(s *Server) *Clock {
	c := &Clock{now: time.Now()}
	s.now = c.Now
	return c
}

// ThrottledSources is how many sources s's table of failed
// authentications holds.
func ThrottledSources(s *Server) int { return s.guesses.len() }
