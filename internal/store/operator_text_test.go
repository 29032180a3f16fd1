package store_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/internal/testdb"
)

// TestDatabaseRefusalsOfOperatorInputAreTyped: the operator functions'
// refusals of their input (migration 051: a line break, a bidi override,
// a name or reason past its bound, a paused rail type no instruction may
// name) read in Go as the store's own errors for that input, the
// database's error still in them, should a caller reach the database with
// input the store's checks let through; other errors are left as they
// are. The store's checks refuse the same input first, and write nothing.
func TestDatabaseRefusalsOfOperatorInputAreTyped(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := t.Context()
	st, err := store.New("")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		sql  string
		args []any
		want error
	}{
		{`SELECT outbox.replay_dead_letter(gen_random_uuid(), $1, 'why')`, []any{"ali\nce"}, store.ErrOperatorAction},
		{`SELECT outbox.acknowledge_dead_letter(gen_random_uuid(), 'alice', $1)`, []any{"why\u202e"}, store.ErrOperatorAction},
		{`SELECT outbox.cancel_pending(gen_random_uuid(), $1, 'why')`, []any{strings.Repeat("n", store.MaxOperatorNameBytes+1)}, store.ErrOperatorAction},
		{`SELECT outbox.resume_rail('sandbox', 'alice', $1)`, []any{strings.Repeat("r", store.MaxReasonBytes+1)}, store.ErrOperatorAction},
		{`SELECT outbox.pause_rail($1, 'alice', 'why')`, []any{"sand\u200bbox"}, store.ErrRailType},
	} {
		_, err := pool.Exec(ctx, c.sql, c.args...)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) {
			t.Fatalf("%s: %v, want the database's refusal", c.sql, err)
		}
		if got := store.RefusedInput(err); !errors.Is(got, c.want) || !errors.As(got, &pgErr) {
			t.Errorf("%s: %v, want %v with the database's error in it", c.sql, got, c.want)
		}
	}
	// Another error is not the operator's input.
	_, err = pool.Exec(ctx, `SELECT outbox.replay_dead_letter(gen_random_uuid(), 'alice', 'why', 'extra')`)
	if got := store.RefusedInput(err); got != err || errors.Is(got, store.ErrOperatorAction) {
		t.Errorf("an unknown function: %v, want it as it was", got)
	}

	// The store refuses the same before it sends anything.
	long := strings.Repeat("r", store.MaxReasonBytes+1)
	if _, err := st.PauseRail(ctx, pool, "sandbox", "alice", long); !errors.Is(err, store.ErrOperatorAction) {
		t.Errorf("a pause with a reason of %d bytes: %v, want ErrOperatorAction", len(long), err)
	}
	if _, err := st.PauseRail(ctx, pool, "sand\u200bbox", "alice", "why"); !errors.Is(err, store.ErrRailType) {
		t.Errorf("a pause of a rail with a zero-width space: %v, want ErrRailType", err)
	}
	if pauses, err := st.RailPauses(ctx, pool); err != nil || len(pauses) != 0 {
		t.Errorf("after the refusals: %v paused (%v), want none", pauses, err)
	}
	// A resume takes any rail type: a pause made before the check can be
	// ended.
	if _, err := pool.Exec(ctx, `INSERT INTO outbox.rail_pauses (rail_type, paused_by, reason) VALUES ('old'||chr(10)||'rail', 'bob', 'before 051')`); err != nil {
		t.Fatal(err)
	}
	if ok, err := st.ResumeRail(ctx, pool, "old\nrail", "alice", "ended"); err != nil || !ok {
		t.Errorf("resume of a pause made before the check: %v, %v; want resumed", ok, err)
	}
}
