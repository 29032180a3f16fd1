package store_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ledgerline/outbox/internal/store"
)

// defaultScene is an archive whose current month and the month after next
// have no partition (upkeep never ran that far): the current month holds
// the real rows of a history (claims, retries, a replay, a reaped lease,
// hashed and chained) and the later month one row written by hand, all in
// the default partition.
type defaultScene struct {
	*recordBundle
	current, later store.MovedMonth
	rows           []string // every archive row as text, in (created_at, attempt_id) order
}

func setupDefaultScene(t *testing.T) *defaultScene {
	t.Helper()
	b := setupRecord(t)
	if err := b.st.EnsurePartitions(b.ctx, b.pool, 3); err != nil {
		t.Fatal(err)
	}
	var now time.Time
	if err := b.pool.QueryRow(b.ctx, `SELECT date_trunc('month', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'`).Scan(&now); err != nil {
		t.Fatal(err)
	}
	month := func(from time.Time) store.MovedMonth {
		from = from.UTC()
		return store.MovedMonth{Partition: "attempts_" + from.Format("2006_01"), From: from, To: from.AddDate(0, 1, 0)}
	}
	s := &defaultScene{recordBundle: b, current: month(now), later: month(now.AddDate(0, 2, 0))}
	execAll(t, b.pool, "DROP TABLE outbox."+s.current.Partition, "DROP TABLE outbox."+s.later.Partition)
	b.history(t)
	if _, err := b.pool.Exec(b.ctx, `INSERT INTO outbox.attempts (outbox_id, instruction_id, participant_id, sequence_id,
		idempotency_key, rail_type, attempt_no, state, relayer_id, claimed_at, created_at)
		VALUES (gen_random_uuid(), 'ins-later', 'p9', 1, 'k-later', 'sandbox', 1, 'CANCELLED', 'op', $1::timestamptz + interval '1 day', $1::timestamptz + interval '1 day')`,
		s.later.From); err != nil {
		t.Fatal(err)
	}
	s.current.Rows = s.inDefault(t, s.current)
	s.later.Rows = 1
	if s.current.Rows < 10 || s.inDefault(t, s.later) != 1 {
		t.Fatalf("the default partition holds %d rows of %s and %d of %s", s.current.Rows, s.current.Partition, s.inDefault(t, s.later), s.later.Partition)
	}
	s.rows = s.archiveRows(t)
	return s
}

// inDefault counts the default partition's rows of month m.
func (s *defaultScene) inDefault(t *testing.T, m store.MovedMonth) int64 {
	t.Helper()
	var n int64
	if err := s.pool.QueryRow(s.ctx, `SELECT count(*) FROM outbox.attempts_default WHERE created_at >= $1 AND created_at < $2`, m.From, m.To).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (s *defaultScene) archiveRows(t *testing.T) []string {
	t.Helper()
	rows, err := s.pool.Query(s.ctx, `SELECT a::text FROM outbox.attempts a ORDER BY created_at, attempt_id`)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// violations runs verify and returns what it reports, as text.
func (s *defaultScene) violations(t *testing.T, export []store.Checkpoint) []string {
	t.Helper()
	r, err := s.st.Verify(s.ctx, s.pool, store.VerifyOptions{Ordered: true, Checkpoints: export})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, v := range r.Violations {
		out = append(out, v.String())
	}
	return out
}

// partitionOf says which table holds the archive's rows of month m, its
// parent and, for comparing with a month upkeep made, its owner, grants,
// row-level security and triggers.
func (s *defaultScene) partitionOf(t *testing.T, m store.MovedMonth) (table, standing string) {
	t.Helper()
	err := s.pool.QueryRow(s.ctx, `
		SELECT coalesce((SELECT string_agg(DISTINCT tableoid::regclass::text, ',') FROM outbox.attempts WHERE created_at >= $1 AND created_at < $2), ''),
		       coalesce((SELECT format('parent=%s owner=%s acl=%s rls=%s triggers=%s', i.inhparent::regclass, pg_get_userbyid(c.relowner),
		                               coalesce(c.relacl::text, ''), c.relrowsecurity,
		                               (SELECT string_agg(tgname || ':' || tgenabled::text, ',' ORDER BY tgname) FROM pg_trigger WHERE tgrelid = c.oid))
		                 FROM pg_class c JOIN pg_inherits i ON i.inhrelid = c.oid WHERE c.oid = to_regclass('outbox.' || $3)), 'none')`,
		m.From, m.To, m.Partition).Scan(&table, &standing)
	if err != nil {
		t.Fatal(err)
	}
	return table, standing
}

// TestMoveDefaultRowsGivesEachMonthItsPartition: rows written in a month
// that had no partition went to the default partition, where that month
// could never be created, detached or exported, and upkeep failed for the
// rest of it. MoveDefaultRows moves each such month into a partition of
// its own: the same rows, byte for byte, the same verify report (hashes,
// chains, the checkpoint taken before), the default partition empty and
// still append-only, each new month standing as a month upkeep made (owner,
// grants, row-level security, triggers), upkeep at ease again, and the
// relayers' next rows in the month's own partition.
func TestMoveDefaultRowsGivesEachMonthItsPartition(t *testing.T) {
	t.Parallel()
	s := setupDefaultScene(t)
	if err := s.st.EnsurePartitions(s.ctx, s.pool, 3); !errors.Is(err, store.ErrPartitionMissing) {
		t.Fatalf("upkeep before the move: %v, want ErrPartitionMissing", err)
	}
	export := []store.Checkpoint{*s.checkpoint(t)}
	before := s.violations(t, export)
	for _, v := range before {
		t.Logf("verify before the move: %s", v) // the hand-written row has no hash
	}

	moved, err := s.st.MoveDefaultRows(s.ctx, s.pool, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if want := []store.MovedMonth{s.current, s.later}; !slices.Equal(moved, want) {
		t.Fatalf("moved %+v, want %+v", moved, want)
	}
	if got := s.archiveRows(t); !slices.Equal(got, s.rows) {
		t.Fatalf("the archive's rows changed:\n%q\nwant\n%q", got, s.rows)
	}
	if after := s.violations(t, export); !slices.Equal(after, before) {
		t.Fatalf("verify after the move reports %q, before it %q", after, before)
	}
	var left int64
	if err := s.pool.QueryRow(s.ctx, `SELECT count(*) FROM outbox.attempts_default`).Scan(&left); err != nil || left != 0 {
		t.Fatalf("the default partition still holds %d rows (%v)", left, err)
	}
	_, upkept := s.partitionOf(t, store.MovedMonth{Partition: "attempts_" + s.current.From.AddDate(0, 1, 0).Format("2006_01")})
	for _, m := range moved {
		table, standing := s.partitionOf(t, m)
		if table != "outbox."+m.Partition || standing != upkept {
			t.Errorf("%s: rows in %s, standing %s; want rows in outbox.%s, standing as upkeep's month: %s", m.Partition, table, standing, m.Partition, upkept)
		}
	}
	if _, standing := s.partitionOf(t, store.MovedMonth{Partition: "attempts_default"}); !strings.Contains(standing, "attempts_append_only:O") {
		t.Errorf("the default partition after the move: %s, want its append-only trigger enabled", standing)
	}
	for _, q := range []string{
		`DELETE FROM outbox.attempts WHERE tableoid = 'outbox.` + s.current.Partition + `'::regclass`,
		`TRUNCATE outbox.` + s.current.Partition,
	} {
		if _, err := s.pool.Exec(s.ctx, q); err == nil {
			t.Errorf("%s: accepted, want the archive's append-only trigger to refuse it", q)
		}
	}
	if err := s.st.EnsurePartitions(s.ctx, s.pool, 3); err != nil {
		t.Fatalf("upkeep after the move: %v", err)
	}
	if again, err := s.st.MoveDefaultRows(s.ctx, s.pool, 5*time.Second); err != nil || len(again) != 0 {
		t.Fatalf("a second move: %+v, %v; want nothing to move", again, err)
	}
	s.enqueue(t, "p5", "k5")
	s.record(t, recordOutcome(t, s.claimOne(t, "r1", longLease), "r1", store.Dispatched))
	if table, _ := s.partitionOf(t, s.current); table != "outbox."+s.current.Partition {
		t.Fatalf("this month's rows after the move are in %s", table)
	}
}

// TestMoveDefaultRowsMovesAllOrNothing: a month whose partition's name is
// taken (here by a table of another shape) refuses the whole move with
// ErrArchiveLifecycle, and a default partition another session holds a
// lock on gives up after the lock timeout; either way every row is where
// it was and no partition was created.
func TestMoveDefaultRowsMovesAllOrNothing(t *testing.T) {
	t.Parallel()
	s := setupDefaultScene(t)
	unchanged := func(t *testing.T) {
		t.Helper()
		if got := s.archiveRows(t); !slices.Equal(got, s.rows) {
			t.Fatalf("the archive's rows changed")
		}
		for _, m := range []store.MovedMonth{s.current, s.later} {
			if n := s.inDefault(t, m); n != m.Rows {
				t.Errorf("%s: %d rows in the default partition, want %d", m.Partition, n, m.Rows)
			}
		}
		if table, standing := s.partitionOf(t, s.current); table != "outbox.attempts_default" || standing != "none" {
			t.Errorf("%s: rows in %s, partition %s; want the default partition's and none", s.current.Partition, table, standing)
		}
	}

	tx, err := s.pool.Begin(s.ctx)
	if err != nil {
		t.Fatal(err)
	}
	execAll(t, tx, `LOCK TABLE outbox.attempts_default IN ACCESS SHARE MODE`)
	_, err = s.st.MoveDefaultRows(s.ctx, s.pool, 200*time.Millisecond)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "55P03" {
		t.Fatalf("move while another session reads the default partition: %v, want lock_not_available", err)
	}
	if err := tx.Rollback(s.ctx); err != nil {
		t.Fatal(err)
	}
	unchanged(t)

	execAll(t, s.pool, `CREATE TABLE outbox.`+s.later.Partition+` (note text)`)
	if _, err := s.st.MoveDefaultRows(s.ctx, s.pool, 5*time.Second); !errors.Is(err, store.ErrArchiveLifecycle) {
		t.Fatalf("move with %s taken: %v, want ErrArchiveLifecycle", s.later.Partition, err)
	}
	unchanged(t)
}
