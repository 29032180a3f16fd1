package store_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/internal/testdb"
)

// TestHotPathCostIsPerBatch proves the bound of the ordered claim, the
// outcome and the hand-off (successors, then its refill): with 100,000 participants with pending work
// (each a due head and a waiting successor), each statement touches a
// number of buffers within a constant factor of its batch, not of the
// participants. The plans are the generic ones a relayer's connection
// caches, made while the in-flight table was empty; the in-flight table
// then churns through 20,000 rows (a busy minute between two vacuums)
// before anything is measured, as it would in production. It runs twice:
// with pending analyzed, and with pending's statistics those of the
// vacuumed empty table (0 rows on its pages, as when a drained queue was
// vacuumed before a backlog arrived), from which PostgreSQL estimates one
// row whatever the table holds.
func TestHotPathCostIsPerBatch(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("loads 200,000 pending rows")
	}
	for _, stats := range []string{"analyzed", "vacuumed empty"} {
		t.Run(stats, func(t *testing.T) {
			t.Parallel()
			hotPathCost(t, stats == "vacuumed empty")
		})
	}
}

func hotPathCost(t *testing.T, emptyStats bool) {
	const (
		participants = 100_000
		batch        = 100
		// Buffers per row of the batch: a claimed row costs about 17 (the
		// due index, the lower-sequence probe, the delete, the archive
		// row and the in-flight row with their indexes); the old recursive
		// skip scan read at least one per participant (100,000).
		perRow = 40
		fixed  = 300
	)
	pool := testdb.New(t)
	ctx := t.Context()
	st, err := store.New("")
	if err != nil {
		t.Fatal(err)
	}
	analyze := `ANALYZE outbox.sequences, outbox.idempotency_keys, outbox.pending`
	if emptyStats {
		statisticsOfEmpty(t, pool, "pending")
		analyze = `ANALYZE outbox.sequences, outbox.idempotency_keys`
	}
	execAll(t, pool,
		fmt.Sprintf(`INSERT INTO outbox.sequences (participant_id, next_sequence_id, queued)
			SELECT 'p' || lpad(n::text, 6, '0'), 3, 2 FROM generate_series(1, %d) n`, participants),
		fmt.Sprintf(`WITH x AS (
			  SELECT gen_random_uuid() AS id, 'p' || lpad(n::text, 6, '0') AS p, s, 'k-' || n || '-' || s AS k
			  FROM generate_series(1, %d) n, generate_series(1, 2) s
			), keys AS (
			  INSERT INTO outbox.idempotency_keys (instruction_id, idempotency_key, outbox_id, participant_id, sequence_id, payload_hash)
			  SELECT k, k, id, p, s, '\x00' FROM x
			)
			INSERT INTO outbox.pending (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type, payload, next_attempt_at, created_at)
			SELECT id, k, p, s, k, 'sandbox', '{"amount_minor":100,"currency":"USD","destination":"acct-1"}',
			       CASE s WHEN 1 THEN now() - interval '1 minute' ELSE 'infinity' END, now() - interval '1 minute'
			FROM x`, participants),
		analyze,
	)
	if emptyStats {
		wantStatisticsOfEmpty(t, pool, "pending")
	}

	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	exec := func(q string) {
		t.Helper()
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	h := st.HotPath()
	exec(`SET plan_cache_mode = force_generic_plan`)
	exec(`PREPARE claim AS ` + h.Claim)
	exec(`PREPARE lock AS ` + h.LockParticipants)
	exec(`PREPARE record AS ` + h.Record)
	exec(`PREPARE record_dispatched AS ` + h.RecordDispatched)
	exec(`PREPARE handoff AS ` + h.Handoff)
	exec(`PREPARE handoff_late AS ` + h.HandoffLate)
	// The generic plans are made now, while the in-flight table is empty.
	empty := strings.TrimSuffix(strings.Repeat(`'{}', `, 13), ", ")
	exec(`EXECUTE claim('r', 0, '{sandbox}', '{60000}')`)
	exec(`EXECUTE lock('{}')`)
	exec(`EXECUTE record(` + empty + `)`)
	exec(`EXECUTE record_dispatched(` + empty + `)`)
	exec(`EXECUTE handoff('r', 0, '{sandbox}', '{60000}', '{}', '{}', false)`)
	exec(`EXECUTE handoff_late('r', 0, '{sandbox}', '{60000}', '{}', '{}', false)`)
	exec(`INSERT INTO outbox.inflight (outbox_id, attempt_id, attempt_no, relayer_id, ordered, claimed_at, lease_until,
			instruction_id, participant_id, sequence_id, idempotency_key, rail_type, payload, created_at)
		SELECT gen_random_uuid(), gen_random_uuid(), 1, 'churn', false, now(), now(), 'churn', 'churn', n, 'churn', 'sandbox',
		       '{"amount_minor":100,"currency":"USD","destination":"acct-1"}', now()
		FROM generate_series(1, 20000) n`)
	exec(`DELETE FROM outbox.inflight WHERE relayer_id = 'churn'`)

	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	measure := func(what, q string, rows int) {
		t.Helper()
		var out []byte
		if err := tx.QueryRow(ctx, `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) `+q).Scan(&out); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		buffers := planBuffers(t, out)
		t.Logf("%s of %d: %d buffers", what, rows, buffers)
		if limit := perRow*rows + fixed; buffers > limit {
			t.Errorf("%s of %d rows touched %d buffers, more than %d: its cost grows with something other than the batch\n%s",
				what, rows, buffers, limit, out)
		}
	}
	measure("claim", `EXECUTE claim('r', 100, '{sandbox}', '{60000}')`, batch)

	// recordHeld records what relayer r holds, DISPATCHED, with a hand-off
	// (the prepared statement handoff) of up to a batch, measuring each
	// statement, and reports how many successors of the freed participants
	// the hand-off claimed.
	recordHeld := func(record, handoff, what string) (successors int) {
		t.Helper()
		rows, err := tx.Query(ctx, `SELECT outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
			attempt_id, attempt_no, claimed_at FROM outbox.inflight WHERE relayer_id = 'r'`)
		if err != nil {
			t.Fatal(err)
		}
		outcomes, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Outcome, error) {
			o := store.Outcome{State: store.Dispatched, RelayerID: "r", CountAttempt: true, AttemptID: uuid.Must(uuid.NewV7())}
			err := r.Scan(&o.OutboxID, &o.InstructionID, &o.ParticipantID, &o.SequenceID, &o.IdempotencyKey, &o.RailType,
				&o.ClaimAttemptID, &o.AttemptNo, &o.ClaimedAt)
			return o, err
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(outcomes) != batch {
			t.Fatalf("relayer r holds %d, want %d", len(outcomes), batch)
		}
		args := store.RecordArgs(outcomes)
		literals := make([]string, len(args))
		for i, a := range args {
			literals[i] = arrayLiteral(t, a)
		}
		participants := make([]string, len(outcomes))
		for i, o := range outcomes {
			participants[i] = o.ParticipantID
		}
		parts := arrayLiteral(t, participants)
		measure("lock", `EXECUTE lock(`+parts+`)`, batch)
		measure(record, `EXECUTE `+record+`(`+strings.Join(literals, ", ")+`)`, batch)
		measure(what, `EXECUTE `+handoff+`('r', 100, '{sandbox}', '{60000}', `+parts+`, `+literals[2]+`, true)`, batch)
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM outbox.inflight WHERE relayer_id = 'r' AND participant_id = ANY($1::text[])`,
			participants).Scan(&successors); err != nil {
			t.Fatal(err)
		}
		return successors
	}
	// The hand-off that follows late outcomes looks at each freed
	// participant's in-flight rows as well.
	if n := recordHeld("record", "handoff_late", "hand-off after late outcomes"); n != batch {
		t.Errorf("the hand-off claimed %d successors, want %d", n, batch)
	}
	// The successors' participants have nothing left: the hand-off fills
	// its slots from the due heads of the others (its refill), which must
	// cost no more than a claim.
	if n := recordHeld("record_dispatched", "handoff", "hand-off refilling"); n != 0 {
		t.Errorf("the hand-off claimed %d successors of participants with nothing left", n)
	}
	var held int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM outbox.inflight WHERE relayer_id = 'r'`).Scan(&held); err != nil {
		t.Fatal(err)
	}
	if held != batch {
		t.Errorf("the refill claimed %d heads, want %d", held, batch)
	}
}

// planBuffers is the shared buffers (hit and read) an EXPLAIN (ANALYZE,
// BUFFERS, FORMAT JSON) reports for the statement. A node's counts include
// its children's, and a CTE Scan's include the CTE it pulled; a
// data-modifying CTE that nothing reads runs after the top node and is in
// no other node's counts. So each node counts what it read itself (its
// count less its children's, never below zero), and a CTE Scan nothing: its
// CTE's own nodes count the work.
func planBuffers(t *testing.T, explain []byte) int {
	t.Helper()
	type node struct {
		Type  string `json:"Node Type"`
		Hit   int    `json:"Shared Hit Blocks"`
		Read  int    `json:"Shared Read Blocks"`
		Plans []node `json:"Plans"`
	}
	var root []struct {
		Plan node `json:"Plan"`
	}
	if err := json.Unmarshal(explain, &root); err != nil || len(root) != 1 {
		t.Fatalf("decode plan (%v): %s", err, explain)
	}
	var own func(n node) int
	own = func(n node) int {
		total, children := 0, 0
		for _, c := range n.Plans {
			total += own(c)
			children += c.Hit + c.Read
		}
		if n.Type != "CTE Scan" {
			total += max(0, n.Hit+n.Read-children)
		}
		return total
	}
	return own(root[0].Plan)
}

// arrayLiteral renders one of the statements' array arguments as an SQL
// literal (the test's values hold no quotes or backslashes).
func arrayLiteral(t *testing.T, v any) string {
	t.Helper()
	var elems []string
	switch xs := v.(type) {
	case []pgtype.UUID:
		for _, x := range xs {
			elems = append(elems, uuid.UUID(x.Bytes).String())
		}
	case []string:
		for _, x := range xs {
			elems = append(elems, `"`+x+`"`)
		}
	case []int32:
		for _, x := range xs {
			elems = append(elems, fmt.Sprint(x))
		}
	case []int64:
		for _, x := range xs {
			elems = append(elems, fmt.Sprint(x))
		}
	case []bool:
		for _, x := range xs {
			elems = append(elems, fmt.Sprint(x))
		}
	case []time.Time:
		for _, x := range xs {
			elems = append(elems, `"`+x.Format(time.RFC3339Nano)+`"`)
		}
	default:
		t.Fatalf("no literal for %T", v)
	}
	return `'{` + strings.Join(elems, ",") + `}'`
}

// TestRelayerWritesHoldOneArchivePartition: a claim, and an outcome
// recorded on time with its hand-off, lock the archive partition their rows
// go into and no other, however many months are attached. Only late and
// resent outcomes read the archive, in archived_attempt (migration 012),
// which the outcome statement's plan does not contain: when the reads were
// written into the statement, its plan held every attached partition with
// its primary key, and each write locked and set up scans of all of them
// (29 here) to read none.
func TestRelayerWritesHoldOneArchivePartition(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	// Two years of past months attached, as a long-running archive has.
	if _, err := b.pool.Exec(b.ctx, `DO $$
	  DECLARE d timestamptz := date_trunc('month', now()) - interval '24 months';
	  BEGIN
	    FOR i IN 1..24 LOOP
	      EXECUTE format('CREATE TABLE outbox.attempts_past_%s PARTITION OF outbox.attempts FOR VALUES FROM (%L) TO (%L)',
	                     i, d, d + interval '1 month');
	      d := d + interval '1 month';
	    END LOOP;
	  END $$`); err != nil {
		t.Fatal(err)
	}
	var partitions int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pg_inherits WHERE inhparent = 'outbox.attempts'::regclass`).
		Scan(&partitions); err != nil {
		t.Fatal(err)
	}

	// held runs write in a transaction with the generic plans a relayer's
	// connection uses, and returns the archive partitions the transaction
	// then holds locks on.
	held := func(write func(tx pgx.Tx) error) (names []string) {
		t.Helper()
		if err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(b.ctx, `SET LOCAL plan_cache_mode = force_generic_plan`); err != nil {
				return err
			}
			if err := write(tx); err != nil {
				return err
			}
			return tx.QueryRow(b.ctx, `SELECT coalesce(array_agg(DISTINCT l.relation::regclass::text), '{}')
				FROM pg_locks l JOIN pg_inherits i ON i.inhrelid = l.relation
				WHERE l.pid = pg_backend_pid() AND l.locktype = 'relation' AND i.inhparent = 'outbox.attempts'::regclass`).
				Scan(&names)
		}); err != nil {
			t.Fatal(err)
		}
		return names
	}
	check := func(what string, names []string) {
		t.Helper()
		if len(names) != 1 {
			t.Errorf("%s locked %d of the archive's %d partitions, want 1 (its own): %v", what, len(names), partitions, names)
		}
	}

	leases := map[string]time.Duration{"sandbox": longLease}
	var c []store.Claimed
	b.enqueue(t, "p0", "k0")
	b.enqueue(t, "p0", "k0-next")
	check("a claim", held(func(tx pgx.Tx) (err error) {
		c, err = b.st.Claim(b.ctx, tx, store.ClaimParams{RelayerID: "r1", Limit: 1, Leases: leases})
		return err
	}))
	if len(c) != 1 {
		t.Fatalf("claimed %d instructions, want the head", len(c))
	}
	var handed []store.Claimed
	check("a DISPATCHED outcome on time with its hand-off", held(func(tx pgx.Tx) (err error) {
		_, handed, err = b.st.Record(b.ctx, tx, []store.Outcome{recordOutcome(t, c[0], "r1", store.Dispatched)},
			store.HandoffParams{RelayerID: "r1", Limit: 1, Leases: leases})
		return err
	}))
	if len(handed) != 1 {
		t.Fatalf("handed off %d instructions, want the successor", len(handed))
	}
	check("a RETRYABLE outcome on time", held(func(tx pgx.Tx) error {
		_, _, err := b.st.Record(b.ctx, tx, []store.Outcome{recordOutcome(t, handed[0], "r1", store.Retryable)}, store.HandoffParams{})
		return err
	}))
	b.verifyOK(t)
}

// TestClaimCostIgnoresHeldRails: due instructions of rails a claim may not
// take now (an operator paused the rail; or the relayer's breaker for it is
// open, or it does not serve it, so it is not in the claim's rail types)
// cost the claims and refills of the other rails nothing, however many
// wait: 150,000 of them at the front of the due order, and a claim of 100
// of another rail touches a number of buffers within a constant factor of
// its batch. In (next_attempt_at, created_at) order they were all in the
// way: 82 ms a claim past 300,000. Pending has no statistics, as when a
// backlog built up since the last ANALYZE.
func TestClaimCostIgnoresHeldRails(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("loads 150,000 pending rows")
	}
	const (
		held, batch   = 150_000, 100
		perRow, fixed = 40, 300
		payload       = `'{"amount_minor":100,"currency":"USD","destination":"acct-1"}'`
	)
	pool := testdb.New(t)
	ctx := t.Context()
	st, err := store.New("")
	if err != nil {
		t.Fatal(err)
	}
	execAll(t, pool,
		`UPDATE outbox.settings SET ordered = false`,
		fmt.Sprintf(`INSERT INTO outbox.pending (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type, payload, next_attempt_at, created_at)
			SELECT gen_random_uuid(), 'h' || n, 'h' || n, 1, 'h' || n, CASE n %% 2 WHEN 0 THEN 'paused' ELSE 'down' END, %s,
			       now() - interval '1 hour', now() - interval '1 hour' FROM generate_series(1, %d) n`, payload, held),
		fmt.Sprintf(`INSERT INTO outbox.pending (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type, payload, next_attempt_at, created_at)
			SELECT gen_random_uuid(), 's' || n, 's' || n, 1, 's' || n, 'sandbox', %s, now() - interval '1 minute', now() - interval '1 minute'
			FROM generate_series(1, %d) n`, payload, 3*batch),
		`SELECT outbox.pause_rail('paused', 'olga', 'test')`,
	)
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	h := st.HotPath()
	execAll(t, conn, `SET plan_cache_mode = force_generic_plan`, `PREPARE claim AS `+h.Claim, `PREPARE handoff AS `+h.Handoff)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	for _, c := range []struct{ what, q string }{
		// "down" is not among the claim's rail types (its breaker is
		// open); "paused" is, and the pause leaves it out.
		{"claim", `EXECUTE claim('r', 100, '{sandbox,paused}', '{60000,60000}')`},
		{"hand-off refill", `EXECUTE handoff('r', 100, '{sandbox,paused}', '{60000,60000}', '{}', '{}', true)`},
	} {
		var out []byte
		if err := tx.QueryRow(ctx, `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) `+c.q).Scan(&out); err != nil {
			t.Fatalf("%s: %v", c.what, err)
		}
		buffers := planBuffers(t, out)
		t.Logf("%s of %d past %d held: %d buffers", c.what, batch, held, buffers)
		if limit := perRow*batch + fixed; buffers > limit {
			t.Errorf("%s of %d rows touched %d buffers, more than %d: it reads the held rails' instructions\n%s",
				c.what, batch, buffers, limit, out)
		}
	}
	var claimed, heldTaken int
	if err := tx.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE rail_type <> 'sandbox') FROM outbox.inflight`).Scan(&claimed, &heldTaken); err != nil {
		t.Fatal(err)
	}
	if claimed != 2*batch || heldTaken != 0 {
		t.Fatalf("claimed %d (%d of held rails), want %d of the sandbox rail", claimed, heldTaken, 2*batch)
	}
}
