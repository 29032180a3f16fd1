package pending_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/ledgerline/outbox/pending"
)

// TestBatchTwinsThatDisagreeAreRefusedBeforeSending: two lines of one
// batch with one key (and tenant) that disagree, on the payload or on the
// instruction id, are refused as a mismatch at the later line before
// anything is sent, naming no outbox id: the earlier line's was never
// enqueued (the batch fails whole). The database used to find them, and
// the error named the earlier line's outbox id as a key "enqueued with a
// different payload": an instruction a caller looking it up would never
// find. Refused before sending, it is refused the same in a transaction
// that could not have sent anything (already aborted), and the
// transaction's state is the caller's own.
func TestBatchTwinsThatDisagreeAreRefusedBeforeSending(t *testing.T) {
	t.Parallel()
	b := setup(t)
	otherAmount := payout("p1", "tw")
	otherAmount.AmountMinor = 99
	otherID := payout("p2", "tw")
	otherID.InstructionID = "ins-other"
	for name, c := range map[string]struct {
		later pending.Instruction
		owner string
		says  string
	}{
		"another payload":        {otherAmount, "", "an earlier line of the batch enqueues it with a different payload"},
		"another instruction id": {otherID, "ins-tw", `an earlier line of the batch gives it to instruction "ins-tw"`},
	} {
		// A fresh producer: its schema check would be its first statement.
		p, err := pending.NewProducer(pending.Config{})
		if err != nil {
			t.Fatal(err)
		}
		tx, err := b.pool.Begin(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = tx.Exec(b.ctx, `SELECT 1/0`) // aborted: any statement sent fails
		_, err = p.EnqueueBatch(b.ctx, tx, []pending.Instruction{payout("p1", "tw"), payout("p3", "k2"), c.later})
		_ = tx.Rollback(b.ctx)
		var be *pending.BatchError
		var mismatch *pending.MismatchError
		switch {
		case !errors.As(err, &be) || be.Index != 2 || !errors.As(err, &mismatch) || !errors.Is(err, pending.ErrIdempotencyMismatch):
			t.Errorf("%s: %v, want a *MismatchError at index 2, found before anything was sent", name, err)
		case !mismatch.OutboxID.IsNil() || mismatch.Owner != c.owner:
			t.Errorf("%s: %+v, want no outbox id and owner %q", name, mismatch, c.owner)
		case !strings.Contains(err.Error(), c.says):
			t.Errorf("%s: %q, want it to say %q", name, err, c.says)
		}
	}
	if c := b.counts(t); c != (tableCounts{}) {
		t.Fatalf("counts %+v: a refused batch wrote something", c)
	}
	// Twins that agree are one instruction: the later one its duplicate.
	rs, err := b.producer.EnqueueBatch(b.ctx, b.pool, []pending.Instruction{payout("p1", "tw"), payout("p1", "tw")})
	if err != nil || rs[0].Duplicate || !rs[1].Duplicate || rs[0].OutboxID != rs[1].OutboxID {
		t.Fatalf("agreeing twins: %+v, %v", rs, err)
	}
}
