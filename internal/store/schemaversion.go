package store

import (
	"context"
	"fmt"
)

// EnqueueSchemaVersion is the first schema version the enqueue statements
// are right for: migration 028 keys idempotency keys by tenant and key, and
// the receipts' lookup reads them so (on an older schema a key reused
// under a second instruction id would be written and then reported as a
// mismatch); migration 030 makes an instruction id take one key per
// tenant, which the enqueue's ON CONFLICT relies on to refuse a second
// key (on an older schema it would be written: a second payment of one
// instruction); migration 033 adds the functions the enqueue inserts
// pending rows through (enqueue_pending, enqueue_pending_batch).
const EnqueueSchemaVersion = 33

// SchemaVersion reads the schema's migration version (tern's
// schema_version table). visible is false when the table is there but db's
// role may not read it (a role set up by hand): the version is then
// unknown, and 0; so is it when the role may not use the schema at all
// (to_regclass would fail on it: permission denied for schema), whose
// statements then refuse the role themselves. A schema never migrated has
// version 0, visible. The statements cannot fail on a missing table or an
// unusable schema, so a caller's transaction stays usable whatever the
// answer.
func (s *Store) SchemaVersion(ctx context.Context, db Querier) (version int32, visible bool, err error) {
	table := s.schema + ".schema_version"
	var state string
	if err := db.QueryRow(ctx, `SELECT CASE WHEN to_regnamespace($2) IS NULL THEN 'missing'
		WHEN NOT has_schema_privilege(to_regnamespace($2), 'USAGE') THEN 'hidden'
		WHEN to_regclass($1) IS NULL THEN 'missing'
		WHEN has_table_privilege(to_regclass($1), 'SELECT') THEN 'readable' ELSE 'hidden' END`, table, s.schema).Scan(&state); err != nil {
		return 0, false, fmt.Errorf("schema version: %w", err)
	}
	switch state {
	case "missing":
		return 0, true, nil
	case "hidden":
		return 0, false, nil
	}
	if err := db.QueryRow(ctx, "SELECT version FROM "+table).Scan(&version); err != nil {
		return 0, false, fmt.Errorf("schema version: %w", err)
	}
	return version, true, nil
}
