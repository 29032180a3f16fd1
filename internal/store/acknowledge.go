package store

import (
	"context"

	"github.com/gofrs/uuid/v5"
)

// Acknowledge marks a dead letter as handled by an operator (it stays in
// the table as the instruction's final place until the archive month of
// the acknowledgement is detached: RetireKeys) and archives an ACKNOWLEDGED
// row saying who and why, through the schema's
// acknowledge_dead_letter function (migration 008). It reports whether an
// unacknowledged dead letter existed; of an instruction in flight, it
// returns ErrDeadLetterInFlight and does nothing.
func (s *Store) Acknowledge(ctx context.Context, db Querier, outboxID uuid.UUID, operator, reason string) (bool, error) {
	if err := CheckOperator(operator, reason); err != nil {
		return false, err
	}
	return s.actOnDeadLetter(ctx, db, s.sql.acknowledge, "acknowledge", outboxID, operator, reason)
}

const acknowledgeSQL = `SELECT {schema}.acknowledge_dead_letter($1, $2, $3)`
