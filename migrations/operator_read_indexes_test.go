package migrations_test

import "testing"

// TestOperatorReadIndexesBuiltBeforehand: migration 049's indexes (pending
// by rail and outbox id, the pause events by time) may be built
// beforehand with CREATE INDEX CONCURRENTLY, so that enqueues and claims
// do not wait for the build. One built that way is kept; one a failed
// concurrent build left invalid is built again, not taken as it is (kept
// up by every enqueue and read by no query); one of that name defined
// otherwise stops the migration, changing nothing, with the statement to
// build it in its hint.
func TestOperatorReadIndexesBuiltBeforehand(t *testing.T) {
	t.Parallel()
	prebuiltIndexes{before: 48, schema: "reads_prebuilt", other: "reads_otherwise",
		kept: "rail_pause_events_at_idx", keptSQL: `CREATE INDEX CONCURRENTLY rail_pause_events_at_idx ON %[1]s.rail_pause_events (at, event_id)`,
		failed: "pending_rail_outbox_idx", table: "pending", columns: "(rail_type, outbox_id)"}.check(t)
}
