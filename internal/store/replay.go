package store

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/gofrs/uuid/v5"
)

// Replay sends a dead letter back to pending with the same outbox and
// sequence id and a fresh retry budget (see budget.go), and archives a
// REPLAYED row naming the operator and the reason, through the schema's
// replay_dead_letter function (migration 008: the only way an operator
// role may write; its statements are replay_dead_letter_any_tenant's since
// migration 022). With ordering on the instruction becomes its
// participant's head again when nothing of the participant is in flight
// and no lower sequence is pending, decided after waiting for a claim of
// the participant's head that is under way (migration 026); else it waits,
// and becomes due when the instruction in flight ends or comes back to
// pending (requeuedSQL, reapSQL). It reports whether the dead letter
// existed.
func (s *Store) Replay(ctx context.Context, db Querier, outboxID uuid.UUID, operator, reason string) (bool, error) {
	if err := checkOperator(operator, reason); err != nil {
		return false, err
	}
	var n int64
	if err := db.QueryRow(ctx, s.sql.replay, outboxID, operator, reason).Scan(&n); err != nil {
		return false, fmt.Errorf("replay %s: %w", outboxID, err)
	}
	return n == 1, nil
}

const replaySQL = `SELECT {schema}.replay_dead_letter($1, $2, $3)`

// ErrOperatorAction is returned for an operator action (replay,
// acknowledge) without the operator's name or without a reason: both are
// archived with the action.
var ErrOperatorAction = errors.New("an operator action needs the operator's name and a reason")

func checkOperator(operator, reason string) error {
	switch {
	case strings.TrimSpace(operator) == "":
		return fmt.Errorf("%w: no operator", ErrOperatorAction)
	case strings.TrimSpace(reason) == "":
		return fmt.Errorf("%w: no reason", ErrOperatorAction)
	}
	return nil
}
