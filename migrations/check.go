package migrations

import (
	"context"
	"fmt"
)

// SchemaError says that a schema is not at a version this build can run
// against: not migrated at all, or behind. Waiting cannot fix it (someone
// has to run `outbox migrate`), so it is permanent: processes refuse to
// start on it instead of retrying.
type SchemaError struct {
	Status
}

// Error implements error.
func (e *SchemaError) Error() string {
	if e.Current == 0 {
		return fmt.Sprintf("schema %s is not migrated (this build needs version %d): run `outbox migrate` with a direct database URL",
			e.Schema, e.Latest)
	}
	return fmt.Sprintf("schema %s is at version %d, this build needs %d: run `outbox migrate` with a direct database URL",
		e.Schema, e.Current, e.Latest)
}

// Permanent marks the error as one no retry can fix.
func (e *SchemaError) Permanent() bool { return true }

// Ready checks that the database answers and that schema is migrated to at
// least the version this build knows. A schema newer than this build (a
// rolling deploy migrated it first) is not an error: the returned status
// says so and callers may warn. Errors are the driver's (the server
// refused us, or could not be reached) or a [*SchemaError].
func Ready(ctx context.Context, db DB, schema string) (Status, error) {
	st, err := GetStatus(ctx, db, schema)
	if err != nil {
		return st, err
	}
	if st.Current < st.Latest {
		return st, &SchemaError{Status: st}
	}
	return st, nil
}
