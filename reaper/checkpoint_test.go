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

// TestCheckpointHeldUpDoesNotHoldUpRequeues: a checkpoint waits (here
// for a lock on the checkpoints table that a session holds; in
// production for another reaper's step, the archive's writers, or a
// backlog's steps, up to two minutes a pass). Before the fix the
// background pass took its checkpoints after its requeues, in the same
// goroutine, so a zombie whose lease ran out meanwhile waited for the
// checkpoint to give up, past the interval that Config.HealBound
// promises; now checkpoints run beside the passes, and the zombie is
// requeued while the checkpoint still waits.
func TestCheckpointHeldUpDoesNotHoldUpRequeues(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// An hour of archive without a checkpoint: one is due at once.
	if _, err := b.pool.Exec(b.ctx, b.q(`UPDATE {schema}.settings SET chained_since = clock_timestamp() - interval '1 hour'`)); err != nil {
		t.Fatal(err)
	}
	lock, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback(context.Background())
	if _, err := lock.Exec(b.ctx, b.q(`LOCK TABLE {schema}.checkpoints IN ACCESS EXCLUSIVE MODE`)); err != nil {
		t.Fatal(err)
	}
	r := b.newReaper(t, Config{Interval: time.Second})
	if err := r.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = r.Stop(ctx)
	})
	waitFor(t, "the checkpoint to wait for the lock", func() (bool, error) {
		var waiting bool
		err := b.pool.QueryRow(b.ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND pid <> pg_backend_pid())`).Scan(&waiting)
		return waiting, err
	})

	b.enqueue(t, "p1", "k1")
	dead := b.claim(t, "dead", 1, deadLease)
	if len(dead) != 1 {
		t.Fatalf("claimed %d, want 1", len(dead))
	}
	waitFor(t, "the zombie to be requeued while the checkpoint waits", func() (bool, error) {
		_, ok := b.pendingRow(t, dead[0].OutboxID)
		return ok, nil
	})
	if n := r.Stats().Checkpoints; n != 0 {
		t.Fatalf("%d checkpoints taken behind the lock", n)
	}
	if err := lock.Rollback(b.ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the checkpoint once the lock is gone", func() (bool, error) { return r.Stats().Checkpoints > 0, nil })
}
