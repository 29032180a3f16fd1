package reaper

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/attempts"
)

// A checkpoint digests a bounded number of rows (migration 043), so a
// backlog (hours in which every checkpoint was refused, or checkpointing
// was off) takes several. A pass takes them one after the other until it
// has caught up: one a pass would leave the archive behind for as many
// passes as the backlog has steps, and a backlog growing by more than a
// step a pass would never be closed. Each checkpoint here digests at most
// two rows, a claim and its outcome (outbox.checkpoint_max_rows = 2).
func TestPassClosesACheckpointBacklog(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.pool.Exec(b.ctx, b.q(`UPDATE {schema}.settings SET chained_since = clock_timestamp() - interval '1 hour'`)); err != nil {
		t.Fatal(err)
	}
	const claims = 4
	for i := range claims {
		b.enqueue(t, "p"+string(rune('a'+i)), "k"+string(rune('a'+i)))
		for _, c := range b.claim(t, "r1", 1, aliveLease) {
			record(t, b, c, "r1", attempts.Dispatched)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Older than the settle time a checkpoint leaves to the clock.
	time.Sleep(attempts.DefaultCheckpointSettle + 100*time.Millisecond)

	cfg := b.pool.Config()
	cfg.ConnConfig.RuntimeParams["outbox.checkpoint_max_rows"] = "2"
	capped, err := pgxpool.NewWithConfig(b.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer capped.Close()
	r, err := New(capped, Config{Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Stop(context.Background()) })
	// The first pass only: the next is an hour away. At least three
	// periods of at most two rows; the last rows may be in the tail,
	// shorter than the minimum period (the checkpoint interval), left to
	// a later pass.
	var behind time.Duration
	waitFor(t, "the first pass to bring the checkpoints within the checkpoint interval of now", func() (bool, error) {
		err := b.pool.QueryRow(b.ctx, b.q(`SELECT coalesce(clock_timestamp() - max(period_end), interval '1 day') FROM {schema}.checkpoints`)).Scan(&behind)
		return err == nil && behind <= DefaultCheckpointInterval+attempts.DefaultCheckpointSettle+5*time.Second, err
	})
	if n := r.Stats().Checkpoints; n < claims-1 {
		t.Errorf("the first pass took %d checkpoints, want at least %d of at most two rows", n, claims-1)
	}
}
