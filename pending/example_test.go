package pending_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/pending"
)

// A payment service records a payout and its instruction in one
// transaction: both commit or neither does. A replayed request (same
// idempotency key, same payload) gets the original receipt back and writes
// nothing.
func ExampleEnqueue() {
	ctx := context.Background()
	pool := testdb.ForExample() // a fresh, migrated database

	// The service's own business table.
	if _, err := pool.Exec(ctx, `CREATE TABLE payouts (
		payout_id    text PRIMARY KEY,
		merchant_id  text NOT NULL,
		amount_minor bigint NOT NULL
	)`); err != nil {
		fmt.Println("create table:", err)
		return
	}

	createPayout := func(payoutID, merchantID string, amountMinor int64) (pending.Receipt, error) {
		var receipt pending.Receipt
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			// A replayed request finds its payout already recorded.
			if _, err := tx.Exec(ctx, `INSERT INTO payouts (payout_id, merchant_id, amount_minor)
				VALUES ($1, $2, $3) ON CONFLICT (payout_id) DO NOTHING`, payoutID, merchantID, amountMinor); err != nil {
				return err
			}
			var err error
			receipt, err = pending.Enqueue(ctx, tx, pending.Instruction{
				InstructionID:  payoutID,
				ParticipantID:  merchantID,
				IdempotencyKey: pending.DeterministicKey("payouts", payoutID),
				RailType:       "sandbox",
				AmountMinor:    amountMinor, // cents
				Currency:       "USD",
				Destination:    "acct-1",
			})
			return err
		})
		return receipt, err
	}

	first, err := createPayout("payout-1", "merchant-7", 1250)
	if err != nil {
		fmt.Println("enqueue:", err)
		return
	}
	fmt.Printf("sequence %d, duplicate %v\n", first.SequenceID, first.Duplicate)

	replay, err := createPayout("payout-1", "merchant-7", 1250)
	if err != nil {
		fmt.Println("replay:", err)
		return
	}
	fmt.Printf("sequence %d, duplicate %v, same outbox id %v\n", replay.SequenceID, replay.Duplicate, replay.OutboxID == first.OutboxID)

	var payouts, queued int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM payouts), (SELECT count(*) FROM outbox.pending)`).Scan(&payouts, &queued); err != nil {
		fmt.Println("count:", err)
		return
	}
	fmt.Printf("payouts %d, queued instructions %d\n", payouts, queued)

	// Output:
	// sequence 1, duplicate false
	// sequence 1, duplicate true, same outbox id true
	// payouts 1, queued instructions 1
}

// A batch enqueues many instructions in a few round trips; each participant
// gets consecutive sequence ids in input order. A batch in which one
// instruction reuses a key with another payload writes nothing and says
// which one.
func ExampleProducer_EnqueueBatch() {
	ctx := context.Background()
	pool := testdb.ForExample()
	producer, err := pending.NewProducer(pending.Config{})
	if err != nil {
		fmt.Println(err)
		return
	}

	payout := func(merchantID, payoutID string, amountMinor int64) pending.Instruction {
		return pending.Instruction{
			InstructionID:  payoutID,
			ParticipantID:  merchantID,
			IdempotencyKey: pending.DeterministicKey("payouts", payoutID),
			RailType:       "sandbox",
			AmountMinor:    amountMinor,
			Currency:       "EUR",
			Destination:    "acct-" + merchantID,
		}
	}
	batch := []pending.Instruction{
		payout("merchant-a", "payout-1", 1000),
		payout("merchant-b", "payout-2", 2000),
		payout("merchant-a", "payout-3", 3000),
	}
	var receipts []pending.Receipt
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		receipts, err = producer.EnqueueBatch(ctx, tx, batch)
		return err
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	for i, r := range receipts {
		fmt.Printf("%s %s: sequence %d\n", batch[i].ParticipantID, batch[i].InstructionID, r.SequenceID)
	}

	// payout-1 again, but for another amount.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := producer.EnqueueBatch(ctx, tx, []pending.Instruction{
			payout("merchant-b", "payout-4", 4000),
			payout("merchant-a", "payout-1", 1001),
		})
		return err
	})
	var be *pending.BatchError
	if errors.As(err, &be) {
		fmt.Printf("instruction %d: mismatch %v\n", be.Index, errors.Is(err, pending.ErrIdempotencyMismatch))
	}
	var queued int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox.pending`).Scan(&queued); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("queued instructions:", queued)

	// Output:
	// merchant-a payout-1: sequence 1
	// merchant-b payout-2: sequence 1
	// merchant-a payout-3: sequence 2
	// instruction 1: mismatch true
	// queued instructions: 3
}

// DeterministicKey derives the idempotency key from what identifies the
// operation, so a retried request carries the same key without storing it
// anywhere. The key is a UUIDv5 that never changes across processes or
// versions.
func ExampleDeterministicKey() {
	key := pending.DeterministicKey("payouts", "tenant-1", "payout-9", "v1")
	again := pending.DeterministicKey("payouts", "tenant-1", "payout-9", "v1")
	other := pending.DeterministicKey("payouts", "tenant-1", "payout-10", "v1")
	// Parts are length-prefixed: moving a boundary changes the key.
	joined := pending.DeterministicKey("payouts", "tenant-1payout-9", "v1")

	fmt.Println(key)
	fmt.Println("same input, same key:", key == again)
	fmt.Println("different input, different key:", key != other)
	fmt.Println("parts are not just concatenated:", key != joined)

	// Output:
	// a6ef7b92-6601-5286-9ee0-21081afc0f4a
	// same input, same key: true
	// different input, different key: true
	// parts are not just concatenated: true
}

// An enqueue in a transaction the database refuses to write in (a READ
// ONLY transaction here; a standby's connection after a failover alike) is
// pending.ErrReadOnly and writes nothing: the caller retries it in a
// writable transaction, on the primary, where it goes through.
func ExampleErrReadOnly() {
	ctx := context.Background()
	pool := testdb.ForExample()
	in := pending.Instruction{InstructionID: "payout-9", ParticipantID: "merchant-7", IdempotencyKey: "payout-9",
		RailType: "sandbox", AmountMinor: 500, Currency: "USD", Destination: "acct-1"}

	err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		_, err := pending.Enqueue(ctx, tx, in)
		return err
	})
	fmt.Println("read-only:", errors.Is(err, pending.ErrReadOnly))

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		r, err := pending.Enqueue(ctx, tx, in)
		fmt.Println("writable: sequence", r.SequenceID)
		return err
	})
	fmt.Println(err)
	// Output:
	// read-only: true
	// writable: sequence 1
	// <nil>
}
