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
