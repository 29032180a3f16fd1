package store_test

import (
	"bytes"
	"context"
	"slices"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/internal/store"
)

// planModes are the plans an operator's read must stay bounded under: the
// custom plans of a fresh connection and the generic plan a long-lived
// pool's connection may settle on after five executions of a statement.
var planModes = []string{"force_custom_plan", "force_generic_plan"}

// entriesReadIn runs read in a read-only transaction on conn and returns
// the rows sequential scans of outbox.table read plus the entries its
// indexes returned, as this transaction's own statistics count them
// (pg_stat_get_xact_tuples_returned of the table and of each index). An
// index-only scan fetches no row, so readIn's count would miss one that
// read a whole index; and the table-wide statistics also take in whatever
// another backend flushes late. read gets a TxBeginner whose transactions
// are savepoints of this one, for statements that begin their own (as
// RailHasPending's): their reads are counted here too.
func entriesReadIn(t *testing.T, conn *pgxpool.Conn, table string, read func(db store.TxBeginner)) int64 {
	t.Helper()
	tx, err := conn.BeginTx(t.Context(), pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(t.Context())
	count := func() int64 {
		var n int64
		if err := tx.QueryRow(t.Context(), `SELECT pg_stat_get_xact_tuples_returned(c.oid)
       + coalesce((SELECT sum(pg_stat_get_xact_tuples_returned(i.indexrelid)) FROM pg_index i WHERE i.indrelid = c.oid), 0)
  FROM pg_class c WHERE c.oid = to_regclass('outbox.' || $1)`, table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := count()
	read(savepoints{tx})
	return count() - before
}

// savepoints begins each transaction as a savepoint of tx (whose access
// mode it keeps: the options are not a savepoint's).
type savepoints struct{ tx pgx.Tx }

// BeginTx begins a savepoint of s.tx.
func (s savepoints) BeginTx(ctx context.Context, _ pgx.TxOptions) (pgx.Tx, error) {
	return s.tx.Begin(ctx)
}

// readIn runs read in a transaction on conn and returns the rows of
// outbox.table it read: sequential scans' rows plus the rows index scans
// fetched, as this transaction's own statistics count them
// (pg_stat_xact_user_tables). The table-wide statistics also take in
// whatever another backend flushes late, such as the setup's connections;
// these are this read's alone.
func readIn(t *testing.T, conn *pgxpool.Conn, table string, read func(tx pgx.Tx)) int64 {
	t.Helper()
	tx, err := conn.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(t.Context())
	count := func() int64 {
		var n int64
		if err := tx.QueryRow(t.Context(), `SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0)
  FROM pg_stat_xact_user_tables WHERE schemaname = 'outbox' AND relname = $1`, table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := count()
	read(tx)
	return count() - before
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
		// most is the rows or index entries of pending it may read (0:
		// twice its rows and 8).
		most int64
	}{
		{store.PendingFilter{InstructionID: "ins-t2"}, 1, 0},
		{store.PendingFilter{InstructionID: "ins-t2", ParticipantID: "p-t"}, 1, 0},
		// Either index bounds it: the key's one row, or other-1's 40 (a
		// custom plan may take that participant's range, as bounded).
		{store.PendingFilter{InstructionID: "ins-t2", ParticipantID: "other-1"}, 0, 40 + 8},
		{store.PendingFilter{InstructionID: "ins-t2", RailType: "sandbox"}, 1, 0},
		{store.PendingFilter{InstructionID: "ins-t2", RailType: "rare"}, 0, 0},
		{store.PendingFilter{ParticipantID: "p-t"}, 3, 0},
		{store.PendingFilter{ParticipantID: "p-t", RailType: "sandbox"}, 3, 0},
		{store.PendingFilter{ParticipantID: "p-t", RailType: "rare"}, 0, 0},
		{store.PendingFilter{RailType: "rare"}, 4, 0},
		{store.PendingFilter{RailType: "nosuch"}, 0, 0},
		{store.PendingFilter{Limit: page}, page, 0},
	}
	conn := b.conn(t)
	for _, mode := range planModes {
		setPlans(t, conn, mode)
		for _, c := range cases {
			// Six times: from the sixth, a statement left to choose may
			// run its generic plan.
			for range 6 {
				var rows []store.PendingRow
				read := readIn(t, conn, "pending", func(tx pgx.Tx) {
					var err error
					if rows, err = b.st.ListPending(b.ctx, tx, c.f); err != nil {
						t.Fatal(err)
					}
				})
				if len(rows) != c.want {
					t.Fatalf("%s, %+v: %d rows, want %d", mode, c.f, len(rows), c.want)
				}
				if c.f.InstructionID != "" && len(rows) == 1 && rows[0].OutboxID.String() != mine[1] {
					t.Fatalf("%s, %+v: listed %s, want %s", mode, c.f, rows[0].OutboxID, mine[1])
				}
				limit := c.most
				if limit == 0 {
					limit = int64(2*c.want + 8)
				}
				if read > limit {
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
				var has bool
				read := entriesReadIn(t, conn, "pending", func(db store.TxBeginner) {
					var err error
					if has, err = b.st.RailHasPending(b.ctx, db, c.rail); err != nil {
						t.Fatal(err)
					}
				})
				if has != (c.held > 0) {
					t.Fatalf("%s: rail %s has pending: %v, want %v", mode, c.rail, has, c.held > 0)
				}
				if read > 8 {
					t.Fatalf("%s: whether rail %s has pending read %d rows or index entries of pending, want 8 at most", mode, c.rail, read)
				}
				var q store.Quiet
				read = entriesReadIn(t, conn, "pending", func(db store.TxBeginner) {
					ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
					defer cancel()
					var err error
					if q, err = b.st.RailQuiet(ctx, db, c.rail, time.Millisecond); err != nil {
						t.Fatal(err)
					}
				})
				if q.Held != c.held {
					t.Fatalf("%s: rail %s holds %d, want %d", mode, c.rail, q.Held, c.held)
				}
				if read > c.most {
					t.Fatalf("%s: rail %s's quiet read %d rows or index entries of pending for %d held, want %d at most",
						mode, c.rail, read, c.held, c.most)
				}
			}
		}
	}
}

// TestListQueuedByRailReadsItsPage: the console's and the API's list of
// pending instructions filtered by rail reads a page of that rail's rows
// (the index by rail and outbox id, migration 049), not pending in outbox
// id order until a page of the rail turns up: on custom and on generic
// plans, with pending analyzed or with the vacuumed empty table's
// statistics, for a rail of 4 instructions behind 20,000 of another and
// for that other rail; the pages together are the rail's instructions in
// outbox id order, each once. With the rail an optional filter of the
// primary key's walk, the plans read all 20,004 rows for the 4.
func TestListQueuedByRailReadsItsPage(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	statisticsOfEmpty(t, b.pool, "pending")
	execAll(t, b.pool, otherBacklogSQL,
		`INSERT INTO outbox.pending (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type, payload, next_attempt_at)
		 SELECT outbox.uuidv7(), 'rare-' || g, 'rare-' || g, 1, 'rare-' || g, 'rare', '{}', now() FROM generate_series(1, 4) g`)
	wantStatisticsOfEmpty(t, b.pool, "pending")
	conn := b.conn(t)
	for round, plans := range []string{"force_custom_plan", "force_generic_plan", "analyze", "force_custom_plan", "force_generic_plan"} {
		if plans == "analyze" {
			execAll(t, b.pool, `ANALYZE outbox.pending`)
			continue
		}
		setPlans(t, conn, plans)
		for _, c := range []struct {
			rail        string
			want, limit int
		}{{"rare", 4, 3}, {"sandbox", 20000, 500}, {"nosuch", 0, 50}} {
			var (
				listed []uuid.UUID
				after  store.Cursor
			)
			for page := 0; ; page++ {
				var items []store.Queued
				read := readIn(t, conn, "pending", func(tx pgx.Tx) {
					var err error
					if items, err = b.st.ListQueued(b.ctx, tx, store.QueuedFilter{Rail: c.rail, After: after, Limit: c.limit}); err != nil {
						t.Fatal(err)
					}
				})
				if read > int64(c.limit+1) {
					t.Fatalf("round %d (%s), rail %s, page %d: read %d rows or index entries of pending for a page of %d",
						round, plans, c.rail, page, read, c.limit)
				}
				for _, q := range items {
					if q.RailType != c.rail {
						t.Fatalf("rail %s listed an instruction of rail %s", c.rail, q.RailType)
					}
					listed = append(listed, q.OutboxID)
				}
				if len(items) < c.limit {
					break
				}
				after = store.Cursor{ID: items[len(items)-1].OutboxID}
			}
			if len(listed) != c.want {
				t.Fatalf("round %d: rail %s: the pages listed %d instructions, want %d", round, c.rail, len(listed), c.want)
			}
			if !slices.IsSortedFunc(listed, func(a, b uuid.UUID) int { return bytes.Compare(a[:], b[:]) }) ||
				len(slices.Compact(slices.Clone(listed))) != len(listed) {
				t.Fatalf("round %d: rail %s: the pages are not in outbox id order, each once", round, c.rail)
			}
		}
	}
}

// TestRailPauseEventsReadTheirPage: `rails list`'s history and the
// console's rails page read the newest events through the index by time
// (migration 049), not the whole record sorted: 5,000 events, a page of
// 20, on custom and on generic plans. Without the index every listing read
// and sorted every pause and resume ever made.
func TestRailPauseEventsReadTheirPage(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	execAll(t, b.pool, `INSERT INTO outbox.rail_pause_events (rail_type, action, operator, reason, at)
		SELECT 'rail-' || (n % 20), CASE WHEN (n / 20) % 2 = 0 THEN 'PAUSED' ELSE 'RESUMED' END, 'olga', 'maintenance',
		       now() - interval '1 year' + n * interval '1 hour'
		FROM generate_series(1, 5000) n`,
		`ANALYZE outbox.rail_pause_events`)
	conn := b.conn(t)
	for _, mode := range planModes {
		setPlans(t, conn, mode)
		for range 6 {
			var events []store.RailPauseEvent
			read := readIn(t, conn, "rail_pause_events", func(tx pgx.Tx) {
				var err error
				if events, err = b.st.RailPauseEvents(b.ctx, tx, 20); err != nil {
					t.Fatal(err)
				}
			})
			if read > 21 {
				t.Fatalf("%s: the newest 20 pause events read %d rows or index entries of 5,000", mode, read)
			}
			if len(events) != 20 || !events[0].At.After(events[19].At) || events[0].RailType != "rail-0" {
				t.Fatalf("%s: listed %d events, newest %v (%s), want the 20 newest, newest first", mode, len(events), events[0].At, events[0].RailType)
			}
		}
	}
}
