package reaper_test

import (
	"context"
	"fmt"

	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/reaper"
)

// One reaper pass over a healthy database requeues nothing.
func ExampleReaper_RunOnce() {
	pool := testdb.ForExample()
	r, err := reaper.New(pool, reaper.Config{})
	if err != nil {
		panic(err)
	}
	requeued, err := r.RunOnce(context.Background())
	fmt.Println("requeued:", len(requeued), "error:", err)
	// Output: requeued: 0 error: <nil>
}
