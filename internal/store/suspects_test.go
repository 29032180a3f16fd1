package store_test

import (
	"testing"

	"github.com/ledgerline/outbox/internal/store"
)

// backlogWithoutStatistics writes 20,000 plain instructions (one per
// participant, not suspects) due at now() + due into pending, with
// autovacuum off for it, so that the statements after run without
// statistics, as on a fresh schema.
func backlogWithoutStatistics(t *testing.T, b *recordBundle, due string) {
	t.Helper()
	if _, err := b.pool.Exec(b.ctx, `ALTER TABLE outbox.pending SET (autovacuum_enabled = false)`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(b.ctx, `
INSERT INTO outbox.pending (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
                            payload, attempt_count, next_attempt_at, created_at)
SELECT gen_random_uuid(), 'i-' || g, 'p-' || g, 1, 'k-' || g, 'sandbox', '{}', 0, now() + $1::interval, now()
FROM generate_series(1, 20000) AS g`, due); err != nil {
		t.Fatal(err)
	}
}

// TestSuspectsDueReadsOnlySuspects: relayers ask whether suspects are due
// four times a second each, also while a backlog of plain instructions is
// waiting. The answer must come from the suspects' partial index, also
// before pending has statistics (a fresh schema, or a backlog loaded since
// the last ANALYZE), when the planner once chose to read every pending row.
func TestSuspectsDueReadsOnlySuspects(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	// Due a minute ago: every one of them could be claimed.
	backlogWithoutStatistics(t, b, "-1 minute")
	var analyzed bool
	if err := b.pool.QueryRow(b.ctx, `SELECT EXISTS (SELECT 1 FROM pg_stats
  WHERE schemaname = 'outbox' AND tablename = 'pending' AND attname = 'zombie_count')`).Scan(&analyzed); err != nil {
		t.Fatal(err)
	}
	if analyzed {
		t.Fatal("pending has statistics already: the check below would not run without them")
	}

	// check asks once in a transaction of its own and reports the answer
	// and how many pending rows the statement read from the table itself.
	check := func(when string) bool {
		t.Helper()
		tx, err := b.pool.Begin(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(b.ctx)
		// The counters also hold what the connection did before and has
		// not reported yet: the difference is the check's.
		scans := func() (n, rows int64) {
			t.Helper()
			if err := tx.QueryRow(b.ctx, `SELECT seq_scan, seq_tup_read FROM pg_stat_xact_user_tables
  WHERE schemaname = 'outbox' AND relname = 'pending'`).Scan(&n, &rows); err != nil {
				t.Fatal(err)
			}
			return n, rows
		}
		scans0, rows0 := scans()
		due, err := b.st.SuspectsDue(b.ctx, tx, []string{"sandbox"})
		if err != nil {
			t.Fatal(err)
		}
		if scans1, rows1 := scans(); scans1 > scans0 {
			t.Errorf("%s: %d sequential scans of pending reading %d rows to find suspects", when, scans1-scans0, rows1-rows0)
		}
		return due
	}

	if check("no statistics, no suspects") {
		t.Fatal("suspects due with none in pending")
	}
	if _, err := b.pool.Exec(b.ctx, `UPDATE outbox.pending SET zombie_count = 2, next_attempt_at = now() + interval '1 hour'
  WHERE instruction_id = 'i-17'`); err != nil {
		t.Fatal(err)
	}
	if check("no statistics, a suspect not yet due") {
		t.Fatal("suspects due with the only suspect due in an hour")
	}
	if _, err := b.pool.Exec(b.ctx, `UPDATE outbox.pending SET next_attempt_at = now() WHERE instruction_id = 'i-17'`); err != nil {
		t.Fatal(err)
	}
	if !check("no statistics, a suspect due") {
		t.Fatal("suspects not due with a suspect due")
	}
	if _, err := b.pool.Exec(b.ctx, `ANALYZE outbox.pending`); err != nil {
		t.Fatal(err)
	}
	if !check("with statistics, a suspect due") {
		t.Fatal("suspects not due with a suspect due")
	}
}

// TestSuspectsDueOnlyOfClaimableRails: a suspect counts as due only if a
// suspect claim of the same rails could take it: not on a rail the relayer
// does not claim, nor on a paused rail (or with every rail paused).
// Otherwise each relayer would isolate itself, draining every dispatch,
// only to claim nothing, 4 times a second for the whole pause.
func TestSuspectsDueOnlyOfClaimableRails(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	id := b.enqueue(t, "p-a", "a1")
	if _, err := b.pool.Exec(b.ctx, `UPDATE outbox.pending SET zombie_count = 2 WHERE outbox_id = $1`, id); err != nil {
		t.Fatal(err)
	}
	due := func(rails ...string) bool {
		t.Helper()
		ok, err := b.st.SuspectsDue(b.ctx, b.pool, rails)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if !due("sandbox", "other") {
		t.Fatal("a due suspect on a claimable rail is not due")
	}
	if due("other") {
		t.Fatal("a suspect on a rail the relayer does not claim is due")
	}
	if due() {
		t.Fatal("a suspect is due for a relayer with no rail to claim")
	}
	b.pause(t, "sandbox")
	if due("sandbox", "other") {
		t.Fatal("a suspect on a paused rail is due")
	}
	claimed, err := b.st.Claim(b.ctx, b.pool, store.ClaimParams{RelayerID: "r-1", Limit: 1, Leases: bothRails, Suspects: true})
	if err != nil || len(claimed) != 0 {
		t.Fatalf("suspect claim on a paused rail: %v, %v (the check above must agree with it)", outboxIDs(claimed), err)
	}
	b.resume(t, "sandbox")
	b.pause(t, store.AllRails)
	if due("sandbox", "other") {
		t.Fatal("a suspect is due with every rail paused")
	}
	b.resume(t, store.AllRails)
	if !due("sandbox") {
		t.Fatal("a suspect is not due after the resume")
	}
}

// TestClaimAskingAnswersAsSuspectsDue: a claim that asks whether suspects
// are due (the relayer's check, in the claim's round trip) answers as
// SuspectsDue does, only when asked, still leaves the suspect to a
// suspect claim, and reads the suspects' partial index under the claim's
// plan settings (generic plans, no bitmap scans) without statistics, as
// SuspectsDue alone does (TestSuspectsDueReadsOnlySuspects).
func TestClaimAskingAnswersAsSuspectsDue(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	// A backlog of instructions due in an hour: none is claimed, and a
	// sequential scan of them would show.
	backlogWithoutStatistics(t, b, "1 hour")
	suspect := b.enqueue(t, "p-a", "a1")
	if _, err := b.pool.Exec(b.ctx, `UPDATE outbox.pending SET zombie_count = 2 WHERE outbox_id = $1`, suspect); err != nil {
		t.Fatal(err)
	}
	plain := b.enqueue(t, "p-b", "b1")
	// The claims run on one connection of their own, outside a
	// transaction (so with the claim's plan settings); its statistics are
	// flushed before each read of the counters.
	conn := b.conn(t)
	seqScans := func() int64 {
		t.Helper()
		// Flushed at the end of each statement, this one's too.
		for range 2 {
			if _, err := conn.Exec(b.ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
				t.Fatal(err)
			}
		}
		var n int64
		if err := conn.QueryRow(b.ctx, `SELECT coalesce(seq_scan, 0) FROM pg_stat_user_tables
  WHERE schemaname = 'outbox' AND relname = 'pending'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	ask := func(suspectRails ...string) ([]store.Claimed, bool) {
		t.Helper()
		before := seqScans()
		claimed, due, err := b.st.ClaimAsking(b.ctx, conn, store.ClaimParams{RelayerID: "r-1", Limit: 10, Leases: bothRails}, suspectRails)
		if err != nil {
			t.Fatal(err)
		}
		if n := seqScans() - before; n > 0 {
			t.Errorf("asking for %v: %d sequential scans of pending", suspectRails, n)
		}
		return claimed, due
	}
	claimed, due := ask("sandbox", "other")
	if !due {
		t.Error("a claim asking about claimable rails did not report the due suspect")
	}
	if len(claimed) != 1 || claimed[0].OutboxID != plain {
		t.Errorf("claimed %v, want only the plain instruction %v (the suspect is a suspect claim's)", outboxIDs(claimed), plain)
	}
	if _, due := ask("other"); due {
		t.Error("a suspect on a rail the relayer does not claim is reported due")
	}
	if _, due := ask(); due {
		t.Error("a claim that did not ask reported suspects due")
	}
	// The answer agrees with SuspectsDue's.
	if alone, err := b.st.SuspectsDue(b.ctx, b.pool, []string{"sandbox"}); err != nil || !alone {
		t.Fatalf("SuspectsDue: %v, %v", alone, err)
	}
}
