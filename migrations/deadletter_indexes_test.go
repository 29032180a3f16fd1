package migrations_test

import "testing"

// TestDeadLetterIndexesBuiltBeforehand: docs/operations.md tells upgraders
// to build 045's indexes on dead_letters beforehand, concurrently, so that
// outcome writes keep running; the migration then takes them as they are.
// A concurrent build that fails (here on its lock_timeout, behind a
// transaction writing dead letters) leaves an invalid index of that name,
// which 045's CREATE INDEX IF NOT EXISTS took as it was: kept up by every
// write, read by no query. After the latest migration both indexes must be
// valid, one built beforehand and valid must be the same index, and one of
// that name defined otherwise must stop the migration with a hint.
func TestDeadLetterIndexesBuiltBeforehand(t *testing.T) {
	t.Parallel()
	prebuiltIndexes{before: 44, schema: "dl_prebuilt", other: "dl_otherwise",
		kept: "dead_letters_participant_open_idx", keptSQL: `CREATE INDEX CONCURRENTLY dead_letters_participant_open_idx
		ON %[1]s.dead_letters (participant_id, failed_at, outbox_id) WHERE acknowledged_at IS NULL`,
		failed: "dead_letters_participant_idx", table: "dead_letters", columns: "(participant_id, failed_at, outbox_id)"}.check(t)
}
