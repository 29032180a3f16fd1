package store_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/engine"
	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/pending"
	"github.com/ledgerline/outbox/rails"
	"github.com/ledgerline/outbox/reaper"
	"github.com/ledgerline/outbox/relay"
)

// splitCurrentMonth replaces the current month's archive partition (empty:
// the database is new) by two that meet at `at`, so that a partition
// boundary, what a new month is to the archive, falls inside the test.
// It returns the two partitions' names. One transaction: a reaper
// running beside it (TestFleetThroughPartitionBoundary's) would otherwise
// recreate the whole month's partition (ensure_attempt_partitions) between
// the drop and the creates.
func splitCurrentMonth(t *testing.T, pool *pgxpool.Pool, at time.Time) (string, string) {
	t.Helper()
	ctx := t.Context()
	var start, end time.Time
	if err := pool.QueryRow(ctx, `SELECT date_trunc('month', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'`).Scan(&start); err != nil {
		t.Fatal(err)
	}
	end = start.AddDate(0, 1, 0)
	if !at.Before(end) {
		t.Skipf("%v is in the next month: run the test again", at)
	}
	first := "attempts_" + start.UTC().Format("2006_01")
	second := first + "_b"
	lit := func(tm time.Time) string { return "'" + tm.UTC().Format(time.RFC3339Nano) + "'" }
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		execAll(t, tx,
			"ALTER TABLE outbox.attempts DETACH PARTITION outbox."+first,
			"DROP TABLE outbox."+first,
			fmt.Sprintf("CREATE TABLE outbox.%s PARTITION OF outbox.attempts FOR VALUES FROM (%s) TO (%s)", first, lit(start), lit(at)),
			fmt.Sprintf("CREATE TABLE outbox.%s PARTITION OF outbox.attempts FOR VALUES FROM (%s) TO (%s)", second, lit(at), lit(end)),
		)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return first, second
}

// historyBefore sets up a test whose history must be written before a
// partition boundary: a fresh bundle, its current month split
// (splitCurrentMonth) at a boundary window from now, then write. On a
// loaded machine write can outlast a fixed window, its last rows landing
// after the boundary, and the test then failed on what it checks (3 runs
// in 15 of TestRetireDetachedKeysOncePerPartition under load: "retire: 2
// <nil>, 1 keys left"). So the boundary must still be ahead, on the
// database's clock, once write has returned; if it is not, the scenario
// starts over on a fresh database with twice the window, at most 5 times.
// write must set up its state anew on each call.
func historyBefore(t *testing.T, window time.Duration, write func(b *recordBundle)) (b *recordBundle, boundary time.Time, old, current string) {
	t.Helper()
	for range 5 {
		b = setupRecord(t)
		boundary = time.Now().Add(window).Truncate(time.Millisecond)
		old, current = splitCurrentMonth(t, b.pool, boundary)
		write(b)
		var ahead bool
		if err := b.pool.QueryRow(b.ctx, `SELECT clock_timestamp() < $1`, boundary).Scan(&ahead); err != nil {
			t.Fatal(err)
		}
		if ahead {
			return b, boundary, old, current
		}
		t.Logf("the history before the boundary took longer than %v to write; again with %v", window, 2*window)
		window *= 2
	}
	t.Fatalf("the history before the boundary took longer than %v to write, 5 times", window/2)
	return nil, time.Time{}, "", ""
}

// partitionStates maps each archive partition to its state.
func partitionStates(t *testing.T, b *recordBundle) map[string]store.Partition {
	t.Helper()
	parts, err := b.st.Partitions(b.ctx, b.pool, true)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]store.Partition{}
	for _, p := range parts {
		out[p.Name] = p
	}
	return out
}

// TestArchiveDetachRetireExport takes an archive through its lifecycle
// across a partition boundary: history written on both sides of it,
// detach refused until a checkpoint covers the older partition, then
// detached (still verified, still in trails, still append-only), its keys
// retired (dispatched and cancelled instructions', and acknowledged dead
// letters', which leave dead_letters; a replay of one is refused with ErrKeyRetired and writes
// nothing; keys of instructions in flight or dead-lettered stay), the
// partition exported to CSV, and finally dropped, which verify reports.
func TestArchiveDetachRetireExport(t *testing.T) {
	t.Parallel()
	var (
		dispatched                                  []uuid.UUID
		cancelled, acked, ackedLater, ackedReplayed uuid.UUID
	)
	acknowledge := func(b *recordBundle, id uuid.UUID) {
		t.Helper()
		if ok, err := b.st.Acknowledge(b.ctx, b.pool, id, "olga", "refunded by hand"); err != nil || !ok {
			t.Fatalf("acknowledge: %v %v", ok, err)
		}
	}
	b, boundary, old, current := historyBefore(t, 1500*time.Millisecond, func(b *recordBundle) {
		// Before the boundary: three dispatched on p1, a dead letter on p2,
		// one left in flight on p3.
		dispatched = nil
		for i := range 3 {
			dispatched = append(dispatched, b.enqueue(t, "p1", fmt.Sprintf("old-%d", i)))
			b.record(t, recordOutcome(t, b.claimOne(t, "r1", longLease), "r1", store.Dispatched))
		}
		b.enqueue(t, "p2", "old-dead")
		b.record(t, recordOutcome(t, b.claimOne(t, "r1", longLease), "r1", store.Failed))
		b.enqueue(t, "p3", "old-inflight")
		b.claimOne(t, "r1", longLease)
		cancelled = b.enqueue(t, "p4", "old-cancelled")
		if ok, err := b.st.Cancel(b.ctx, b.pool, cancelled, "olga", "recalled"); err != nil || !ok {
			t.Fatalf("cancel: %v %v", ok, err)
		}
		// Dead letters: one acknowledged (it leaves with its key), one
		// acknowledged only after the boundary (in the month still
		// attached: it stays), one acknowledged, replayed and dispatched
		// after the boundary (it did not end in the old month: its key
		// stays).
		deadLetter := func(participant, key string) uuid.UUID {
			t.Helper()
			id := b.enqueue(t, participant, key)
			b.record(t, recordOutcome(t, b.claimOne(t, "r1", longLease), "r1", store.Failed))
			return id
		}
		acked = deadLetter("p5", "old-acked")
		acknowledge(b, acked)
		ackedLater = deadLetter("p7", "old-acked-later")
		ackedReplayed = deadLetter("p6", "old-acked-replayed")
		acknowledge(b, ackedReplayed)
		if ok, err := b.st.Replay(b.ctx, b.pool, ackedReplayed, "olga", "sent after all"); err != nil || !ok {
			t.Fatalf("replay: %v %v", ok, err)
		}
	})
	time.Sleep(time.Until(boundary) + 50*time.Millisecond)
	acknowledge(b, ackedLater)
	if c := b.claimOne(t, "r1", longLease); c.OutboxID != ackedReplayed {
		t.Fatalf("claimed %s, want the replayed %s", c.OutboxID, ackedReplayed)
	} else {
		b.record(t, recordOutcome(t, c, "r1", store.Dispatched))
	}
	fresh := b.enqueue(t, "p1", "new-0")
	b.record(t, recordOutcome(t, b.claimOne(t, "r1", longLease), "r1", store.Dispatched))

	parts := partitionStates(t, b)
	if parts[old].Rows == 0 || parts[current].Rows == 0 || parts[old].State != "attached" {
		t.Fatalf("the history does not straddle the boundary: %+v", parts)
	}
	oldRows := parts[old].Rows

	if _, err := b.st.DetachArchive(b.ctx, b.pool, boundary, time.Second); !errors.Is(err, store.ErrArchiveLifecycle) {
		t.Fatalf("detach before any checkpoint covers it: %v, want ErrArchiveLifecycle", err)
	}
	b.checkpoint(t)
	detached, err := b.st.DetachArchive(b.ctx, b.pool, boundary, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(detached) != 1 || detached[0] != old {
		t.Fatalf("detached %v, want [%s]", detached, old)
	}
	parts = partitionStates(t, b)
	if parts[old].State != "detached" || parts[old].Rows != oldRows || parts[current].State != "attached" {
		t.Fatalf("after detach: %+v", parts)
	}
	if got, _ := b.trail(t, dispatched[0]); len(got) != 2 {
		t.Fatalf("trail of a detached instruction: %v", got)
	}
	if _, err := b.pool.Exec(b.ctx, "UPDATE outbox."+old+" SET rail_reference = 'forged'"); err == nil {
		t.Fatal("a detached partition took an UPDATE")
	}
	if again, err := b.st.DetachArchive(b.ctx, b.pool, boundary, time.Second); err != nil || len(again) != 0 {
		t.Fatalf("detach again: %v %v, want nothing to do", again, err)
	}
	b.verifyOK(t)

	retired, err := b.st.RetireKeys(b.ctx, b.pool, old, 2)
	if err != nil {
		t.Fatal(err)
	}
	if retired != 5 {
		t.Fatalf("retired %d keys, want the 3 dispatched, the one cancelled and the one acknowledged before the boundary", retired)
	}
	rows, err := b.pool.Query(b.ctx, `SELECT outbox_id FROM outbox.dead_letters ORDER BY failed_at`)
	if err != nil {
		t.Fatal(err)
	}
	left, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 2 || left[1] != ackedLater {
		t.Fatalf("dead letters left %v, want the unacknowledged one (p2) and %s, acknowledged after the boundary", left, ackedLater)
	}
	if ok, err := b.st.Replay(b.ctx, b.pool, acked, "olga", "too late"); err != nil || ok {
		t.Fatalf("replay of a dead letter acknowledged in a detached month: %v %v, want not found", ok, err)
	}
	if again, err := b.st.RetireKeys(b.ctx, b.pool, old, 0); err != nil || again != 0 {
		t.Fatalf("retire again: %d %v", again, err)
	}
	b.verifyOK(t)
	var queued int
	count := func() int {
		if err := b.pool.QueryRow(b.ctx, `SELECT (SELECT count(*) FROM outbox.pending) + (SELECT count(*) FROM outbox.idempotency_keys)
		                                 + (SELECT next_sequence_id FROM outbox.sequences WHERE participant_id = 'p1')`).Scan(&queued); err != nil {
			t.Fatal(err)
		}
		return queued
	}
	before := count()
	_, err = b.producer.Enqueue(b.ctx, b.pool, pending.Instruction{
		InstructionID: "ins-old-0", ParticipantID: "p1", IdempotencyKey: "old-0",
		RailType: "sandbox", AmountMinor: 100, Currency: "USD", Destination: "acct-1",
	})
	var re *pending.RetiredError
	if !errors.As(err, &re) || !errors.Is(err, pending.ErrKeyRetired) || re.OutboxID != dispatched[0] {
		t.Fatalf("replay of a retired key: %v, want a RetiredError for %s", err, dispatched[0])
	}
	if after := count(); after != before {
		t.Fatalf("the refused replay wrote something: %d rows before, %d after", before, after)
	}
	_, err = b.producer.Enqueue(b.ctx, b.pool, pending.Instruction{
		InstructionID: "ins-old-cancelled", ParticipantID: "p4", IdempotencyKey: "old-cancelled",
		RailType: "sandbox", AmountMinor: 100, Currency: "USD", Destination: "acct-1",
	})
	if !errors.As(err, &re) || re.OutboxID != cancelled {
		t.Fatalf("enqueue of a cancelled instruction's retired key: %v, want a RetiredError for %s", err, cancelled)
	}
	for _, key := range []string{"old-dead", "old-inflight", "new-0", "old-acked-later", "old-acked-replayed"} {
		r, err := b.producer.Enqueue(b.ctx, b.pool, pending.Instruction{
			InstructionID: "ins-" + key, ParticipantID: map[string]string{"old-dead": "p2", "old-inflight": "p3", "new-0": "p1",
				"old-acked-later": "p7", "old-acked-replayed": "p6"}[key],
			IdempotencyKey: key, RailType: "sandbox", AmountMinor: 100, Currency: "USD", Destination: "acct-1",
		})
		if err != nil || !r.Duplicate {
			t.Fatalf("replay of live key %s: %+v %v, want the original receipt", key, r, err)
		}
		if key == "new-0" && r.OutboxID != fresh {
			t.Fatalf("replay of new-0: outbox %s, want %s", r.OutboxID, fresh)
		}
	}
	// A live key belongs to its instruction id (migration 028); a retired
	// one is remembered only as its instruction's, so another instruction
	// id may take it, and the retired instruction is still refused as
	// retired, not as the new owner's mismatch or a retirement race.
	taken := pending.Instruction{
		InstructionID: "ins-later", ParticipantID: "p1", IdempotencyKey: "old-0",
		RailType: "sandbox", AmountMinor: 100, Currency: "USD", Destination: "acct-1",
	}
	if r, err := b.producer.Enqueue(b.ctx, b.pool, taken); err != nil || r.Duplicate {
		t.Fatalf("another instruction id under a retired key: %+v %v, want a fresh receipt", r, err)
	}
	_, err = b.producer.Enqueue(b.ctx, b.pool, pending.Instruction{
		InstructionID: "ins-old-0", ParticipantID: "p1", IdempotencyKey: "old-0",
		RailType: "sandbox", AmountMinor: 100, Currency: "USD", Destination: "acct-1",
	})
	if !errors.As(err, &re) || re.OutboxID != dispatched[0] {
		t.Fatalf("the retired instruction once its key was taken: %v, want a RetiredError for %s", err, dispatched[0])
	}
	taken.InstructionID = "ins-live-key-thief"
	taken.IdempotencyKey = "new-0"
	if _, err := b.producer.Enqueue(b.ctx, b.pool, taken); !errors.Is(err, pending.ErrIdempotencyMismatch) {
		t.Fatalf("another instruction id under a live key: %v, want ErrIdempotencyMismatch", err)
	}

	var csv bytes.Buffer
	conn := b.conn(t)
	n, err := b.st.ExportPartition(b.ctx, conn.Conn(), old, &csv)
	if err != nil {
		t.Fatal(err)
	}
	lines := 0
	for sc := bufio.NewScanner(&csv); sc.Scan(); lines++ {
		if lines == 0 && !strings.Contains(sc.Text(), "attempt_id") {
			t.Fatalf("no header: %q", sc.Text())
		}
	}
	if n != oldRows || int64(lines) != n+1 {
		t.Fatalf("export: %d rows, %d lines; the partition holds %d rows", n, lines, oldRows)
	}
	if _, err := b.st.ExportPartition(b.ctx, conn.Conn(), "pending", &csv); !errors.Is(err, store.ErrArchiveLifecycle) {
		t.Fatalf("export of a table that is not an archive partition: %v", err)
	}

	// Dropping the detached month (after the export, say) is what the
	// checkpoints detect.
	if _, err := b.pool.Exec(b.ctx, "DROP TABLE outbox."+old); err != nil {
		t.Fatal(err)
	}
	wantBreak(t, b.verifyTampered(t, nil), "checkpoint digests")
}

// TestRetireDetachedKeysOncePerPartition: the keys of a detached month are
// retired in one pass, recorded when it ends; a month whose pass is
// recorded is not read again, and one whose pass is not (cut short) is
// done by the next call.
func TestRetireDetachedKeysOncePerPartition(t *testing.T) {
	t.Parallel()
	var dispatched []uuid.UUID
	b, boundary, old, current := historyBefore(t, time.Second, func(b *recordBundle) {
		dispatched = nil
		for i := range 3 {
			dispatched = append(dispatched, b.enqueue(t, fmt.Sprintf("p%d", i), fmt.Sprintf("old-%d", i)))
			b.record(t, recordOutcome(t, b.claimOne(t, "r1", longLease), "r1", store.Dispatched))
		}
	})
	time.Sleep(time.Until(boundary) + 50*time.Millisecond)
	b.checkpoint(t)
	if detached, err := b.st.DetachArchive(b.ctx, b.pool, boundary, time.Second); err != nil || len(detached) != 1 {
		t.Fatalf("detach: %v %v", detached, err)
	}
	if p := partitionStates(t, b)[old]; !p.KeysRetired.IsZero() || p.RetiredKeys != 0 {
		t.Fatalf("%s before any pass: %+v", old, p)
	}
	liveKeys := func() int {
		t.Helper()
		var n int
		if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox.idempotency_keys WHERE outbox_id = ANY($1)`, dispatched).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	// A pass recorded as finished: the month is not read again.
	if _, err := b.pool.Exec(b.ctx, `INSERT INTO outbox.key_retirements (partition_name, retired_keys) VALUES ($1, 0)`, old); err != nil {
		t.Fatal(err)
	}
	if n, err := b.st.RetireDetachedKeys(b.ctx, b.pool, 0); err != nil || n != 0 || liveKeys() != 3 {
		t.Fatalf("retire with the pass recorded: %d %v, %d keys left; want 0 and the 3 keys untouched", n, err, liveKeys())
	}

	// Not recorded (a pass cut short): done, then recorded.
	execAll(t, b.pool, `DELETE FROM outbox.key_retirements`)
	if n, err := b.st.RetireDetachedKeys(b.ctx, b.pool, 2); err != nil || n != 3 || liveKeys() != 0 {
		t.Fatalf("retire: %d %v, %d keys left; want 3 and none", n, err, liveKeys())
	}
	parts := partitionStates(t, b)
	if p := parts[old]; p.KeysRetired.IsZero() || p.RetiredKeys != 3 {
		t.Fatalf("%s after its pass: %+v, want it recorded with 3 keys", old, p)
	}
	if p := parts[current]; !p.KeysRetired.IsZero() {
		t.Fatalf("the attached %s shows a pass: %+v", current, p)
	}
	if n, err := b.st.RetireDetachedKeys(b.ctx, b.pool, 0); err != nil || n != 0 {
		t.Fatalf("retire again: %d %v", n, err)
	}
	var passes int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox.key_retirements`).Scan(&passes); err != nil || passes != 1 {
		t.Fatalf("%d passes recorded (%v), want 1", passes, err)
	}
	b.verifyOK(t)
}

// TestRetireDetachedKeysCountsARunCutShort: a month's pass cut short
// after it removed keys (a detach killed before the pass was recorded;
// here, RetireKeys, which records nothing) and finished by the next run
// counts those keys too: `archive list` showed the month with 0 retired
// keys, all of them retired (test.TestCrashArchiveDetach kills the
// command there).
func TestRetireDetachedKeysCountsARunCutShort(t *testing.T) {
	t.Parallel()
	// Its history before the boundary written on a loaded machine could
	// outlast a fixed second, and the detached month held nothing to
	// retire ("the run cut short: 0 <nil>").
	b, boundary, old, _ := historyBefore(t, time.Second, func(b *recordBundle) {
		for i := range 3 {
			b.enqueue(t, fmt.Sprintf("p%d", i), fmt.Sprintf("old-%d", i))
			b.record(t, recordOutcome(t, b.claimOne(t, "r1", longLease), "r1", store.Dispatched))
		}
	})
	time.Sleep(time.Until(boundary) + 50*time.Millisecond)
	b.checkpoint(t)
	if detached, err := b.st.DetachArchive(b.ctx, b.pool, boundary, time.Second); err != nil || len(detached) != 1 {
		t.Fatalf("detach: %v %v", detached, err)
	}
	if n, err := b.st.RetireKeys(b.ctx, b.pool, old, 2); err != nil || n != 3 {
		t.Fatalf("the run cut short: %d %v, want 3 keys moved", n, err)
	}
	if n, err := b.st.RetireDetachedKeys(b.ctx, b.pool, 0); err != nil || n != 0 {
		t.Fatalf("the run that finishes the pass: %d %v, want nothing left to move", n, err)
	}
	if p := partitionStates(t, b)[old]; p.KeysRetired.IsZero() || p.RetiredKeys != 3 {
		t.Fatalf("%s after its pass: %+v, want it recorded with its 3 keys", old, p)
	}
	b.verifyOK(t)
}

// TestRetiredKeyRace: a key retired while an enqueue of it waits on the
// old row's lock is refused (the enqueue's transaction fails) and never
// enqueued twice.
func TestRetiredKeyRace(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	id := b.enqueue(t, "p1", "k-race")
	b.record(t, recordOutcome(t, b.claimOne(t, "r1", longLease), "r1", store.Dispatched))
	month := "attempts_" + time.Now().UTC().Format("2006_01")

	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(b.ctx)
	if n, err := b.st.RetireKeys(b.ctx, tx, month, 0); err != nil || n != 1 {
		t.Fatalf("retire: %d %v", n, err)
	}
	done := make(chan error, 1)
	go func() {
		err := pgx.BeginFunc(b.ctx, b.pool, func(ptx pgx.Tx) error {
			_, err := b.producer.Enqueue(b.ctx, ptx, pending.Instruction{
				InstructionID: "ins-k-race", ParticipantID: "p1", IdempotencyKey: "k-race",
				RailType: "sandbox", AmountMinor: 100, Currency: "USD", Destination: "acct-1",
			})
			return err
		})
		done <- err
	}()
	// Wait until the enqueue waits on the retirement's row lock.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var waiting bool
		if err := b.pool.QueryRow(b.ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database())`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the enqueue never waited on the retiring transaction")
		}
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	err = <-done
	if !errors.Is(err, pending.ErrKeyRetired) {
		t.Fatalf("enqueue racing the retirement: %v, want ErrKeyRetired", err)
	}
	var live, pendingRows int
	if err := b.pool.QueryRow(b.ctx, `SELECT (SELECT count(*) FROM outbox.idempotency_keys WHERE idempotency_key = 'k-race'),
	                                         (SELECT count(*) FROM outbox.pending)`).Scan(&live, &pendingRows); err != nil {
		t.Fatal(err)
	}
	if live != 0 || pendingRows != 0 {
		t.Fatalf("after the race: %d live keys, %d pending rows; want none", live, pendingRows)
	}
	b.verifyOK(t)
	_ = id
}

// TestInstructionIDAfterRetirement: an instruction id has one key per
// tenant (migration 030) while its key is live, also while the key's
// digest waits beside it for older snapshots to end; once the key is
// retired, its row is gone and the instruction id may take another key,
// as a retired key may be taken by another instruction id (the digest
// remembers the pair only). The retired pair itself is refused forever.
func TestInstructionIDAfterRetirement(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	in := func(key string) pending.Instruction {
		return pending.Instruction{InstructionID: "ins-life", ParticipantID: "p1", IdempotencyKey: key,
			RailType: "sandbox", AmountMinor: 100, Currency: "USD", Destination: "acct-1"}
	}
	reused := func(err error, owner string, ownerID uuid.UUID) bool {
		var ir *pending.InstructionReusedError
		return errors.Is(err, pending.ErrInstructionIDReused) && errors.As(err, &ir) && ir.OwnerKey == owner && ir.OutboxID == ownerID
	}
	first, err := b.producer.Enqueue(b.ctx, b.pool, in("life-1"))
	if err != nil {
		t.Fatal(err)
	}
	b.record(t, recordOutcome(t, b.claimOne(t, "r1", longLease), "r1", store.Dispatched))
	if _, err := b.producer.Enqueue(b.ctx, b.pool, in("life-2")); !reused(err, "life-1", first.OutboxID) {
		t.Fatalf("ins-life under a second key while live: %v, want it refused naming life-1", err)
	}
	// The digest committed, the key still live (a retirement waiting for
	// older snapshots): still the instruction's key.
	execAll(t, b.pool, `INSERT INTO outbox.retired_keys (digest, outbox_id, tenant_id, participant_id, sequence_id, created_at)
		SELECT outbox.key_digest(tenant_id, instruction_id, idempotency_key), outbox_id, nullif(tenant_id, ''), participant_id, sequence_id, created_at
		FROM outbox.idempotency_keys WHERE idempotency_key = 'life-1'`)
	if _, err := b.producer.Enqueue(b.ctx, b.pool, in("life-2")); !reused(err, "life-1", first.OutboxID) {
		t.Fatalf("ins-life under a second key beside its key's digest: %v, want it refused naming life-1", err)
	}

	month := "attempts_" + time.Now().UTC().Format("2006_01")
	if n, err := b.st.RetireKeys(b.ctx, b.pool, month, 0); err != nil || n != 1 {
		t.Fatalf("retire: %d %v, want the one key", n, err)
	}
	var re *pending.RetiredError
	if _, err := b.producer.Enqueue(b.ctx, b.pool, in("life-1")); !errors.As(err, &re) || re.OutboxID != first.OutboxID {
		t.Fatalf("the retired pair: %v, want a RetiredError for %s", err, first.OutboxID)
	}
	second, err := b.producer.Enqueue(b.ctx, b.pool, in("life-2"))
	if err != nil || second.Duplicate || second.OutboxID == first.OutboxID {
		t.Fatalf("ins-life under another key once its key is retired: %+v %v, want a fresh receipt", second, err)
	}
	if _, err := b.producer.Enqueue(b.ctx, b.pool, in("life-3")); !reused(err, "life-2", second.OutboxID) {
		t.Fatalf("ins-life under a third key: %v, want it refused naming life-2", err)
	}
	if _, err := b.producer.Enqueue(b.ctx, b.pool, in("life-1")); !errors.As(err, &re) || re.OutboxID != first.OutboxID {
		t.Fatalf("the retired pair after the instruction id took another key: %v, want a RetiredError for %s", err, first.OutboxID)
	}
	b.verifyOK(t)
}

// TestFleetThroughPartitionBoundary runs three relay services (relayer and
// reaper each) and eight producers through a partition boundary, what a
// month's end is to the archive: claims on one side and outcomes on the
// other, retries across it. Nothing is lost: every instruction ends
// dispatched, every invariant holds, and once the older partition is
// checkpointed and detached the chains that cross the boundary still
// verify.
func TestFleetThroughPartitionBoundary(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)

	// Retries without a breaker: five retryable answers in a row (likely
	// over thousands of calls) would otherwise pause the rail for its
	// open period.
	set, err := rails.NewSet(rails.Options{Type: "sandbox", Profile: payment.Generic{}, Breaker: rails.BreakerOptions{Disabled: true},
		Transport: rails.NewSandbox(rails.SandboxOptions{LatencyMin: time.Millisecond, LatencyMax: 20 * time.Millisecond, RetryableRate: 0.2})})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		svc, err := relay.New(b.pool, relay.Config{
			Relayer: engine.Config{RelayerID: fmt.Sprintf("fleet-%d", i), Rails: set, PollInterval: 50 * time.Millisecond,
				BackoffBase: 20 * time.Millisecond, BackoffCap: 100 * time.Millisecond},
			Reaper: reaper.Config{Interval: time.Second}})
		if err != nil {
			t.Fatal(err)
		}
		if err := svc.Start(b.ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = svc.Stop(context.Background()) })
	}
	// The boundary is set once the fleet runs (nothing archived yet: the
	// split drops the month's partition): set before the three services
	// started, on a loaded machine their start took all of its 2 s, the
	// producers began past it, and nothing was archived before it ("the
	// run did not cross the boundary", with 41 instructions).
	boundary := time.Now().Add(2 * time.Second).Truncate(time.Millisecond)
	old, current := splitCurrentMonth(t, b.pool, boundary)
	var wg sync.WaitGroup
	var enqueued atomic.Int64
	stopAt := boundary.Add(2 * time.Second)
	for p := range 8 {
		wg.Go(func() {
			for i := 0; time.Now().Before(stopAt); i++ {
				key := fmt.Sprintf("fleet-%d-%d", p, i)
				if _, err := b.producer.Enqueue(b.ctx, b.pool, pending.Instruction{
					InstructionID: "ins-" + key, ParticipantID: fmt.Sprintf("p%d", i%20), IdempotencyKey: key,
					RailType: "sandbox", AmountMinor: 100, Currency: "USD", Destination: "acct-1",
				}); err != nil {
					t.Error(err)
					return
				}
				enqueued.Add(1)
				time.Sleep(2 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var left int
		if err := b.pool.QueryRow(b.ctx, `SELECT (SELECT count(*) FROM outbox.pending) + (SELECT count(*) FROM outbox.inflight)`).Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			b.verifyOK(t)
			t.Fatalf("%d instructions not dispatched 60 s after the stream ended", left)
		}
	}
	rep := b.verifyOK(t)
	if rep.Dispatched != enqueued.Load() || rep.DeadLetters != 0 {
		t.Fatalf("%d enqueued, %d dispatched, %d dead letters", enqueued.Load(), rep.Dispatched, rep.DeadLetters)
	}
	var crossing int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM (SELECT outbox_id FROM outbox.attempts GROUP BY outbox_id
	                                  HAVING min(created_at) < $1 AND max(created_at) >= $1) x`, boundary).Scan(&crossing); err != nil {
		t.Fatal(err)
	}
	parts := partitionStates(t, b)
	t.Logf("%d instructions, %d of them with attempts on both sides of the boundary; %s: %d rows, %s: %d rows",
		enqueued.Load(), crossing, old, parts[old].Rows, current, parts[current].Rows)
	if crossing == 0 || parts[old].Rows == 0 || parts[current].Rows == 0 {
		t.Fatal("the run did not cross the boundary")
	}
	b.checkpoint(t)
	if detached, err := b.st.DetachArchive(b.ctx, b.pool, boundary, time.Second); err != nil || len(detached) != 1 {
		t.Fatalf("detach: %v %v", detached, err)
	}
	b.verifyOK(t)
}

// TestRetireKeysLooksUpEachKey: retiring a month's keys reads the keys
// table (which only grows) and the queue by outbox id, never whole. Joined
// to the batch as a whole, they were hashed whole for every batch of
// 10,000 (the old statement fails here: a sequential scan of 30,000 keys,
// full index scans of pending and inflight).
func TestRetireKeysLooksUpEachKey(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	const n = 30_000
	if _, err := b.pool.Exec(b.ctx, `
		INSERT INTO outbox.idempotency_keys (instruction_id, idempotency_key, outbox_id, participant_id, sequence_id, payload_hash)
		SELECT 'bulk-' || g, 'bulk-k' || g, ('00000000-0000-7000-8000-' || lpad(to_hex(g), 12, '0'))::uuid,
		       'bulk-p' || (g % 100), g / 100 + 1, '\x00'
		FROM generate_series(1, $1::int) g`, n); err != nil {
		t.Fatal(err)
	}
	var partition string
	if err := b.pool.QueryRow(b.ctx, `
		WITH a AS (
		  INSERT INTO outbox.attempts (attempt_id, outbox_id, instruction_id, participant_id, sequence_id, idempotency_key,
		                               rail_type, attempt_no, state, relayer_id, claimed_at, completed_at, created_at)
		  SELECT outbox.uuidv7(), ('00000000-0000-7000-8000-' || lpad(to_hex(g), 12, '0'))::uuid, 'bulk-' || g,
		         'bulk-p' || (g % 100), g / 100 + 1, 'bulk-k' || g, 'sandbox', 1, 'DISPATCHED', 'bulk', now(), now(), now()
		  FROM generate_series(1, $1::int) g
		  RETURNING tableoid)
		SELECT DISTINCT c.relname FROM a JOIN pg_class c ON c.oid = a.tableoid`, n).Scan(&partition); err != nil {
		t.Fatal(err)
	}
	// Dead letters of other instructions, acknowledged: each key's own is
	// looked up by its outbox id too, not found by reading them all.
	if _, err := b.pool.Exec(b.ctx, `
		INSERT INTO outbox.dead_letters (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
		                                 payload, attempt_count, error_code, attempt_id, created_at, acknowledged_at)
		SELECT gen_random_uuid(), 'dead-' || g, 'dead-p', g, 'dead-k' || g, 'sandbox', '{}', 1, 'RAIL_REJECTED',
		       gen_random_uuid(), now(), now()
		FROM generate_series(1, $1::int) g`, n); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(b.ctx, `ANALYZE outbox.idempotency_keys, outbox.attempts, outbox.pending, outbox.inflight, outbox.dead_letters`); err != nil {
		t.Fatal(err)
	}

	nodes, plan := testdb.Explain(t, b.pool, b.st.RetireKeysSQL(partition), uuid.Nil, 10_000)
	for _, node := range nodes {
		switch {
		case node.NodeType == "Hash Join" || node.NodeType == "Merge Join":
			t.Errorf("retiring keys joins whole relations (%s):\n%s", node.NodeType, plan)
		case node.NodeType == "Seq Scan" && (node.Relation == "idempotency_keys" || node.Relation == "pending" || node.Relation == "inflight" ||
			node.Relation == "dead_letters"):
			t.Errorf("retiring keys reads %s whole:\n%s", node.Relation, plan)
		}
	}

	retired, err := b.st.RetireKeys(b.ctx, b.pool, partition, 10_000)
	if err != nil {
		t.Fatal(err)
	}
	var left int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox.idempotency_keys WHERE instruction_id LIKE 'bulk-%'`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if retired != n || left != 0 {
		t.Fatalf("retired %d keys, %d left; want %d and 0", retired, left, n)
	}
}

// TestRetireKeysLeavesAReplayedDeadLetterItsKey: an acknowledged dead
// letter replayed while its month's keys are being retired either leaves
// with its key (the retirement went first: the replay finds nothing) or
// keeps it (the replay went first: the instruction is pending again and
// its key must answer duplicates exactly). A retirement that waited for
// the replay's lock on the dead letter retired the key of an instruction
// that was pending again.
func TestRetireKeysLeavesAReplayedDeadLetterItsKey(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	id := b.enqueue(t, "p1", "k-replayed")
	b.record(t, recordOutcome(t, b.claimOne(t, "r1", longLease), "r1", store.Failed))
	if ok, err := b.st.Acknowledge(b.ctx, b.pool, id, "olga", "refunded by hand"); err != nil || !ok {
		t.Fatalf("acknowledge: %v %v", ok, err)
	}
	month := "attempts_" + time.Now().UTC().Format("2006_01")

	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(b.ctx)
	if ok, err := b.st.Replay(b.ctx, tx, id, "olga", "sent after all"); err != nil || !ok {
		t.Fatalf("replay: %v %v", ok, err)
	}
	var retired int64
	err = b.waitingOn(t, tx, func(conn *pgxpool.Conn) error {
		var err error
		retired, err = b.st.RetireKeys(b.ctx, conn, month, 0)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if w := b.where(t, id); !w.pending {
		t.Fatalf("the replayed instruction is not pending: %+v", w)
	}
	var live int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox.idempotency_keys WHERE outbox_id = $1`, id).Scan(&live); err != nil {
		t.Fatal(err)
	}
	if live != 1 || retired != 0 {
		t.Fatalf("retired %d keys, %d live key left for the pending instruction; want 0 and 1", retired, live)
	}
	r, err := b.producer.Enqueue(b.ctx, b.pool, pending.Instruction{
		InstructionID: "ins-k-replayed", ParticipantID: "p1", IdempotencyKey: "k-replayed",
		RailType: "sandbox", AmountMinor: 100, Currency: "USD", Destination: "acct-1",
	})
	if err != nil || !r.Duplicate || r.OutboxID != id {
		t.Fatalf("enqueue of the pending instruction's key: %+v %v, want its receipt", r, err)
	}
	b.verifyOK(t)
}

// TestRetiredKeyRefusedToAnOlderSnapshot: a producer whose transaction
// reads from one snapshot (REPEATABLE READ) taken before a retirement
// committed does not see the key's digest; had the retirement removed the
// key meanwhile, its enqueue found neither and enqueued the instruction
// again, under a new outbox id, to be paid a second time. The key stays
// until no snapshot older than its digest is left: the enqueue answers
// with the original receipt, and one after it is refused.
func TestRetiredKeyRefusedToAnOlderSnapshot(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	id := b.enqueue(t, "p1", "k-old-snapshot")
	b.record(t, recordOutcome(t, b.claimOne(t, "r1", longLease), "r1", store.Dispatched))
	// An acknowledged dead letter leaves with the first phase, its key
	// with the second.
	acked := b.enqueue(t, "p2", "k-acked")
	b.record(t, recordOutcome(t, b.claimOne(t, "r1", longLease), "r1", store.Failed))
	if ok, err := b.st.Acknowledge(b.ctx, b.pool, acked, "olga", "refunded by hand"); err != nil || !ok {
		t.Fatalf("acknowledge: %v %v", ok, err)
	}
	month := "attempts_" + time.Now().UTC().Format("2006_01")
	in := pending.Instruction{
		InstructionID: "ins-k-old-snapshot", ParticipantID: "p1", IdempotencyKey: "k-old-snapshot",
		RailType: "sandbox", AmountMinor: 100, Currency: "USD", Destination: "acct-1",
	}

	ptx, err := b.pool.BeginTx(b.ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer ptx.Rollback(b.ctx)
	if _, err := ptx.Exec(b.ctx, `SELECT 1 FROM outbox.settings`); err != nil { // the business transaction's first read
		t.Fatal(err)
	}
	retired := make(chan error, 1)
	go func() {
		_, err := b.st.RetireKeys(b.ctx, b.pool, month, 0)
		retired <- err
	}()
	// The digest is committed before the key goes.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		var n int
		if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox.retired_keys`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 2 {
			break
		}
		select {
		case err := <-retired:
			retired <- err
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the retirement never committed the digest")
		}
	}
	b.verifyOK(t) // a key live beside its digest is one instruction, counted once
	// A snapshot that sees the digest meanwhile: refused as retired, and
	// its transaction stays usable (not failed as a retirement race).
	ntx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer ntx.Rollback(b.ctx)
	var re *pending.RetiredError
	if _, err := b.producer.Enqueue(b.ctx, ntx, in); !errors.As(err, &re) || re.OutboxID != id {
		t.Fatalf("enqueue from a snapshot that sees the digest beside the live key: %v, want a RetiredError for %s", err, id)
	}
	if _, err := ntx.Exec(b.ctx, `SELECT 1`); err != nil {
		t.Fatalf("the refused enqueue's transaction is not usable: %v", err)
	}
	if err := ntx.Rollback(b.ctx); err != nil {
		t.Fatal(err)
	}
	r, err := b.producer.Enqueue(b.ctx, ptx, in)
	if err != nil || !r.Duplicate || r.OutboxID != id {
		t.Fatalf("enqueue from a snapshot older than the retirement: %+v %v, want the original receipt", r, err)
	}
	if err := ptx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-retired; err != nil {
		t.Fatal(err)
	}
	var live, pendingRows int
	if err := b.pool.QueryRow(b.ctx, `SELECT (SELECT count(*) FROM outbox.idempotency_keys), (SELECT count(*) FROM outbox.pending)`).
		Scan(&live, &pendingRows); err != nil {
		t.Fatal(err)
	}
	if live != 0 || pendingRows != 0 {
		t.Fatalf("after the retirement: %d live keys, %d pending rows; want none", live, pendingRows)
	}
	if _, err := b.producer.Enqueue(b.ctx, b.pool, in); !errors.As(err, &re) || re.OutboxID != id {
		t.Fatalf("enqueue after the retirement: %v, want a RetiredError for %s", err, id)
	}
	b.verifyOK(t)
}

// TestResentOutcomeOfADetachedMonth: a relayer cut off from the database
// across a month's end resends an outcome (the reply to its first write
// was lost) after an operator detached that month. It was archived
// already, on time: the resend archives nothing. Looked for in the
// attached months only, it was archived again as late (the same attempt
// id twice, its claim closed twice).
func TestResentOutcomeOfADetachedMonth(t *testing.T) {
	t.Parallel()
	var o store.Outcome
	b, boundary, _, _ := historyBefore(t, time.Second, func(b *recordBundle) {
		b.enqueue(t, "p1", "k-resent")
		o = recordOutcome(t, b.claimOne(t, "r1", longLease), "r1", store.Dispatched)
		b.record(t, o)
	})
	time.Sleep(time.Until(boundary) + 50*time.Millisecond)
	b.checkpoint(t)
	if d, err := b.st.DetachArchive(b.ctx, b.pool, boundary, time.Second); err != nil || len(d) != 1 {
		t.Fatalf("detach: %v %v", d, err)
	}
	if rec := b.record(t, o); rec[0].Late {
		t.Errorf("the resent outcome was taken for a late one: %+v", rec[0])
	}
	var n int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox.archive WHERE attempt_id = $1`, o.AttemptID).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Errorf("the outcome is archived %d times, want once", n)
	}
	b.verifyOK(t)
}
