package reaper

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// A relayer registers in relayer_idle while it waits for work and removes
// its row when it stops; one that is killed (OOM, SIGKILL after a rolling
// deploy's grace period, node loss) or stops while the database is away
// leaves its row behind, under an id no relayer uses again
// (host-pid-random). The pending insert trigger ignores such rows but
// reads them on every insert, and nothing else removed them: over years
// of deploys the table only grew. The reaper's background pass removes
// registrations far older than any live relayer's refresh.
func TestPassForgetsDeadRelayersIdleRegistrations(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const killed = 40
	for i := range killed {
		if err := b.st.RegisterIdle(b.ctx, b.pool, fmt.Sprintf("killed-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	// They registered, then died two hours ago: their rows were never
	// refreshed since.
	if _, err := b.pool.Exec(b.ctx, b.q(`UPDATE {schema}.relayer_idle SET idle_since = idle_since - interval '2 hours'`)); err != nil {
		t.Fatal(err)
	}
	// One relayer idle right now, and one whose refresh is a little late
	// (a slow database): both are kept.
	if err := b.st.RegisterIdle(b.ctx, b.pool, "alive"); err != nil {
		t.Fatal(err)
	}
	if err := b.st.RegisterIdle(b.ctx, b.pool, "slow-refresh"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(b.ctx, b.q(`UPDATE {schema}.relayer_idle SET idle_since = idle_since - interval '30 seconds' WHERE relayer_id = 'slow-refresh'`)); err != nil {
		t.Fatal(err)
	}

	r := b.newReaper(t, Config{Interval: time.Second})
	if err := r.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Stop(context.Background()) })
	// Passes counts the reap, which comes before the rest of a pass: wait
	// for the registrations to go (bounded), then look at what is left.
	waitFor(t, "a pass to remove the dead relayers' registrations", func() (bool, error) {
		var n int
		err := b.pool.QueryRow(b.ctx, b.q(`SELECT count(*) FROM {schema}.relayer_idle`)).Scan(&n)
		return n <= 2, err
	})
	if err := r.Stop(b.ctx); err != nil {
		t.Fatal(err)
	}

	rows, err := b.pool.Query(b.ctx, b.q(`SELECT relayer_id FROM {schema}.relayer_idle ORDER BY relayer_id`))
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		left = append(left, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(left) != "[alive slow-refresh]" {
		t.Errorf("relayer_idle after a pass: %d rows %v; want the live registrations [alive slow-refresh] only", len(left), left[:min(len(left), 5)])
	}
}
