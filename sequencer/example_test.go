package sequencer_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/sequencer"
)

// Sequence ids are allocated inside the caller's transaction; a rollback
// gives the id back.
func ExampleNext() {
	ctx := context.Background()
	pool := testdb.ForExample()

	_ = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		id, _ := sequencer.Next(ctx, tx, "merchant-7")
		fmt.Println("allocated, then rolled back:", id)
		return fmt.Errorf("roll back")
	})
	_ = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		id, err := sequencer.Next(ctx, tx, "merchant-7")
		fmt.Println("allocated and committed:", id)
		return err
	})
	// Output:
	// allocated, then rolled back: 1
	// allocated and committed: 1
}
