package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerline/outbox/internal/store"
)

// TestReapReadsByKey: a reaper pass reads the in-flight table once (there
// is no index on the lease, by design) and otherwise reaches rows by key,
// also when pending's and inflight's statistics are those of vacuumed
// empty tables (0 rows on their pages: PostgreSQL then estimates one row
// whatever they hold), as after a quiet spell before an incident. Joins
// the planner chose read the in-flight table once per expired row and
// every waiting row of pending to promote a poison instruction's
// successor.
func TestReapReadsByKey(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	statisticsOfEmpty(t, b.pool, "pending", "inflight")
	poison := b.enqueue(t, "p1", "k1")
	successor := b.enqueue(t, "p1", "k2")
	b.enqueue(t, "p2", "k3")
	claims := []store.Claimed{b.claimOne(t, "dead", shortLease), b.claimOne(t, "dead", shortLease)}
	// k1 has been reaped as often as the limit allows (as
	// TestPoisonInstructionIsDeadLettered gets there): this expiry makes
	// it a dead letter and k2 its participant's head.
	if _, err := b.pool.Exec(b.ctx, `UPDATE outbox.inflight SET zombie_count = 3 WHERE outbox_id = $1`, poison); err != nil {
		t.Fatal(err)
	}
	// What the rest of the fleet holds, and the backlog.
	for _, q := range []string{`
INSERT INTO outbox.inflight (outbox_id, attempt_id, attempt_no, relayer_id, ordered, claimed_at, lease_until,
                             instruction_id, participant_id, sequence_id, idempotency_key, rail_type, payload, created_at)
SELECT gen_random_uuid(), gen_random_uuid(), 1, 'alive', false, now(), now() + interval '1 hour',
       'i-' || g, 'busy-' || g, 1, 'k-' || g, 'sandbox', '{}', now()
FROM generate_series(1, 5000) AS g`, otherBacklogSQL} {
		if _, err := b.pool.Exec(b.ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	wantStatisticsOfEmpty(t, b.pool, "pending", "inflight")
	b.waitExpired(t, claims...)

	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(b.ctx)
	tables := []string{"outbox.pending", "outbox.inflight"}
	before := readsOf(t, tx, tables...)
	reaped, err := b.st.Reap(b.ctx, tx, 100, "test-reaper", 3)
	if err != nil {
		t.Fatal(err)
	}
	after := readsOf(t, tx, tables...)
	if len(reaped) != 2 {
		t.Fatalf("reaped %+v, want the two expired claims", reaped)
	}
	// Two passes over inflight (the lock statement's and the reap's), and
	// a few index entries: the rows found by key.
	if n := after[0].seqTuples - before[0].seqTuples; n > 0 {
		t.Errorf("sequential scans read %d rows of pending", n)
	}
	if n := after[0].indexEntries - before[0].indexEntries; n > 20 {
		t.Errorf("pending's indexes returned %d entries for two expired claims", n)
	}
	if n := after[1].seqTuples - before[1].seqTuples; n > 2*5002 {
		t.Errorf("sequential scans read %d rows of inflight, which holds 5,002", n)
	}
	if n := after[1].indexEntries - before[1].indexEntries; n > 20 {
		t.Errorf("inflight's indexes returned %d entries for two expired claims", n)
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	if w := b.where(t, poison); !w.dead || w.pending || w.inflight != nil {
		t.Errorf("poison instruction is %+v, want a dead letter", w)
	}
	var due bool
	if err := b.pool.QueryRow(b.ctx, `SELECT next_attempt_at <= now() FROM outbox.pending WHERE outbox_id = $1`, successor).Scan(&due); err != nil || !due {
		t.Errorf("the poison instruction's successor: due %v (%v), want due", due, err)
	}
}

// TestReapLeavesAClaimItDidNotLockForTheNextPass guards the reaper's
// participant lock against a claim that commits between its two
// statements with its lease already over (a claim or a hand-off whose
// transaction waited for locks longer than the lease: its lease is
// counted from the transaction's start). The lock statement did not see
// that claim, so its participant was not locked, and the reap, which did
// see it, requeued it anyway: a replay of a lower sequence of that
// participant running meanwhile saw the instruction in flight and left
// the replayed one waiting, while the reap, from a snapshot without the
// replayed one, made the requeued copy due. The replayed instruction then
// waited with nothing in flight, and no claim takes the copy with a lower
// sequence pending: the participant stranded. Here the lock statement
// waits for another participant's lock (p1's, which the reap needs too)
// while the claim commits, and the reap waits for a row of p1 while the
// replay runs.
func TestReapLeavesAClaimItDidNotLockForTheNextPass(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	reaperConn := b.conn(t)
	if _, err := b.st.Reap(b.ctx, reaperConn, 10, "test-reaper", 0); err != nil { // its statements prepared
		t.Fatal(err)
	}
	// p1: a replayed dead letter waits behind an expired claim, so the
	// reap locks p1 and, making the replayed one due, one of its rows.
	oDead, _, oHeld := b.replayedBehindInFlight(t, "dies", shortLease)
	// p2: a dead letter, then the instruction the late claim takes, then
	// one waiting behind it.
	pDead := b.enqueue(t, "p2", "p2-k1")
	pClaimed := b.enqueue(t, "p2", "p2-k2")
	pThird := b.enqueue(t, "p2", "p2-k3")
	b.record(t, recordOutcome(t, b.claimOne(t, "r1", longLease), "r1", store.Failed))

	late, err := b.ownConn(t).Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = late.Rollback(b.ctx) }()
	claimed, err := b.st.Claim(b.ctx, late, store.ClaimParams{RelayerID: "slow", Limit: 1, Leases: map[string]time.Duration{"sandbox": shortLease}})
	if err != nil || len(claimed) != 1 || claimed[0].OutboxID != pClaimed {
		t.Fatalf("claim: %v, %v; want %s", outboxIDs(claimed), err, pClaimed)
	}
	b.waitExpired(t, oHeld, claimed[0])

	lockConn, rowConn := b.ownConn(t), b.ownConn(t)
	lockTx, err := lockConn.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lockTx.Rollback(b.ctx) }()
	execAll(t, lockTx, `SELECT 1 FROM outbox.sequences WHERE participant_id = 'p1' FOR UPDATE`)
	rowTx, err := rowConn.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rowTx.Rollback(b.ctx) }()
	if _, err := rowTx.Exec(b.ctx, `SELECT 1 FROM outbox.pending WHERE outbox_id = $1 FOR UPDATE`, oDead); err != nil {
		t.Fatal(err)
	}

	done := make(chan error, 1)
	pid := reaperConn.Conn().PgConn().PID()
	go func() {
		_, err := b.st.Reap(b.ctx, reaperConn, 10, "test-reaper", 0)
		done <- err
	}()
	b.waitBlockedBy(t, pid, lockConn.PgConn().PID(), done) // the lock statement, waiting for p1's lock
	if err := late.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	if err := lockTx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	b.waitBlockedBy(t, pid, rowConn.PgConn().PID(), done) // the reap, waiting for p1's row
	b.replay(t, pDead)
	if err := rowTx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Passes until nothing is left to reap, as the reaper's loop runs them.
	for range 3 {
		if _, err := b.st.Reap(b.ctx, b.pool, 10, "test-reaper", 0); err != nil {
			t.Fatal(err)
		}
	}
	b.verifyOK(t)
	if !b.due(t, pDead) || b.due(t, pClaimed) || b.due(t, pThird) {
		t.Fatal("want p2's replayed instruction due, the requeued one and the third waiting")
	}
}

// ownConn opens a connection to the bundle's database outside its pool,
// for the rest of the test: a test that holds several transactions open
// at once would otherwise wait for a connection of the pool itself.
func (b *recordBundle) ownConn(t *testing.T) *pgx.Conn {
	t.Helper()
	conn, err := pgx.ConnectConfig(b.ctx, b.pool.Config().ConnConfig.Copy())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// waitBlockedBy waits (bounded) until the backend pid waits for a lock
// the backend blocker holds; done has the answer of the statement pid
// runs, which fails the test if it finishes first.
func (b *recordBundle) waitBlockedBy(t *testing.T, pid, blocker uint32, done chan error) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		var waiting bool
		if err := b.pool.QueryRow(b.ctx, `SELECT $2::int = ANY (pg_blocking_pids($1))`, int64(pid), int64(blocker)).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			return
		}
		select {
		case err := <-done:
			t.Fatalf("the statement finished (%v) before it waited for backend %d", err, blocker)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for backend %d to block backend %d", blocker, pid)
		}
	}
}

// TestReapSkipsARowAnotherTransactionHolds: a pass skips an expired
// in-flight row that another transaction holds (another reaper's pass,
// an outcome write deleting it), requeues the others and returns, rather
// than waiting for that transaction. With ordering off, so that no
// participant's lock is in the way. Without SKIP LOCKED, the pass waited.
func TestReapSkipsARowAnotherTransactionHolds(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	if err := b.st.SetOrdered(b.ctx, b.pool, false); err != nil {
		t.Fatal(err)
	}
	held, free := b.enqueue(t, "p1", "k1"), b.enqueue(t, "p2", "k2")
	c1, c2 := b.claimOne(t, "dead", shortLease), b.claimOne(t, "dead", shortLease)
	if c1.OutboxID != held || c2.OutboxID != free {
		t.Fatalf("claimed %s and %s, want %s then %s", c1.OutboxID, c2.OutboxID, held, free)
	}
	b.waitExpired(t, c1, c2)
	holder := b.ownConn(t)
	tx, err := holder.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(b.ctx) }()
	if _, err := tx.Exec(b.ctx, `SELECT 1 FROM outbox.inflight WHERE outbox_id = $1 FOR UPDATE`, held); err != nil {
		t.Fatal(err)
	}

	conn := b.conn(t)
	type reaped struct {
		requeued []store.Requeued
		err      error
	}
	done := make(chan reaped, 1)
	go func() {
		requeued, err := b.st.Reap(b.ctx, conn, 10, "test-reaper", 0)
		done <- reaped{requeued, err}
	}()
	// The pass either ends or waits for the held row; polled, since a
	// pass that skips has nothing to wait for.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		select {
		case r := <-done:
			if r.err != nil {
				t.Fatal(r.err)
			}
			if len(r.requeued) != 1 || r.requeued[0].OutboxID != free {
				t.Fatalf("requeued %+v, want %s alone", r.requeued, free)
			}
			return
		default:
		}
		var waiting bool
		if err := b.pool.QueryRow(b.ctx, `SELECT $2::int = ANY (pg_blocking_pids($1))`,
			int64(conn.Conn().PgConn().PID()), int64(holder.PgConn().PID())).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			_ = tx.Rollback(b.ctx)
			<-done
			t.Fatal("the pass waited for an in-flight row another transaction holds")
		}
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting for the pass")
		}
	}
}

// TestReapTakesTheOldestLeasesFirst: a pass that finds more expired
// leases than its limit requeues the oldest first, wherever their rows
// lie in the table (the row of the lease that ended first here lies last,
// moved by an update). Without the pass's ORDER BY it took the rows in the
// table's order.
func TestReapTakesTheOldestLeasesFirst(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	var claims []store.Claimed
	for _, p := range []string{"p1", "p2", "p3"} {
		b.enqueue(t, p, "k-"+p)
		claims = append(claims, b.claimOne(t, "dead", shortLease))
	}
	b.waitExpired(t, claims...)
	oldest := claims[2]
	if _, err := b.pool.Exec(b.ctx, `UPDATE outbox.inflight SET lease_until = now() - interval '1 hour' WHERE outbox_id = $1`, oldest.OutboxID); err != nil {
		t.Fatal(err)
	}
	requeued, err := b.st.Reap(b.ctx, b.pool, 1, "test-reaper", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(requeued) != 1 || requeued[0].OutboxID != oldest.OutboxID {
		t.Fatalf("requeued %+v, want %s (its lease ended an hour ago)", requeued, oldest.OutboxID)
	}
}
