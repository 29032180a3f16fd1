package reaper

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/attempts"
	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/migrations"
	"github.com/ledgerline/outbox/pending"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// Leases used by the tests: one that is over almost at once (a relayer that
// died) and one that cannot run out during a test (a relayer still working).
const (
	deadLease  = 50 * time.Millisecond
	aliveLease = time.Hour
)

// testBundle is a fresh database with the real producer, claimer and
// archive, so the states the reaper sees are the ones relayers create.
type testBundle struct {
	ctx      context.Context
	pool     *pgxpool.Pool
	schema   string
	producer *pending.Producer
	st       *store.Store
	archive  *attempts.Archive
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	return setupSchema(t, testdb.New(t), "")
}

// setupSchema builds the bundle for a schema of pool (already migrated).
func setupSchema(t *testing.T, pool *pgxpool.Pool, schema string) *testBundle {
	t.Helper()
	producer, err := pending.NewProducer(pending.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.New(schema)
	if err != nil {
		t.Fatal(err)
	}
	archive, err := attempts.New(schema)
	if err != nil {
		t.Fatal(err)
	}
	return &testBundle{ctx: t.Context(), pool: pool, schema: schema, producer: producer, st: st, archive: archive}
}

// q renders a test query for the bundle's schema.
func (b *testBundle) q(sql string) string { return b.st.Qualify(sql) }

func payout(participant, key string) pending.Instruction {
	return pending.Instruction{
		InstructionID: "ins-" + key, ParticipantID: participant, IdempotencyKey: key,
		RailType: "sandbox", AmountMinor: 100, Currency: "USD", Destination: "acct-1",
	}
}

// enqueue commits one sandbox payment.
func (b *testBundle) enqueue(t *testing.T, participant, key string) pending.Receipt {
	t.Helper()
	r, err := b.producer.Enqueue(b.ctx, b.pool, payout(participant, key))
	if err != nil {
		t.Fatalf("enqueue %s/%s: %v", participant, key, err)
	}
	return r
}

// claim claims up to limit sandbox instructions for relayer with lease.
func (b *testBundle) claim(t *testing.T, relayer string, limit int, lease time.Duration) []store.Claimed {
	t.Helper()
	p := store.ClaimParams{RelayerID: relayer, Limit: limit, Leases: map[string]time.Duration{"sandbox": lease}}
	claimed, err := b.st.Claim(b.ctx, b.pool, p)
	if err == nil && len(claimed) == 0 {
		// Only suspects (requeued zombies) due: one, alone, as a relayer
		// takes them.
		p.Suspects, p.Limit = true, 1
		claimed, err = b.st.Claim(b.ctx, b.pool, p)
	}
	if err != nil {
		t.Fatalf("claim for %s: %v", relayer, err)
	}
	return claimed
}

// waitExpired waits (bounded) until the database clock is past the lease
// of every claimed instruction.
func (b *testBundle) waitExpired(t *testing.T, claimed []store.Claimed) {
	t.Helper()
	ids := make([]uuid.UUID, len(claimed))
	for i, c := range claimed {
		ids[i] = c.OutboxID
	}
	waitFor(t, "leases to expire", func() (bool, error) {
		var live int
		err := b.pool.QueryRow(b.ctx, b.q(`SELECT count(*) FROM {schema}.inflight WHERE outbox_id = ANY($1) AND lease_until >= now()`), ids).Scan(&live)
		return live == 0, err
	})
}

// waitFor polls cond until it holds, failing the test after 20 seconds.
func waitFor(t *testing.T, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ok, err := cond()
		if err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (b *testBundle) newReaper(t *testing.T, cfg Config) *Reaper {
	t.Helper()
	if cfg.Schema == "" {
		cfg.Schema = b.schema
	}
	r, err := New(b.pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// verify fails the test on any invariant violation and returns the report.
func (b *testBundle) verify(t *testing.T, ordered bool) attempts.Report {
	t.Helper()
	r, err := b.archive.Verify(b.ctx, b.pool, attempts.VerifyOptions{Ordered: ordered})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range r.Violations {
		t.Errorf("invariant violated: %s", v)
	}
	return r
}

// zombieCounts returns the number of ZOMBIE_REQUEUE rows per outbox id.
func (b *testBundle) zombieCounts(t *testing.T) map[uuid.UUID]int {
	t.Helper()
	rows, err := b.pool.Query(b.ctx, b.q(`SELECT outbox_id, count(*) FROM {schema}.attempts WHERE state = 'ZOMBIE_REQUEUE' GROUP BY 1`))
	if err != nil {
		t.Fatal(err)
	}
	counts := map[uuid.UUID]int{}
	var (
		id uuid.UUID
		n  int
	)
	if _, err := pgx.ForEachRow(rows, []any{&id, &n}, func() error { counts[id] = n; return nil }); err != nil {
		t.Fatal(err)
	}
	return counts
}

func (b *testBundle) count(t *testing.T, table string) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(b.ctx, b.q("SELECT count(*) FROM {schema}."+table)).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// pendingRow is what the tests check of a requeued pending row.
type pendingRow struct {
	sequenceID    int64
	attemptCount  int
	createdAt     time.Time
	due           bool
	payloadAmount int64
}

func (b *testBundle) pendingRow(t *testing.T, id uuid.UUID) (pendingRow, bool) {
	t.Helper()
	var p pendingRow
	err := b.pool.QueryRow(b.ctx, b.q(`
		SELECT sequence_id, attempt_count, created_at, next_attempt_at <= now(), (payload->>'amount_minor')::bigint
		FROM {schema}.pending WHERE outbox_id = $1`), id).Scan(&p.sequenceID, &p.attemptCount, &p.createdAt, &p.due, &p.payloadAmount)
	if errors.Is(err, pgx.ErrNoRows) {
		return p, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return p, true
}

func TestRunOnceRequeuesExpiredLeases(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.enqueue(t, "d1", "k1")
	b.enqueue(t, "d2", "k2")
	dead := b.claim(t, "dead", 10, deadLease)
	if len(dead) != 2 {
		t.Fatalf("dead relayer claimed %d, want 2", len(dead))
	}
	b.enqueue(t, "a1", "k3")
	b.enqueue(t, "d1", "k4") // d1's second instruction waits behind the zombie
	alive := b.claim(t, "alive", 10, aliveLease)
	if len(alive) != 1 || alive[0].InstructionID != "ins-k3" {
		t.Fatalf("alive relayer claimed %+v, want only ins-k3", alive)
	}
	b.waitExpired(t, dead)

	r := b.newReaper(t, Config{ReaperID: "reaper-1"})
	requeued, err := r.RunOnce(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(requeued) != 2 {
		t.Fatalf("requeued %d, want 2: %+v", len(requeued), requeued)
	}
	byID := map[uuid.UUID]Requeued{}
	for _, q := range requeued {
		byID[q.OutboxID] = q
	}
	for _, c := range dead {
		q, ok := byID[c.OutboxID]
		if !ok {
			t.Errorf("%s (%s) was not requeued", c.OutboxID, c.InstructionID)
			continue
		}
		if q.InstructionID != c.InstructionID || q.ParticipantID != c.ParticipantID || q.SequenceID != c.SequenceID ||
			q.AttemptNo != c.AttemptNo || q.RelayerID != "dead" || !q.ClaimedAt.Equal(c.ClaimedAt) || !q.LeaseUntil.Equal(c.LeaseUntil) {
			t.Errorf("requeued %+v does not match claim %+v", q, c)
		}
		if q.RequeuedAt.Before(q.LeaseUntil) {
			t.Errorf("%s requeued at %s, before its lease ended at %s", c.OutboxID, q.RequeuedAt, q.LeaseUntil)
		}

		// Back in pending with the same identity, first-enqueue time,
		// payload and attempt count (the zombie attempt is not counted).
		p, ok := b.pendingRow(t, c.OutboxID)
		if !ok {
			t.Errorf("%s is not pending", c.OutboxID)
			continue
		}
		if p.sequenceID != c.SequenceID || p.attemptCount != c.AttemptNo-1 || !p.createdAt.Equal(c.EnqueuedAt) || !p.due || p.payloadAmount != 100 {
			t.Errorf("pending row %+v; want sequence %d, attempt_count %d, created_at %s, due, amount 100",
				p, c.SequenceID, c.AttemptNo-1, c.EnqueuedAt)
		}

		// One ZOMBIE_REQUEUE row closes the dead relayer's claim.
		trail, err := b.archive.Trail(b.ctx, b.pool, c.OutboxID)
		if err != nil {
			t.Fatal(err)
		}
		if len(trail) != 2 || trail[0].State != attempts.Dispatching || trail[1].State != attempts.ZombieRequeue {
			t.Fatalf("trail of %s: %+v; want DISPATCHING, ZOMBIE_REQUEUE", c.OutboxID, trail)
		}
		z := trail[1]
		if z.AttemptNo != c.AttemptNo || z.ClaimAttemptID == nil || *z.ClaimAttemptID != c.AttemptID ||
			z.RelayerID == nil || *z.RelayerID != "dead" || !z.ClaimedAt.Equal(c.ClaimedAt) ||
			z.CompletedAt == nil || z.NextAttemptAt == nil || z.Late ||
			z.ErrorCode == nil || *z.ErrorCode != "ZOMBIE_REQUEUE" || z.SequenceID != c.SequenceID ||
			z.InstructionID != c.InstructionID || z.IdempotencyKey != c.IdempotencyKey || z.RailType != "sandbox" {
			t.Errorf("ZOMBIE_REQUEUE row %+v does not close claim %+v", z, c)
		}
		if z.ErrorMessage == nil || !strings.Contains(*z.ErrorMessage, "relayer dead") || !strings.Contains(*z.ErrorMessage, "reaper-1") {
			t.Errorf("ZOMBIE_REQUEUE message %v should name the dead relayer and the reaper", z.ErrorMessage)
		}
		var hasPayload bool
		if err := b.pool.QueryRow(b.ctx, `SELECT payload IS NOT NULL FROM outbox.attempts WHERE attempt_id = $1`, z.AttemptID).Scan(&hasPayload); err != nil {
			t.Fatal(err)
		}
		if hasPayload {
			t.Errorf("ZOMBIE_REQUEUE row carries a payload; only DISPATCHING rows do")
		}
	}

	// The live lease is untouched.
	var attemptID uuid.UUID
	if err := b.pool.QueryRow(b.ctx, `SELECT attempt_id FROM outbox.inflight`).Scan(&attemptID); err != nil {
		t.Fatalf("the unexpired in-flight row: %v", err)
	}
	if attemptID != alive[0].AttemptID {
		t.Errorf("in flight: attempt %s, want the alive relayer's %s", attemptID, alive[0].AttemptID)
	}
	if n := b.zombieCounts(t)[alive[0].OutboxID]; n != 0 {
		t.Errorf("the unexpired instruction got %d ZOMBIE_REQUEUE rows", n)
	}

	rep := b.verify(t, true)
	if rep.Instructions != 4 || rep.Pending != 3 || rep.InFlight != 1 || rep.Attempts != 5 {
		t.Errorf("report %+v; want 4 instructions, 3 pending, 1 in flight, 5 attempts", rep)
	}
	if st := r.Stats(); st.Passes != 1 || st.Requeued != 2 || st.Errors != 0 || st.LastPass.IsZero() {
		t.Errorf("stats %+v; want 1 pass, 2 requeued", st)
	}
}

func TestRunOnceIsIdempotent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.enqueue(t, "p1", "k1")
	b.enqueue(t, "p2", "k2")
	dead := b.claim(t, "dead", 10, deadLease)
	b.waitExpired(t, dead)

	// BatchSize 1 makes the first pass loop over batches.
	r := b.newReaper(t, Config{BatchSize: 1})
	first, err := r.RunOnce(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	second, err := r.RunOnce(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(first) != 2 || len(second) != 0 {
		t.Fatalf("passes requeued %d then %d, want 2 then 0", len(first), len(second))
	}
	zombies := b.zombieCounts(t)
	for _, c := range dead {
		if zombies[c.OutboxID] != 1 {
			t.Errorf("%s has %d ZOMBIE_REQUEUE rows, want 1", c.OutboxID, zombies[c.OutboxID])
		}
	}
	b.verify(t, true)
	if st := r.Stats(); st.Passes != 2 || st.Requeued != 2 {
		t.Errorf("stats %+v; want 2 passes, 2 requeued", st)
	}
}

func TestConcurrentReapersRequeueEachOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 500
	ins := make([]pending.Instruction, n)
	for i := range ins {
		ins[i] = payout(fmt.Sprintf("p%03d", i), fmt.Sprintf("k%03d", i))
	}
	if _, err := b.producer.EnqueueBatch(b.ctx, b.pool, ins); err != nil {
		t.Fatal(err)
	}
	dead := b.claim(t, "dead", n, deadLease)
	if len(dead) != n {
		t.Fatalf("claimed %d, want %d", len(dead), n)
	}
	b.waitExpired(t, dead)

	// Small batches, so the reapers' transactions interleave.
	reapers := make([]*Reaper, 4)
	for i := range reapers {
		reapers[i] = b.newReaper(t, Config{BatchSize: 7, ReaperID: fmt.Sprintf("reaper-%d", i)})
	}
	results := make([][]Requeued, len(reapers))
	errs := make([]error, len(reapers))
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, r := range reapers {
		wg.Go(func() {
			<-start
			results[i], errs[i] = r.RunOnce(b.ctx)
		})
	}
	close(start)
	wg.Wait()

	seen := map[uuid.UUID]int{}
	for i := range reapers {
		if errs[i] != nil {
			t.Errorf("reaper %d: %v", i, errs[i])
		}
		for _, q := range results[i] {
			seen[q.OutboxID]++
		}
		t.Logf("reaper %d requeued %d", i, len(results[i]))
	}
	zombies := b.zombieCounts(t)
	for _, c := range dead {
		if seen[c.OutboxID] != 1 || zombies[c.OutboxID] != 1 {
			t.Errorf("%s: returned by %d reapers, %d ZOMBIE_REQUEUE rows; want 1 and 1", c.OutboxID, seen[c.OutboxID], zombies[c.OutboxID])
		}
	}
	if len(zombies) != n {
		t.Errorf("%d instructions have ZOMBIE_REQUEUE rows, want %d", len(zombies), n)
	}
	if got := b.count(t, "inflight"); got != 0 {
		t.Errorf("%d rows still in flight", got)
	}
	rep := b.verify(t, true)
	if rep.Pending != n {
		t.Errorf("%d pending, want %d", rep.Pending, n)
	}
}

// TestRequeuedIsClaimedAgainInOrder: the requeued instruction is its
// participant's head again, and is claimed with the attempt number the dead
// relayer had: a zombie does not use up the retry budget.
func TestRequeuedIsClaimedAgainInOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first := b.enqueue(t, "p1", "k1")
	second := b.enqueue(t, "p1", "k2")

	// Attempt 1 fails retryably (so the count to keep is not zero).
	c1 := b.claim(t, "r1", 10, aliveLease)
	if len(c1) != 1 || c1[0].OutboxID != first.OutboxID || c1[0].AttemptNo != 1 {
		t.Fatalf("first claim %+v, want k1 attempt 1", c1)
	}
	record(t, b, c1[0], "r1", attempts.Retryable)

	// Attempt 2 is claimed by a relayer that dies.
	c2 := b.claim(t, "dead", 10, deadLease)
	if len(c2) != 1 || c2[0].OutboxID != first.OutboxID || c2[0].AttemptNo != 2 {
		t.Fatalf("second claim %+v, want k1 attempt 2", c2)
	}
	b.waitExpired(t, c2)
	if _, err := b.newReaper(t, Config{}).RunOnce(b.ctx); err != nil {
		t.Fatal(err)
	}

	c3 := b.claim(t, "r2", 10, aliveLease)
	if len(c3) != 1 || c3[0].OutboxID != first.OutboxID || c3[0].SequenceID != 1 {
		t.Fatalf("claim after requeue: %+v; want only k1 (sequence 1), the participant's head", c3)
	}
	if c3[0].AttemptNo != 2 || c3[0].AttemptID == c2[0].AttemptID {
		t.Errorf("claim after requeue: attempt %d (%s); want attempt 2 again, a new DISPATCHING row", c3[0].AttemptNo, c3[0].AttemptID)
	}
	record(t, b, c3[0], "r2", attempts.Dispatched)

	c4 := b.claim(t, "r2", 10, aliveLease)
	if len(c4) != 1 || c4[0].OutboxID != second.OutboxID || c4[0].AttemptNo != 1 {
		t.Fatalf("claim after dispatch: %+v; want k2 attempt 1", c4)
	}

	trail, err := b.archive.Trail(b.ctx, b.pool, first.OutboxID)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, a := range trail {
		got = append(got, fmt.Sprintf("%s#%d", a.State, a.AttemptNo))
	}
	want := []string{"DISPATCHING#1", "RETRYABLE#1", "DISPATCHING#2", "ZOMBIE_REQUEUE#2", "DISPATCHING#2", "DISPATCHED#2"}
	if !slices.Equal(got, want) {
		t.Errorf("trail %v, want %v", got, want)
	}
	b.verify(t, true)
}

// record records a non-late outcome of c through the real archive.
func record(t *testing.T, b *testBundle, c store.Claimed, relayer string, state attempts.State) {
	t.Helper()
	id, err := uuid.NewV7()
	if err != nil {
		t.Fatal(err)
	}
	rec, _, err := b.st.Record(b.ctx, b.pool, []store.Outcome{{
		Identity: c.Identity, AttemptID: id, ClaimAttemptID: c.AttemptID, AttemptNo: c.AttemptNo,
		RelayerID: relayer, ClaimedAt: c.ClaimedAt,
		State: state, ErrorCode: "TEST", CountAttempt: true,
	}}, store.HandoffParams{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rec) != 1 || rec[0].Late {
		t.Fatalf("record %s of %s: %+v, want one on-time outcome", state, c.OutboxID, rec)
	}
}

// TestReapPlanDoesNotReadArchive: with a million archived attempts the
// reaper's statement still reads only the in-flight table; the archive
// appears in the plan only as the target of the ZOMBIE_REQUEUE insert.
func TestReapPlanDoesNotReadArchive(t *testing.T) {
	t.Parallel()
	b := setup(t)

	// A million valid archive rows in a few seconds: sequential ids keep
	// the index inserts cheap; created_at spans 90 days, so both the
	// current month's partition and the default partition fill up.
	started := time.Now()
	tag, err := b.pool.Exec(b.ctx, `
		INSERT INTO outbox.attempts (attempt_id, outbox_id, instruction_id, participant_id, sequence_id, idempotency_key,
		                             rail_type, attempt_no, state, relayer_id, claimed_at, completed_at, created_at)
		SELECT ('00000000-0000-7000-8000-' || lpad(to_hex(g), 12, '0'))::uuid,
		       ('00000001-0000-7000-8000-' || lpad(to_hex(g), 12, '0'))::uuid,
		       'bulk-' || lpad(g::text, 7, '0'), 'bulk-p' || (g % 1000), g / 1000 + 1, 'bulk-k' || g,
		       'sandbox', 1, 'DISPATCHED', 'bulk', ts, ts, ts
		FROM generate_series(1, 1000000) g,
		     LATERAL (SELECT now() - (1000000 - g) * interval '7776 milliseconds' AS ts) x`)
	if err != nil {
		t.Fatal(err)
	}
	if tag.RowsAffected() != 1_000_000 {
		t.Fatalf("inserted %d archive rows", tag.RowsAffected())
	}
	inserted := time.Since(started)
	if _, err := b.pool.Exec(b.ctx, `ANALYZE outbox.attempts`); err != nil {
		t.Fatal(err)
	}
	t.Logf("1,000,000 archive rows inserted in %s, analyzed in %s", inserted.Round(time.Millisecond), (time.Since(started) - inserted).Round(time.Millisecond))
	var partitions int
	if err := b.pool.QueryRow(b.ctx, `
		SELECT count(DISTINCT tableoid) FROM outbox.attempts`).Scan(&partitions); err != nil {
		t.Fatal(err)
	}
	if partitions < 2 {
		t.Errorf("archive rows landed in %d partition(s), want at least 2", partitions)
	}

	for i := range 3 {
		b.enqueue(t, fmt.Sprintf("p%d", i), fmt.Sprintf("k%d", i))
	}
	dead := b.claim(t, "dead", 10, deadLease)
	b.waitExpired(t, dead)

	r := b.newReaper(t, Config{})
	nodes, plan := testdb.Explain(t, b.pool, b.st.ReapSQL(), r.cfg.BatchSize, r.cfg.ReaperID, r.cfg.ZombieLimit)
	var archiveInserts, inflightReads int
	for _, n := range nodes {
		switch {
		case !strings.HasPrefix(n.Relation, "attempts"):
			if n.Relation == "inflight" && n.NodeType != "ModifyTable" {
				inflightReads++
			}
		case n.NodeType == "ModifyTable" && n.Operation == "Insert":
			archiveInserts++
		default:
			t.Errorf("the reaper's plan reads the archive: %s on %s", n.NodeType, n.Relation)
		}
	}
	if archiveInserts != 1 || inflightReads == 0 {
		t.Errorf("plan has %d archive inserts and %d in-flight reads; want 1 and some:\n%s", archiveInserts, inflightReads, plan)
	}

	requeued, err := r.RunOnce(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(requeued), len(dead); got != want || len(dead) != 3 {
		t.Fatalf("requeued %d of %d (want 3)", got, want)
	}
	zombies := b.zombieCounts(t)
	for _, c := range dead {
		if zombies[c.OutboxID] != 1 {
			t.Errorf("%s has %d ZOMBIE_REQUEUE rows, want 1", c.OutboxID, zombies[c.OutboxID])
		}
	}
	if got := b.count(t, "pending"); got != 3 {
		t.Errorf("%d pending, want 3", got)
	}
}

// TestStartRequeuesInBackground: a lease that expires after the first
// (immediate) pass is requeued by a later pass of the background loop, and
// each pass re-creates a missing archive partition.
func TestStartRequeuesInBackground(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var partition string
	if err := b.pool.QueryRow(b.ctx, `
		SELECT 'attempts_' || to_char(date_trunc('month', now() AT TIME ZONE 'UTC') + interval '3 months', 'YYYY_MM')`).Scan(&partition); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(b.ctx, "DROP TABLE outbox."+partition); err != nil {
		t.Fatal(err)
	}

	r := b.newReaper(t, Config{Interval: time.Second})
	if err := r.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = r.Stop(context.Background())
		}
	})
	if err := r.Start(b.ctx); !errors.Is(err, ErrAlreadyStarted) {
		t.Errorf("a second Start: %v, want ErrAlreadyStarted", err)
	}
	waitFor(t, "the first pass", func() (bool, error) { return r.Stats().Passes >= 1, nil })
	waitFor(t, "the partition to be re-created", func() (bool, error) {
		var exists bool
		err := b.pool.QueryRow(b.ctx, "SELECT to_regclass($1) IS NOT NULL", "outbox."+partition).Scan(&exists)
		return exists, err
	})

	b.enqueue(t, "p1", "k1")
	dead := b.claim(t, "dead", 1, deadLease)
	if len(dead) != 1 {
		t.Fatalf("claimed %d, want 1", len(dead))
	}
	// Until the pass that requeued it has read its reply and counted it:
	// a Stop between the commit and then cancels the reading, and the pass
	// counts as failed although its requeue stands.
	waitFor(t, "the background loop to requeue the zombie", func() (bool, error) {
		_, ok := b.pendingRow(t, dead[0].OutboxID)
		return ok && r.Stats().Requeued >= 1, nil
	})
	if err := r.Stop(b.ctx); err != nil {
		t.Fatal(err)
	}
	stopped = true
	if st := r.Stats(); st.Passes < 2 || st.Requeued != 1 {
		t.Errorf("stats %+v; want at least 2 passes and 1 requeued", st)
	}
	if err := r.Stop(b.ctx); err != nil {
		t.Errorf("Stop of a stopped reaper: %v, want nil (a no-op)", err)
	}
	b.verify(t, true)

	// A stopped reaper can be started again.
	if err := r.Start(b.ctx); err != nil {
		t.Fatalf("restart: %v", err)
	}
	if err := r.Stop(b.ctx); err != nil {
		t.Fatal(err)
	}
}

func TestRunStopsWithContext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.enqueue(t, "p1", "k1")
	dead := b.claim(t, "dead", 1, deadLease)
	b.waitExpired(t, dead)

	r := b.newReaper(t, Config{Interval: time.Hour})
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	waitFor(t, "the first pass", func() (bool, error) { return r.Stats().Requeued == 1, nil })
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return after its context was cancelled")
	}
}

// TestOtherSchema: the reaper renders its statement for the configured
// schema and leaves the default schema alone.
func TestOtherSchema(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	if err := migrations.MigrateWith(t.Context(), pool, migrations.Options{Schema: "outbox_alt"}); err != nil {
		t.Fatal(err)
	}
	def := setupSchema(t, pool, "")
	alt := setupSchema(t, pool, "outbox_alt")
	def.enqueue(t, "p1", "k1")
	alt.enqueue(t, "p1", "k1")
	deadDef := def.claim(t, "dead", 1, deadLease)
	deadAlt := alt.claim(t, "dead", 1, deadLease)
	def.waitExpired(t, deadDef)
	alt.waitExpired(t, deadAlt)

	requeued, err := alt.newReaper(t, Config{}).RunOnce(alt.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(requeued) != 1 || requeued[0].OutboxID != deadAlt[0].OutboxID {
		t.Fatalf("requeued %+v, want the outbox_alt instruction %s", requeued, deadAlt[0].OutboxID)
	}
	if got := def.count(t, "inflight"); got != 1 {
		t.Errorf("default schema: %d in flight, want 1 (not reaped)", got)
	}
	alt.verify(t, true)
}

func TestConfig(t *testing.T) {
	t.Parallel()
	var c Config
	if err := c.setDefaults(); err != nil {
		t.Fatal(err)
	}
	if c.Interval != DefaultInterval || c.BatchSize != DefaultBatchSize || c.ReaperID == "" || c.Logger == nil {
		t.Errorf("defaults: %+v", c)
	}
	other := Config{}
	if err := other.setDefaults(); err != nil {
		t.Fatal(err)
	}
	if other.ReaperID == c.ReaperID {
		t.Errorf("two reapers in one process got the same id %q", c.ReaperID)
	}
	if at := (Config{Interval: MaxInterval}); at.setDefaults() != nil {
		t.Errorf("Interval %v refused", MaxInterval)
	}
	custom := Config{Interval: time.Second, BatchSize: 3, ReaperID: "r"}
	if err := custom.setDefaults(); err != nil || custom.Interval != time.Second || custom.BatchSize != 3 || custom.ReaperID != "r" {
		t.Errorf("explicit settings changed: %+v (%v)", custom, err)
	}
	for _, bad := range []Config{
		{Interval: 999 * time.Millisecond},
		{Interval: -time.Second},
		// Past MaxInterval: a unit slipped (hours for minutes) leaves a
		// dead relayer's claims stuck for days; past about 146 years the
		// retry backoff's doubling wrapped to a negative wait.
		{Interval: MaxInterval + 1},
		{Interval: 200 * 365 * 24 * time.Hour},
		{BatchSize: -1},
		{Schema: "Bad-Schema"},
	} {
		if err := bad.setDefaults(); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%+v: got %v, want ErrInvalidConfig", bad, err)
		}
	}
	if _, err := New(nil, Config{}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("nil pool: got %v, want ErrInvalidConfig", err)
	}
}
