package admin

import (
	"context"

	"github.com/ledgerline/outbox/internal/store"
)

// deadLettersPage is one page of the dead letters (all: acknowledged ones
// too), oldest failure first, of participant ("": of everyone).
func (s *Server) deadLettersPage(ctx context.Context, all bool, participant string, after store.Cursor, limit int) ([]store.DeadLetter, error) {
	if participant == "" {
		return s.store.DeadLettersAfter(ctx, s.cfg.Pool, all, after, limit)
	}
	return s.store.ParticipantDeadLettersAfter(ctx, s.cfg.Pool, participant, all, after, limit)
}
