package admin

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
)

// ErrSchemaBehind is returned by [Server.Act], [Server.PauseRail] and
// [Server.ResumeRailShown] when the database's schema lacks a function
// the action runs (resume_rail_shown, migration 047): the process was
// upgraded before the schema was migrated. Nothing was done; run `outbox
// migrate`. The API answers 503 with the code SchemaBehind. An action
// never falls back to an older function: a resume by name would end
// whatever pause is in force, not only the one shown.
var ErrSchemaBehind = errors.New("admin: the database's schema is older than this build: run outbox migrate")

// schemaBehindNote is an action result's note for ErrSchemaBehind.
const schemaBehindNote = "nothing done: the database's schema is older than this build (a function the action needs is not there); run outbox migrate, then try again"

// schemaBehind returns err wrapped with ErrSchemaBehind when the database
// answered that a function it was asked to run does not exist (SQLSTATE
// 42883, undefined_function: every function an action calls is in the
// schema's migrations), and nil otherwise.
func schemaBehind(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42883" {
		return fmt.Errorf("%w: %w", ErrSchemaBehind, err)
	}
	return nil
}
