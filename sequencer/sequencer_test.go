package sequencer_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/sequencer"
)

func TestMain(m *testing.M) { testdb.Main(m) }

type testBundle struct {
	ctx  context.Context
	pool *pgxpool.Pool
	seq  *sequencer.Sequencer
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	s, err := sequencer.New("")
	if err != nil {
		t.Fatal(err)
	}
	return &testBundle{ctx: t.Context(), pool: testdb.New(t), seq: s}
}

func TestNextStartsAtOneAndIncrements(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for want := int64(1); want <= 3; want++ {
		got, err := sequencer.Next(b.ctx, b.pool, "p1")
		if err != nil || got != want {
			t.Fatalf("Next = %d, %v; want %d", got, err, want)
		}
	}
	if got, _ := sequencer.Next(b.ctx, b.pool, "p2"); got != 1 {
		t.Fatalf("another participant starts at %d, want 1", got)
	}
	if last, err := b.seq.Last(b.ctx, b.pool, "p1"); err != nil || last != 3 {
		t.Fatalf("Last = %d, %v; want 3", last, err)
	}
	if _, err := sequencer.Next(b.ctx, b.pool, ""); !errors.Is(err, sequencer.ErrEmptyParticipant) {
		t.Fatalf("empty participant: err = %v", err)
	}
}

func TestRollbackReturnsTheID(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if id, err := b.seq.Next(b.ctx, tx, "p1"); err != nil || id != 1 {
		t.Fatalf("Next in tx = %d, %v", id, err)
	}
	if err := tx.Rollback(b.ctx); err != nil {
		t.Fatal(err)
	}
	if id, err := b.seq.Next(b.ctx, b.pool, "p1"); err != nil || id != 1 {
		t.Fatalf("after rollback Next = %d, %v; want 1 again", id, err)
	}
}

// TestSameParticipantSerializesOthersDoNot holds an allocation open and
// shows, with lock timeouts instead of clocks, that the same participant
// waits while a different one does not.
func TestSameParticipantSerializesOthersDoNot(t *testing.T) {
	t.Parallel()
	b := setup(t)
	holder, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(b.ctx)
	if _, err := b.seq.Next(b.ctx, holder, "p1"); err != nil {
		t.Fatal(err)
	}

	try := func(participant, lockTimeout string) error {
		return pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(b.ctx, "SET LOCAL lock_timeout = '"+lockTimeout+"'"); err != nil {
				return err
			}
			_, err := b.seq.Next(b.ctx, tx, participant)
			return err
		})
	}
	var pgErr *pgconn.PgError
	if err := try("p1", "200ms"); !errors.As(err, &pgErr) || pgErr.Code != "55P03" {
		t.Fatalf("same participant while held: err = %v, want lock_not_available", err)
	}
	if err := try("p2", "10s"); err != nil {
		t.Fatalf("different participant blocked: %v", err)
	}
}

// TestConcurrentGapFree: 16 workers, 50 participants, a quarter of the
// transactions rolled back; what committed is exactly 1..N per participant.
func TestConcurrentGapFree(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.pool.Exec(b.ctx, `CREATE TABLE allocated (participant_id text, sequence_id bigint)`); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errc := make(chan error, 16)
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for range 50 {
				p := fmt.Sprintf("p%d", rng.IntN(50))
				rollback := rng.IntN(4) == 0
				err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
					id, err := b.seq.Next(b.ctx, tx, p)
					if err != nil {
						return err
					}
					if _, err := tx.Exec(b.ctx, `INSERT INTO allocated VALUES ($1, $2)`, p, id); err != nil {
						return err
					}
					if rollback {
						return errSkip
					}
					return nil
				})
				if err != nil && !errors.Is(err, errSkip) {
					errc <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	var bad []string
	rows, err := b.pool.Query(b.ctx, `
		SELECT a.participant_id FROM allocated a JOIN outbox.sequences s USING (participant_id)
		GROUP BY a.participant_id, s.next_sequence_id
		HAVING count(*) <> count(DISTINCT a.sequence_id) OR min(a.sequence_id) <> 1
		    OR max(a.sequence_id) <> count(*) OR s.next_sequence_id - 1 <> count(*)`)
	if err != nil {
		t.Fatal(err)
	}
	bad, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(bad) > 0 {
		t.Fatalf("participants with gaps or repeats: %v", bad)
	}
	var n int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM allocated`).Scan(&n); err != nil || n == 0 {
		t.Fatalf("nothing committed (%d, %v): the test checked nothing", n, err)
	}
}

var errSkip = errors.New("rollback on purpose")
