package admin

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerline/outbox/internal/store"
)

// The dead letters of one participant, for the participant page's link
// and ?participant= on the list and the API: among everyone's, a
// participant's own may be pages away. The columns are store's
// deadLetterSelect, in store.DeadLetter's field order; this belongs in
// store.DeadLettersAfter, and is here only because this change could not
// touch store. No index leads with participant_id (that needs a
// migration): each page walks the list's own index in failure order and
// filters, as store.Participant's count of them scans.
const (
	participantDeadLettersColumns = `
SELECT outbox_id, instruction_id, participant_id, sequence_id, rail_type, tenant_id, correlation_id,
       attempt_count, error_code, error_message, created_at, failed_at, acknowledged_at, acknowledged_by, outcome_unknown
FROM {schema}.dead_letters`
	// Two statements, as store's: each has an index in its order.
	participantOpenDeadLettersSQL = participantDeadLettersColumns + `
WHERE participant_id = $4 AND acknowledged_at IS NULL AND (failed_at, outbox_id) > ($2, $3)
ORDER BY failed_at, outbox_id LIMIT $1`
	participantAllDeadLettersSQL = participantDeadLettersColumns + `
WHERE participant_id = $4 AND (failed_at, outbox_id) > ($2, $3)
ORDER BY failed_at, outbox_id LIMIT $1`
)

// deadLettersPage is one page of the dead letters (all: acknowledged ones
// too), oldest failure first, of participant ("": of everyone).
func (s *Server) deadLettersPage(ctx context.Context, all bool, participant string, after store.Cursor, limit int) ([]store.DeadLetter, error) {
	if participant == "" {
		return s.store.DeadLettersAfter(ctx, s.cfg.Pool, all, after, limit)
	}
	if after.At.IsZero() {
		after.At = time.Unix(0, 0) // before every failure, as store's first page
	}
	q := participantOpenDeadLettersSQL
	if all {
		q = participantAllDeadLettersSQL
	}
	rows, err := s.cfg.Pool.Query(ctx, s.store.Qualify(q), limit, after.At, after.ID, participant)
	if err != nil {
		return nil, fmt.Errorf("dead letters of participant %s: %w", participant, err)
	}
	items, err := pgx.CollectRows(rows, pgx.RowToStructByPos[store.DeadLetter])
	if err != nil {
		return nil, fmt.Errorf("dead letters of participant %s: %w", participant, err)
	}
	return items, nil
}
