package pending_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ledgerline/outbox/pending"
)

// TestKeyOfAnotherInstructionIsRefused: a key belongs to one instruction
// id per tenant. The rail deduplicates by the key alone, so a second
// instruction id under it would be answered as a repeat of the first and
// recorded as dispatched unpaid; it is refused as a mismatch naming the
// owner, with the same payload as with another, and writes nothing.
func TestKeyOfAnotherInstructionIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)

	first, err := b.producer.Enqueue(b.ctx, b.pool, payout("p1", "k1"))
	if err != nil {
		t.Fatal(err)
	}
	before := b.counts(t)

	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(b.ctx)
	same := payout("p1", "k1")
	same.InstructionID = "ins-other"
	changed := same
	changed.AmountMinor = 777
	for _, in := range []pending.Instruction{same, changed} {
		_, err := b.producer.Enqueue(b.ctx, tx, in)
		var mismatch *pending.MismatchError
		if !errors.Is(err, pending.ErrIdempotencyMismatch) || !errors.As(err, &mismatch) ||
			mismatch.OutboxID != first.OutboxID || mismatch.Owner != "ins-k1" || mismatch.InstructionID != "ins-other" {
			t.Fatalf("instruction %q under key k1 (amount %d): %v, want a mismatch naming ins-k1 and %s",
				in.InstructionID, in.AmountMinor, err, first.OutboxID)
		}
	}
	// The owner's own repeat is still its duplicate, and the transaction
	// is still usable.
	again, err := b.producer.Enqueue(b.ctx, tx, payout("p1", "k1"))
	if err != nil || !again.Duplicate || again.OutboxID != first.OutboxID {
		t.Fatalf("the owner's repeat: %+v %v, want its original receipt", again, err)
	}
	// Another tenant's key of the same name is another key.
	elsewhere := same
	elsewhere.TenantID = "tenant-b"
	if r, err := b.producer.Enqueue(b.ctx, tx, elsewhere); err != nil || r.Duplicate {
		t.Fatalf("the key in another tenant: %+v %v, want a fresh receipt", r, err)
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	if after := b.counts(t); after != (tableCounts{keys: before.keys + 1, pending: before.pending + 1, sequences: before.sequences + 1}) {
		t.Fatalf("counts %+v -> %+v, want only the other tenant's instruction", before, after)
	}
	b.verify(t)
}

// TestBatchLinesOfOneKeyUnderTwoInstructionIds: in a batch, the first line
// in input order claims a key; a later line naming another instruction id
// under it fails the batch at its own index, whatever order the two
// instruction ids sort in, and the batch writes nothing.
func TestBatchLinesOfOneKeyUnderTwoInstructionIds(t *testing.T) {
	t.Parallel()
	b := setup(t)

	for _, ids := range [][2]string{{"ins-a", "ins-z"}, {"ins-z", "ins-a"}} {
		first, later := payout("p1", "shared-"+ids[0]), payout("p2", "shared-"+ids[0])
		first.InstructionID, later.InstructionID = ids[0], ids[1]
		_, err := b.producer.EnqueueBatch(b.ctx, b.pool, []pending.Instruction{first, payout("p3", "k-"+ids[0]), later})
		var be *pending.BatchError
		var mismatch *pending.MismatchError
		if !errors.As(err, &be) || be.Index != 2 || !errors.As(err, &mismatch) || mismatch.Owner != ids[0] {
			t.Fatalf("batch %v: %v, want a mismatch at index 2 naming %s", ids, err, ids[0])
		}
	}
	if c := b.counts(t); c != (tableCounts{}) {
		t.Fatalf("counts %+v: a failed batch wrote something", c)
	}
}

// TestRacingInstructionIdsForOneKey: an enqueue of a key another
// transaction is inserting under another instruction id waits for it;
// refused when that commits, enqueued when it rolls back. Checked without
// waiting, the two both enqueued.
func TestRacingInstructionIdsForOneKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
	defer cancel()

	for _, commit := range []bool{true, false} {
		key := map[bool]string{true: "raced-commit", false: "raced-rollback"}[commit]
		holder, err := b.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer holder.Rollback(ctx) // after a failure: the pool closes only once every connection is back
		held, err := b.producer.Enqueue(ctx, holder, payout("p1", key))
		if err != nil {
			t.Fatal(err)
		}
		racer, err := b.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		pid := racer.Conn().PgConn().PID()
		type result struct {
			r   pending.Receipt
			err error
		}
		done := make(chan result, 1)
		go func() {
			in := payout("p2", key)
			in.InstructionID = "ins-racer"
			r, err := b.producer.Enqueue(ctx, racer, in)
			if err == nil {
				err = racer.Commit(ctx)
			} else {
				_ = racer.Rollback(ctx)
			}
			done <- result{r, err}
		}()
		for waiting := false; !waiting; {
			select {
			case res := <-done:
				t.Fatalf("key %s: the racer finished (%+v, %v) without waiting for the holder's insert", key, res.r, res.err)
			default:
			}
			if err := b.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock')`,
				pid).Scan(&waiting); err != nil {
				t.Fatal(err)
			}
			time.Sleep(5 * time.Millisecond)
		}
		if commit {
			err = holder.Commit(ctx)
		} else {
			err = holder.Rollback(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
		res := <-done
		var mismatch *pending.MismatchError
		switch {
		case commit && !(errors.As(res.err, &mismatch) && mismatch.Owner == "ins-"+key && mismatch.OutboxID == held.OutboxID):
			t.Fatalf("after the holder committed: %+v %v, want a mismatch naming ins-%s", res.r, res.err, key)
		case !commit && (res.err != nil || res.r.Duplicate):
			t.Fatalf("after the holder rolled back: %+v %v, want a fresh receipt", res.r, res.err)
		}
	}
	if c := b.counts(t); c != (tableCounts{keys: 2, pending: 2, sequences: 2}) {
		t.Fatalf("counts %+v, want the committed holder's and the racer's after the rollback", c)
	}
	b.verify(t)
}
