package reaper

import (
	"context"
	"testing"
	"time"

	"github.com/ledgerline/outbox/internal/testdb"
)

// TestReaperSurvivesBlackHoledConnections: when the connections a
// reaper's pool holds go silent for good (the primary died without
// resetting them; new connections reach the new primary, as after a
// failover), each statement of a pass must give up on its connection
// within a deadline, so that the next pass opens fresh ones and zombies
// are requeued within the heal bound. A statement without a deadline on
// such a connection hangs until TCP gives up (about 15 minutes on Linux),
// and the reaper with it. Before the fix the pass hung on its first
// statement and the zombie made after the hole was never requeued.
func TestReaperSurvivesBlackHoledConnections(t *testing.T) {
	t.Parallel()
	// Two connections are open (and idle) before the hole, so that the
	// reaper's next statements take silent ones. The other two slots stay
	// free: pgx takes up to 15 s to clean up a connection it dropped,
	// holding its slot.
	direct, proxied, proxy := testdb.NewProxied(t, 4, 2)
	b := setupSchema(t, direct, "")

	r, err := New(proxied, Config{Interval: MinInterval, ReaperID: "reaper-hole"})
	if err != nil {
		t.Fatal(err)
	}
	const deadline = time.Second
	r.testRoundTrip = deadline
	if err := r.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = r.Stop(ctx)
	})
	waitFor(t, "a first pass", func() (bool, error) { return r.Stats().Passes > 0, nil })

	t.Logf("black-holed %d connections", proxy.HoldExisting())
	b.enqueue(t, "p-1", "k-1")
	zombie := b.claim(t, "dead-relayer", 1, deadLease)
	b.waitExpired(t, zombie)
	start := time.Now()
	within := 10*deadline + 2*MinInterval + 5*time.Second
	for {
		var inflight int
		if err := direct.QueryRow(b.ctx, `SELECT count(*) FROM outbox.inflight`).Scan(&inflight); err != nil {
			t.Fatal(err)
		}
		if inflight == 0 {
			break
		}
		if time.Since(start) > within {
			t.Fatalf("the zombie made after the black hole was not requeued within %s: %+v", within, r.Stats())
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("requeued %s after its lease expired", time.Since(start).Round(time.Millisecond))
}
