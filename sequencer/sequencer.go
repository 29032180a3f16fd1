// Package sequencer allocates per-participant sequence ids inside the
// caller's transaction.
//
// Allocation bumps a row of the sequences table, so it takes that row's lock
// until the transaction ends: concurrent allocations for one participant
// serialize, different participants never wait on each other, and a rollback
// returns the id. Committed ids per participant are therefore 1..N, gap-free.
package sequencer

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerline/outbox/migrations"
)

// DB is the part of a transaction the sequencer uses; pgx.Tx, *pgx.Conn and
// *pgxpool.Pool satisfy it. Pass a transaction: with a pool the id is
// committed at once, which is only right when nothing else depends on it.
type DB interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// ErrEmptyParticipant is returned for an empty participant id.
var ErrEmptyParticipant = errors.New("sequencer: participant id is empty")

// Sequencer allocates sequence ids in one schema.
type Sequencer struct {
	next, current string
}

// New returns a Sequencer for schema ("" means the default schema).
func New(schema string) (*Sequencer, error) {
	if err := migrations.ValidateSchema(schema); err != nil {
		return nil, err
	}
	return &Sequencer{
		next:    migrations.Qualify(schema, "SELECT {schema}.bump_sequence($1)"),
		current: migrations.Qualify(schema, "SELECT coalesce(max(next_sequence_id) - 1, 0) FROM {schema}.sequences WHERE participant_id = $1"),
	}, nil
}

var defaultSequencer, _ = New("")

// Next allocates the next sequence id of a participant in the default schema.
func Next(ctx context.Context, tx DB, participantID string) (int64, error) {
	return defaultSequencer.Next(ctx, tx, participantID)
}

// Next allocates the next sequence id of a participant (1 for the first).
func (s *Sequencer) Next(ctx context.Context, tx DB, participantID string) (int64, error) {
	if participantID == "" {
		return 0, ErrEmptyParticipant
	}
	var id int64
	if err := tx.QueryRow(ctx, s.next, participantID).Scan(&id); err != nil {
		return 0, fmt.Errorf("sequencer: next for %q: %w", participantID, err)
	}
	return id, nil
}

// Last returns the last id allocated (and visible to db) for a
// participant, 0 if none.
func (s *Sequencer) Last(ctx context.Context, db DB, participantID string) (int64, error) {
	var id int64
	if err := db.QueryRow(ctx, s.current, participantID).Scan(&id); err != nil {
		return 0, fmt.Errorf("sequencer: last for %q: %w", participantID, err)
	}
	return id, nil
}
