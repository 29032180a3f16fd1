package admin

import (
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
