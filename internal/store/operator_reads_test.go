package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/internal/store"
)

// planModes are the plans an operator's read must stay bounded under: the
// custom plans of a fresh connection and the generic plan a long-lived
// pool's connection may settle on after five executions of a statement.
var planModes = []string{"force_custom_plan", "force_generic_plan"}

// tuplesRead is the rows sequential scans of outbox.table read plus the
// entries its indexes returned, as the statistics say once conn's own
// counts are flushed (a statement that runs in a transaction of its own,
// as RailHasPending's, leaves nothing in a transaction's counters).
func tuplesRead(t *testing.T, conn *pgxpool.Conn, table string) int64 {
	t.Helper()
	// Flushed at the end of each statement, this one's too.
	for range 2 {
		if _, err := conn.Exec(t.Context(), `SELECT pg_stat_force_next_flush()`); err != nil {
			t.Fatal(err)
		}
	}
	var n int64
	if err := conn.QueryRow(t.Context(), `SELECT coalesce(t.seq_tup_read, 0) + coalesce((SELECT sum(i.idx_tup_read) FROM pg_stat_user_indexes i WHERE i.relid = t.relid), 0)
  FROM pg_stat_user_tables t WHERE t.schemaname = 'outbox' AND t.relname = $1`, table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// setPlans sets conn's plan_cache_mode for the rest of the test.
func setPlans(t *testing.T, conn *pgxpool.Conn, mode string) {
	t.Helper()
	if _, err := conn.Exec(t.Context(), `SELECT set_config('plan_cache_mode', $1, false)`, mode); err != nil {
		t.Fatal(err)
	}
}

// TestListPendingReadsItsRows: ListPending (outboxtest's assertions) reads
// the rows it returns through an index, not pending, for every filter it
// takes, on custom and on generic plans, 20,000 other instructions
// pending. With every filter optional in one
// statement (an empty parameter matching every row), the generic plan
// read pending whole for each of them, and every plan for an instruction
// id.
func TestListPendingReadsItsRows(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	mine := []string{b.enqueue(t, "p-t", "t1").String(), b.enqueue(t, "p-t", "t2").String(), b.enqueue(t, "p-t", "t3").String()}
	execAll(t, b.pool, otherBacklogSQL,
		`INSERT INTO outbox.pending (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type, payload, next_attempt_at)
		 SELECT outbox.uuidv7(), 'rare-' || g, 'rare-' || g, 1, 'rare-' || g, 'rare', '{}', now() FROM generate_series(1, 4) g`,
		`ANALYZE outbox.pending`)
	const page = 100
	cases := []struct {
		f    store.PendingFilter
		want int
	}{
		{store.PendingFilter{InstructionID: "ins-t2"}, 1},
		{store.PendingFilter{InstructionID: "ins-t2", ParticipantID: "p-t"}, 1},
		{store.PendingFilter{InstructionID: "ins-t2", ParticipantID: "other-1"}, 0},
		{store.PendingFilter{InstructionID: "ins-t2", RailType: "sandbox"}, 1},
		{store.PendingFilter{InstructionID: "ins-t2", RailType: "rare"}, 0},
		{store.PendingFilter{ParticipantID: "p-t"}, 3},
		{store.PendingFilter{ParticipantID: "p-t", RailType: "sandbox"}, 3},
		{store.PendingFilter{ParticipantID: "p-t", RailType: "rare"}, 0},
		{store.PendingFilter{RailType: "rare"}, 4},
		{store.PendingFilter{RailType: "nosuch"}, 0},
		{store.PendingFilter{Limit: page}, page},
	}
	conn := b.conn(t)
	for _, mode := range planModes {
		setPlans(t, conn, mode)
		for _, c := range cases {
			// Six times: from the sixth, a statement left to choose may
			// run its generic plan.
			for range 6 {
				before := tuplesRead(t, conn, "pending")
				rows, err := b.st.ListPending(b.ctx, conn, c.f)
				if err != nil {
					t.Fatal(err)
				}
				read := tuplesRead(t, conn, "pending") - before
				if len(rows) != c.want {
					t.Fatalf("%s, %+v: %d rows, want %d", mode, c.f, len(rows), c.want)
				}
				if c.f.InstructionID != "" && len(rows) == 1 && rows[0].OutboxID.String() != mine[1] {
					t.Fatalf("%s, %+v: listed %s, want %s", mode, c.f, rows[0].OutboxID, mine[1])
				}
				if limit := int64(2*c.want + 8); read > limit {
					t.Fatalf("%s, %+v: read %d rows or index entries of pending for %d rows (at most %d): it reads pending, not its rows",
						mode, c.f, read, c.want, limit)
				}
			}
		}
	}
}

// TestRailPendingReadsTheRailsRows: what `rails pause` tells of the
// instructions a pause holds (RailHasPending, and RailQuiet's count of
// them) reads the rail's range of the due index, not pending: a misspelt
// rail reads nothing, on custom and on generic plans, 20,000 instructions
// of another rail pending. With every rail (*) asked in the same
// statement as one rail, the generic plan read pending whole.
func TestRailPendingReadsTheRailsRows(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	execAll(t, b.pool, otherBacklogSQL,
		`INSERT INTO outbox.pending (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type, payload, next_attempt_at)
		 SELECT outbox.uuidv7(), 'rare-' || g, 'rare-' || g, 1, 'rare-' || g, 'rare', '{}', now() FROM generate_series(1, 4) g`,
		`VACUUM ANALYZE outbox.pending`)
	conn := b.conn(t)
	for _, mode := range planModes {
		setPlans(t, conn, mode)
		for _, c := range []struct {
			rail string
			held int64
			// most is the rows or index entries of pending each may read.
			most int64
		}{{"rare", 4, 16}, {"nosuch", 0, 8}, {store.AllRails, 20004, 20004 + 8}} {
			for range 6 {
				before := tuplesRead(t, conn, "pending")
				has, err := b.st.RailHasPending(b.ctx, conn, c.rail)
				if err != nil {
					t.Fatal(err)
				}
				if has != (c.held > 0) {
					t.Fatalf("%s: rail %s has pending: %v, want %v", mode, c.rail, has, c.held > 0)
				}
				if read := tuplesRead(t, conn, "pending") - before; read > 8 {
					t.Fatalf("%s: whether rail %s has pending read %d rows or index entries of pending, want 8 at most", mode, c.rail, read)
				}
				ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
				before = tuplesRead(t, conn, "pending")
				q, err := b.st.RailQuiet(ctx, conn, c.rail, time.Millisecond)
				cancel()
				if err != nil {
					t.Fatal(err)
				}
				if q.Held != c.held {
					t.Fatalf("%s: rail %s holds %d, want %d", mode, c.rail, q.Held, c.held)
				}
				if read := tuplesRead(t, conn, "pending") - before; read > c.most {
					t.Fatalf("%s: rail %s's quiet read %d rows or index entries of pending for %d held, want %d at most",
						mode, c.rail, read, c.held, c.most)
				}
			}
		}
	}
}
