package pending_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"

	"github.com/ledgerline/outbox/attempts"
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
		held, res := raceHeldEnqueue(ctx, t, b, key, func() pending.Instruction {
			in := payout("p2", key)
			in.InstructionID = "ins-racer"
			return in
		}(), commit)
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

// reused reports whether err is an instruction id refused for having
// another key, naming owner as that key and ownerID as its outbox id.
func reused(err error, owner string, ownerID uuid.UUID) bool {
	var ir *pending.InstructionReusedError
	return errors.Is(err, pending.ErrInstructionIDReused) && errors.Is(err, pending.ErrIdempotencyMismatch) &&
		errors.As(err, &ir) && ir.OwnerKey == owner && ir.OutboxID == ownerID
}

// TestInstructionIDUnderAnotherKeyIsRefused: an instruction id has one key
// per tenant. The rail deduplicates by the key, so the instruction under a
// second key (a producer that made a new key for its retry) would be paid
// twice; it is refused, with the same payload as with another, naming the
// key it has, and writes nothing; the caller's transaction stays usable.
// In a batch, such a line fails the batch at its index and the batch
// writes nothing; the lines beside it go in once it is left out.
func TestInstructionIDUnderAnotherKeyIsRefused(t *testing.T) {
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
	retry := payout("p1", "k1-regenerated")
	retry.InstructionID = "ins-k1"
	changed := retry
	changed.AmountMinor = 777
	for _, in := range []pending.Instruction{retry, changed} {
		_, err := b.producer.Enqueue(b.ctx, tx, in)
		var ir *pending.InstructionReusedError
		if !reused(err, "k1", first.OutboxID) || !errors.As(err, &ir) || ir.IdempotencyKey != "k1-regenerated" || ir.InstructionID != "ins-k1" {
			t.Fatalf("instruction ins-k1 under a second key (amount %d): %v, want it refused naming key k1 and %s", in.AmountMinor, err, first.OutboxID)
		}
	}
	// In a batch: refused at its index, nothing of the batch written; the
	// transaction is still usable, and the others go in without it.
	good1, good2 := payout("p2", "k2"), payout("p3", "k3")
	_, err = b.producer.EnqueueBatch(b.ctx, tx, []pending.Instruction{good1, retry, good2})
	var be *pending.BatchError
	if !errors.As(err, &be) || be.Index != 1 || !reused(err, "k1", first.OutboxID) {
		t.Fatalf("batch with ins-k1 under a second key at index 1: %v, want it refused there", err)
	}
	if rs, err := b.producer.EnqueueBatch(b.ctx, tx, []pending.Instruction{good1, good2}); err != nil || rs[0].Duplicate || rs[1].Duplicate {
		t.Fatalf("the batch without it: %+v %v, want two fresh receipts", rs, err)
	}
	// The instruction's own key is still its duplicate.
	again, err := b.producer.Enqueue(b.ctx, tx, payout("p1", "k1"))
	if err != nil || !again.Duplicate || again.OutboxID != first.OutboxID {
		t.Fatalf("the instruction under its own key: %+v %v, want its original receipt", again, err)
	}
	// Within one transaction: an instruction id enqueued there under one
	// key is refused under another, and the transaction goes on.
	mine, err := b.producer.Enqueue(b.ctx, tx, payout("p4", "k4"))
	if err != nil {
		t.Fatal(err)
	}
	second := payout("p4", "k4-bis")
	second.InstructionID = "ins-k4"
	if _, err := b.producer.Enqueue(b.ctx, tx, second); !reused(err, "k4", mine.OutboxID) {
		t.Fatalf("ins-k4 under a second key in the transaction that enqueued it: %v, want it refused naming k4", err)
	}
	// Another tenant's instruction id of the same name is another
	// instruction.
	elsewhere := retry
	elsewhere.TenantID = "tenant-b"
	if r, err := b.producer.Enqueue(b.ctx, tx, elsewhere); err != nil || r.Duplicate {
		t.Fatalf("the instruction id in another tenant: %+v %v, want a fresh receipt", r, err)
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	if after := b.counts(t); after != (tableCounts{keys: before.keys + 4, pending: before.pending + 4, sequences: before.sequences + 4}) {
		t.Fatalf("counts %+v -> %+v, want k2, k3, k4 and the other tenant's instruction only", before, after)
	}
	b.verify(t)
}

// TestBatchLinesOfOneInstructionIdUnderTwoKeys: in a batch, the first line
// in input order gives an instruction id its key; a later line naming it
// under another key fails the batch at its own index, whichever of the two
// keys sorts first (the keys are inserted in key order), and the batch
// writes nothing. The same key again is a duplicate line, as before.
func TestBatchLinesOfOneInstructionIdUnderTwoKeys(t *testing.T) {
	t.Parallel()
	b := setup(t)

	for _, keys := range [][2]string{{"key-a", "key-z"}, {"key-z", "key-a"}} {
		first, later := payout("p1", keys[0]), payout("p2", keys[1])
		first.InstructionID, later.InstructionID = "ins-"+keys[0]+"-shared", "ins-"+keys[0]+"-shared"
		_, err := b.producer.EnqueueBatch(b.ctx, b.pool, []pending.Instruction{first, payout("p3", "k-"+keys[0]), later})
		var be *pending.BatchError
		var ir *pending.InstructionReusedError
		if !errors.As(err, &be) || be.Index != 2 || !reused(err, keys[0], uuid.Nil) || !errors.As(err, &ir) || ir.IdempotencyKey != keys[1] {
			t.Fatalf("batch %v: %v, want the line at index 2 refused naming %s", keys, err, keys[0])
		}
	}
	if c := b.counts(t); c != (tableCounts{}) {
		t.Fatalf("counts %+v: a failed batch wrote something", c)
	}
	// Twins of one line: the second is the first's duplicate.
	rs, err := b.producer.EnqueueBatch(b.ctx, b.pool, []pending.Instruction{payout("p1", "twin"), payout("p1", "twin")})
	if err != nil || rs[0].Duplicate || !rs[1].Duplicate || rs[1].OutboxID != rs[0].OutboxID {
		t.Fatalf("twin lines: %+v %v, want the second a duplicate of the first", rs, err)
	}
}

// TestRacingKeysForOneInstructionId: an enqueue of an instruction id
// another transaction is inserting under another key waits for it;
// refused when that commits, enqueued when it rolls back: exactly one of
// the two keys is ever the instruction's.
func TestRacingKeysForOneInstructionId(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
	defer cancel()

	for _, commit := range []bool{true, false} {
		key := map[bool]string{true: "raced-commit", false: "raced-rollback"}[commit]
		held, res := raceHeldEnqueue(ctx, t, b, key, func() pending.Instruction {
			in := payout("p2", key+"-racer")
			in.InstructionID = "ins-" + key
			return in
		}(), commit)
		switch {
		case commit && !reused(res.err, key, held.OutboxID):
			t.Fatalf("after the holder committed: %+v %v, want ins-%s refused naming key %s", res.r, res.err, key, key)
		case !commit && (res.err != nil || res.r.Duplicate):
			t.Fatalf("after the holder rolled back: %+v %v, want a fresh receipt", res.r, res.err)
		}
	}
	var keys []string
	if err := b.pool.QueryRow(ctx, `SELECT array_agg(idempotency_key ORDER BY idempotency_key) FROM outbox.idempotency_keys`).Scan(&keys); err != nil {
		t.Fatal(err)
	}
	if want := []string{"raced-commit", "raced-rollback-racer"}; !slices.Equal(keys, want) {
		t.Fatalf("keys %v, want %v: the committed holder's and the racer's after the rollback", keys, want)
	}
	if c := b.counts(t); c != (tableCounts{keys: 2, pending: 2, sequences: 2}) {
		t.Fatalf("counts %+v, want the committed holder's and the racer's after the rollback", c)
	}
	b.verify(t)
}

// raceResult is what a racing enqueue got.
type raceResult struct {
	r   pending.Receipt
	err error
}

// raceHeldEnqueue enqueues payout("p1", key) in a transaction it holds
// open, starts racer's enqueue in another, waits until the racer waits
// for a lock (failing if it finishes first: it did not wait for the
// holder's insert), then commits or rolls back the holder and returns the
// holder's receipt and what the racer got.
func raceHeldEnqueue(ctx context.Context, t *testing.T, b *testBundle, key string, racer pending.Instruction, commit bool) (pending.Receipt, raceResult) {
	t.Helper()
	holder, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(ctx) // after a failure: the pool closes only once every connection is back
	held, err := b.producer.Enqueue(ctx, holder, payout("p1", key))
	if err != nil {
		t.Fatal(err)
	}
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pid := tx.Conn().PgConn().PID()
	done := make(chan raceResult, 1)
	go func() {
		r, err := b.producer.Enqueue(ctx, tx, racer)
		if err == nil {
			err = tx.Commit(ctx)
		} else {
			_ = tx.Rollback(ctx)
		}
		done <- raceResult{r, err}
	}()
	for waiting := false; !waiting; {
		select {
		case res := <-done:
			t.Fatalf("key %s, instruction %s: the racer finished (%+v, %v) without waiting for the holder's insert",
				racer.IdempotencyKey, racer.InstructionID, res.r, res.err)
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
	return held, <-done
}

// TestKeyWithoutInstructionIsRefused: a key row inserted outside an
// enqueue (no sequence id: a producer credential may insert keys) makes
// its key unusable, and every enqueue of it, alone or in a batch, with the
// row's payload or another, is refused with ErrKeyWithoutInstruction at its
// index, writing nothing. It was an untyped "key has no sequence id", or a
// mismatch naming an instruction that was never enqueued.
func TestKeyWithoutInstructionIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	orphan := uuid.Must(uuid.NewV7())
	if _, err := b.pool.Exec(b.ctx, `INSERT INTO outbox.idempotency_keys (tenant_id, instruction_id, idempotency_key, outbox_id, participant_id, payload_hash)
		VALUES ('', 'ins-k1', 'k1', $1, 'p1', '\x00')`, orphan); err != nil {
		t.Fatal(err)
	}
	before := b.counts(t)
	other := payout("p1", "k1")
	other.InstructionID = "ins-other"
	for name, batch := range map[string][]pending.Instruction{
		"alone":             {payout("p1", "k1")},
		"another id":        {other},
		"second of a batch": {payout("p2", "k2"), payout("p1", "k1")},
	} {
		_, err := b.producer.EnqueueBatch(b.ctx, b.pool, batch)
		var kerr *pending.KeyWithoutInstructionError
		var berr *pending.BatchError
		if !errors.Is(err, pending.ErrKeyWithoutInstruction) || !errors.As(err, &kerr) || kerr.OutboxID != orphan ||
			!errors.As(err, &berr) || berr.Index != len(batch)-1 {
			t.Errorf("%s: %v, want ErrKeyWithoutInstruction naming %s at index %d", name, err, orphan, len(batch)-1)
		}
	}
	if _, err := b.producer.Enqueue(b.ctx, b.pool, payout("p1", "k1")); !errors.Is(err, pending.ErrKeyWithoutInstruction) {
		t.Errorf("Enqueue: %v, want ErrKeyWithoutInstruction", err)
	}
	if after := b.counts(t); after != before {
		t.Errorf("counts %+v -> %+v, want nothing written", before, after)
	}
	// audit verify reports the row (docs/operations.md): its outbox id is
	// in no place, and its participant has a key without a sequence.
	archive, _ := attempts.New("")
	r, err := archive.Verify(b.ctx, b.pool, attempts.VerifyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, v := range r.Violations {
		seen[v.Invariant] = true
	}
	if !seen[1] || !seen[2] || len(seen) != 2 {
		t.Errorf("verify with the row: %v, want invariants 1 and 2 reported", r.Violations)
	}
}
