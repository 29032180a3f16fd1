package pending_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/pending"
)

// TestEnqueueBatchOverItsLimitIsRefused: a batch of more than
// MaxBatchSize instructions, or more than its payload limit, is refused
// with ErrBatchTooLarge before anything is sent (a closed pool would
// fail any statement), writes nothing and leaves the caller's
// transaction usable; a batch at either limit is enqueued whole. There
// was no limit: a batch too large for a statement failed with the
// server's untyped error after the work of sending it, and one past the
// protocol's message limit lost the connection, the caller's
// transaction with it.
func TestEnqueueBatchOverItsLimitIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	lines := func(prefix string, n int) []pending.Instruction {
		ins := make([]pending.Instruction, n)
		for i := range ins {
			ins[i] = payout(fmt.Sprintf("p%d", i%50), fmt.Sprintf("%s-%d", prefix, i))
		}
		return ins
	}
	closed, err := pgxpool.New(b.ctx, b.pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	closed.Close()
	tooLarge := func(name string, p *pending.Producer, ins []pending.Instruction) {
		t.Helper()
		_, err := p.EnqueueBatch(b.ctx, closed, ins)
		var big *pending.BatchTooLargeError
		if !errors.Is(err, pending.ErrBatchTooLarge) || !errors.As(err, &big) || big.Instructions != len(ins) {
			t.Errorf("%s, %d instructions, on a closed pool: %v; want a *BatchTooLargeError before any statement", name, len(ins), err)
		}
		tx, err := b.pool.Begin(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(b.ctx)
		if _, err := p.EnqueueBatch(b.ctx, tx, ins); !errors.Is(err, pending.ErrBatchTooLarge) {
			t.Errorf("%s, %d instructions: %v, want ErrBatchTooLarge", name, len(ins), err)
		}
		var one int
		if err := tx.QueryRow(b.ctx, `SELECT 1`).Scan(&one); err != nil {
			t.Errorf("%s: the transaction is unusable after the refusal: %v", name, err)
		}
		if err := tx.Commit(b.ctx); err != nil {
			t.Fatal(err)
		}
		if c := b.counts(t); c != (tableCounts{}) {
			t.Fatalf("%s: counts %+v after the refusal, want nothing written", name, c)
		}
	}

	// By count.
	tooLarge("one past MaxBatchSize", b.producer, lines("over", pending.MaxBatchSize+1))

	// By payload, the limit lowered to what three lines take.
	small, err := pending.NewProducer(pending.Config{})
	if err != nil {
		t.Fatal(err)
	}
	three := lines("bytes", 3)
	total := 0
	for _, in := range three {
		n, err := pending.StoredSizeOf(small, in)
		if err != nil {
			t.Fatal(err)
		}
		total += n
	}
	pending.SetMaxBatchPayloadBytes(small, total-1)
	tooLarge("a byte past the payload limit", small, three)
	pending.SetMaxBatchPayloadBytes(small, total)
	if _, err := small.EnqueueBatch(b.ctx, b.pool, three); err != nil {
		t.Fatalf("at the payload limit: %v", err)
	}

	// At MaxBatchSize: enqueued whole.
	if _, err := b.producer.EnqueueBatch(b.ctx, b.pool, lines("at", pending.MaxBatchSize)); err != nil {
		t.Fatalf("%d instructions, MaxBatchSize: %v", pending.MaxBatchSize, err)
	}
	n := pending.MaxBatchSize + 3
	if c := b.counts(t); c != (tableCounts{keys: n, pending: n, sequences: n}) {
		t.Fatalf("counts %+v, want the batches at the limits, %d", c, n)
	}
}

// TestNewProducerRefusesAPayloadLimitNoBatchTakes: MaxPayloadBytes past
// MaxBatchPayloadBytes is refused: an instruction at it could not be
// enqueued even alone.
func TestNewProducerRefusesAPayloadLimitNoBatchTakes(t *testing.T) {
	t.Parallel()
	if _, err := pending.NewProducer(pending.Config{MaxPayloadBytes: pending.MaxBatchPayloadBytes + 1}); !errors.Is(err, pending.ErrInvalidConfig) {
		t.Errorf("MaxPayloadBytes one past MaxBatchPayloadBytes: %v, want ErrInvalidConfig", err)
	}
	if _, err := pending.NewProducer(pending.Config{MaxPayloadBytes: pending.MaxBatchPayloadBytes}); err != nil {
		t.Errorf("MaxPayloadBytes at MaxBatchPayloadBytes: %v", err)
	}
}
