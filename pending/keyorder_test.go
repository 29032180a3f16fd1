package pending_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ledgerline/outbox/pending"
)

// TestBatchesWithSharedKeysInOppositeOrdersDoNotDeadlock guards
// EnqueueBatch's promise that concurrent batches cannot deadlock: keys are
// claimed in one order whatever the input order, so two submissions of the
// same instructions in opposite orders (a retried batch) wait for each
// other instead of each holding a key the other needs. Claimed in input
// order, they deadlocked.
//
// The interleaving is forced, not raced for: a third transaction holds the
// middle key, so each batch claims the keys it reaches first and stops
// there; only when both are waiting is the middle key released. In input
// order the forward batch holds the first half and the reversed one the
// second half, and they deadlock every time.
func TestBatchesWithSharedKeysInOppositeOrdersDoNotDeadlock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
	defer cancel()

	var ins []pending.Instruction
	for i := range 200 {
		ins = append(ins, payout(fmt.Sprintf("p-%d", i%7), fmt.Sprintf("k%03d", i)))
	}
	rev := slices.Clone(ins)
	slices.Reverse(rev)

	holder, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx)
	if _, err := b.producer.Enqueue(ctx, holder, ins[100]); err != nil {
		t.Fatal(err)
	}

	type result struct {
		receipts []pending.Receipt
		err      error
	}
	results := make([]chan result, 2)
	pids := make([]uint32, 2)
	for g, batch := range [][]pending.Instruction{ins, rev} {
		tx, err := b.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		pids[g] = tx.Conn().PgConn().PID()
		results[g] = make(chan result, 1)
		go func() {
			rs, err := b.producer.EnqueueBatch(ctx, tx, batch)
			if err == nil {
				err = tx.Commit(ctx)
			}
			results[g] <- result{rs, err}
		}()
	}

	// Both batches wait on a lock (the held key, or one the other claimed)
	// before the held key is released.
	for waiting := 0; waiting < 2; {
		if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE pid = ANY($1) AND wait_event_type = 'Lock'`, pids).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	var got [2]result
	for g := range results {
		got[g] = <-results[g]
		if got[g].err != nil {
			t.Errorf("batch %d: %v", g, got[g].err)
		}
	}
	if t.Failed() {
		return
	}
	// One batch enqueued every instruction, the other got the same
	// receipts as duplicates, each for its own input line.
	for i, r := range got[0].receipts {
		other := got[1].receipts[len(ins)-1-i]
		if r.OutboxID != other.OutboxID || r.SequenceID != other.SequenceID || r.Duplicate == other.Duplicate {
			t.Fatalf("instruction %d: receipts %+v and %+v, want one fresh and its duplicate", i, r, other)
		}
	}
	var n int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM outbox.pending`).Scan(&n); err != nil || n != len(ins) {
		t.Fatalf("%d pending rows (%v), want %d", n, err, len(ins))
	}
}

// TestBatchTwinsKeepInputOrder guards what claiming keys in key order must
// not change: of two lines with one key in a batch, the first in input
// order is enqueued and the later one is its duplicate, and sequence ids
// follow input order, however the keys sort.
func TestBatchTwinsKeepInputOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Keys in reverse key order, then a twin of each of the first ten:
	// enough rows that PostgreSQL's sort is not its (stable) insertion
	// sort, which kept twins in input order by chance.
	var ins []pending.Instruction
	for i := range 30 {
		ins = append(ins, payout("p1", fmt.Sprintf("k%02d", 29-i)))
	}
	for i := range 10 {
		ins = append(ins, payout("p1", fmt.Sprintf("k%02d", 29-i)))
	}
	rs, err := b.producer.EnqueueBatch(b.ctx, b.pool, ins)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range rs {
		want := pending.Receipt{OutboxID: r.OutboxID, SequenceID: int64(i + 1)}
		if i >= 30 {
			want = pending.Receipt{OutboxID: rs[i-30].OutboxID, SequenceID: int64(i - 30 + 1), Duplicate: true}
		}
		if r != want {
			t.Errorf("line %d (%s): %+v, want %+v", i, ins[i].IdempotencyKey, r, want)
		}
	}
}
