package store_test

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/migrations"
	"github.com/ledgerline/outbox/pending"
)

// TestSingleEnqueueKeepsGenericPlans: one instruction per business
// transaction is the common case. Its statements must be planned once per
// connection, not on every call: with array parameters PostgreSQL cannot
// know a generic plan's row counts and replanned every enqueue (0.3 ms of
// its 0.5 ms of database time), so the one-instruction form uses scalar
// parameters. (The pending insert is a call of enqueue_pending, migration
// 033, whose own statements PL/pgSQL keeps plans for, with scalar
// parameters too.)
func TestSingleEnqueueKeepsGenericPlans(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	conn := b.conn(t)
	const calls = 20
	for i := range calls {
		if _, err := b.producer.Enqueue(b.ctx, conn, pending.Instruction{
			InstructionID: "ins-" + strconv.Itoa(i), ParticipantID: "p-" + strconv.Itoa(i%3), IdempotencyKey: "k-" + strconv.Itoa(i),
			RailType: "sandbox", AmountMinor: 100, Currency: "USD", Destination: "acct-1",
		}); err != nil {
			t.Fatal(err)
		}
	}
	plans := append(preparedPlans(t, conn, "outbox.idempotency_keys"), preparedPlans(t, conn, "outbox.enqueue_pending")...)
	for _, p := range plans {
		if p.custom > 5 {
			t.Errorf("%q planned for %d of %d calls: want a cached generic plan after the first five", p.stmt, p.custom, calls)
		}
	}
	if len(plans) != 3 {
		t.Fatalf("%d enqueue statements prepared on the connection, want 3", len(plans))
	}
}

// preparedPlan is how often one statement prepared on a connection was
// planned generically and custom.
type preparedPlan struct {
	stmt            string
	generic, custom int64
}

// preparedPlans lists the statements prepared on conn that mention table
// (schema-qualified), with their plan counts, and logs them.
func preparedPlans(t *testing.T, conn *pgxpool.Conn, table string) []preparedPlan {
	t.Helper()
	rows, err := conn.Query(t.Context(), `SELECT left(regexp_replace(statement, '\s+', ' ', 'g'), 70), generic_plans, custom_plans
		FROM pg_prepared_statements
		WHERE strpos(statement, $1) > 0 AND statement NOT LIKE '%pg_prepared_statements%'`, table)
	if err != nil {
		t.Fatal(err)
	}
	plans, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (preparedPlan, error) {
		var p preparedPlan
		err := row.Scan(&p.stmt, &p.generic, &p.custom)
		return p, err
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range plans {
		t.Logf("%s: %d generic, %d custom", p.stmt, p.generic, p.custom)
	}
	return plans
}

// TestSingleAndBatchEnqueueAgree holds the one-instruction statements to
// the batch statements' semantics: the same instructions enqueued one per
// call (participant "one") and in batches of two (participant "two") leave
// the same rows, row for row: sequence ids without gaps, the head due and
// the rest waiting (all due with ordering off), duplicates using no
// sequence id and answered with the first receipt, tenant and correlation
// ids stored alike, and the same queued counts.
func TestSingleAndBatchEnqueueAgree(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	ins := func(participant string, n int, payloadAmount int64) pending.Instruction {
		in := pending.Instruction{
			InstructionID: fmt.Sprintf("%s-%d", participant, n), ParticipantID: participant, IdempotencyKey: fmt.Sprintf("%s-k-%d", participant, n),
			RailType: "sandbox", AmountMinor: payloadAmount, Currency: "USD", Destination: "acct-1",
		}
		if n%2 == 0 {
			in.TenantID, in.CorrelationID = "tenant-a", fmt.Sprintf("corr-%d", n)
		}
		return in
	}
	rows := func(who string) []string {
		t.Helper()
		r, err := b.pool.Query(b.ctx, `
			SELECT format('%s seq %s key %s rail %s tenant %s corr %s payload %s attempts %s due %s zombie %s %s key-seq %s',
			              substr(p.instruction_id, length($1) + 1), p.sequence_id, substr(p.idempotency_key, length($1) + 1), p.rail_type,
			              coalesce(p.tenant_id, '-'), coalesce(p.correlation_id, '-'), p.payload, p.attempt_count,
			              CASE WHEN p.next_attempt_at = 'infinity' THEN 'waits' WHEN p.next_attempt_at <= now() THEN 'now' ELSE 'later' END,
			              p.zombie_count, coalesce(p.zombie_attempt_id::text, '-'), k.sequence_id)
			FROM outbox.pending p JOIN outbox.idempotency_keys k USING (outbox_id)
			WHERE p.participant_id = $1 ORDER BY p.sequence_id`, who)
		if err != nil {
			t.Fatal(err)
		}
		out, err := pgx.CollectRows(r, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		var s string
		if err := b.pool.QueryRow(b.ctx, `SELECT format('next %s queued %s', next_sequence_id, queued) FROM outbox.sequences WHERE participant_id = $1`, who).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return append(out, s)
	}
	// Each step is what one participant gets; "one" enqueues it call by
	// call, "two" in one batch (a lone step too, with a twin of an earlier
	// instruction, so the batch path runs).
	steps := [][]int{{1, 2}, {2, 3}, {1}, {4}}
	receipts := map[string][]pending.Receipt{}
	for i, step := range steps {
		if i == 3 {
			// With ordering on: the head due, the others waiting.
			one, two := rows("one"), rows("two")
			if !slices.Equal(one, two) {
				t.Errorf("rows differ with ordering on:\none\n%s\ntwo\n%s", strings.Join(one, "\n"), strings.Join(two, "\n"))
			}
			if len(one) != 4 || !strings.Contains(one[0], "due now") || !strings.Contains(one[1], "due waits") || !strings.Contains(one[2], "due waits") {
				t.Errorf("want three rows, the head due and the others waiting, then the sequence: %q", one)
			}
			if err := migrations.SetOrdered(b.ctx, b.pool, "outbox", false); err != nil {
				t.Fatal(err)
			}
		}
		for _, n := range step {
			r, err := b.producer.Enqueue(b.ctx, b.pool, ins("one", n, 100))
			if err != nil {
				t.Fatalf("one %d: %v", n, err)
			}
			receipts["one"] = append(receipts["one"], r)
		}
		batch := make([]pending.Instruction, 0, 2)
		for _, n := range step {
			batch = append(batch, ins("two", n, 100))
		}
		if len(batch) == 1 {
			batch = append(batch, ins("two", 1, 100)) // a duplicate: changes nothing
		}
		rs, err := b.producer.EnqueueBatch(b.ctx, b.pool, batch)
		if err != nil {
			t.Fatalf("two %v: %v", step, err)
		}
		receipts["two"] = append(receipts["two"], rs[:len(step)]...)
	}
	// A mismatch writes nothing on either path.
	if _, err := b.producer.Enqueue(b.ctx, b.pool, ins("one", 1, 999)); !errors.As(err, new(*pending.MismatchError)) {
		t.Fatalf("one: mismatch gave %v, want a MismatchError", err)
	}
	if _, err := b.producer.EnqueueBatch(b.ctx, b.pool, []pending.Instruction{ins("two", 5, 100), ins("two", 1, 999)}); !errors.As(err, new(*pending.MismatchError)) {
		t.Fatalf("two: mismatch gave %v, want a MismatchError", err)
	}
	// So does an instruction id under a second key (migration 030).
	rekeyed := func(participant string) pending.Instruction {
		in := ins(participant, 1, 100)
		in.IdempotencyKey += "-again"
		return in
	}
	if _, err := b.producer.Enqueue(b.ctx, b.pool, rekeyed("one")); !errors.As(err, new(*pending.InstructionReusedError)) {
		t.Fatalf("one: a second key gave %v, want an InstructionReusedError", err)
	}
	if _, err := b.producer.EnqueueBatch(b.ctx, b.pool, []pending.Instruction{ins("two", 5, 100), rekeyed("two")}); !errors.As(err, new(*pending.InstructionReusedError)) {
		t.Fatalf("two: a second key gave %v, want an InstructionReusedError", err)
	}

	seqs := func(who string) []string {
		var out []string
		for _, r := range receipts[who] {
			out = append(out, fmt.Sprintf("seq %d duplicate %v", r.SequenceID, r.Duplicate))
		}
		return out
	}
	if one, two := seqs("one"), seqs("two"); !slices.Equal(one, two) {
		t.Errorf("receipts differ:\none %v\ntwo %v", one, two)
	}
	if want := []string{"seq 1 duplicate false", "seq 2 duplicate false", "seq 2 duplicate true", "seq 3 duplicate false", "seq 1 duplicate true", "seq 4 duplicate false"}; !slices.Equal(seqs("one"), want) {
		t.Errorf("receipts %v, want %v", seqs("one"), want)
	}
	one, two := rows("one"), rows("two")
	for _, l := range one {
		t.Log(l)
	}
	if !slices.Equal(one, two) {
		t.Errorf("rows differ:\none\n%s\ntwo\n%s", strings.Join(one, "\n"), strings.Join(two, "\n"))
	}
	if len(one) != 5 || !strings.Contains(one[3], "seq 4") || !strings.Contains(one[3], "due now") || !strings.HasSuffix(one[4], "next 5 queued 4") {
		t.Errorf("want four rows, all due with ordering off, then the sequence: %q", one)
	}
}

// TestEnqueueReadsKeysPerInstruction: an enqueue, batch or single, reaches the
// idempotency keys (and the retired ones) by key, one lookup per
// instruction, whatever the statistics say. The keys table starts
// pre-sized and empty (migration 006), and the first vacuum records it as
// empty (no rows, 200 pages): until the next ANALYZE, PostgreSQL then
// estimates one row however many it holds. Plans made on that joined the
// batch to a whole scan of the keys per row, on custom and generic plans
// alike (enqueue.go has the numbers). The rounds are run twice: with a
// key of another payload (a mismatch), then with an instruction id of
// another key (read by instruction id, migration 030).
func TestEnqueueReadsKeysPerInstruction(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	statisticsOfEmpty(t, b.pool, "idempotency_keys", "retired_keys")
	const held = 20000
	if _, err := b.pool.Exec(b.ctx, `
INSERT INTO outbox.idempotency_keys (tenant_id, instruction_id, idempotency_key, outbox_id, participant_id, sequence_id, payload_hash)
SELECT '', 'old-' || g, 'old-' || g, gen_random_uuid(), 'old-' || (g % 100), g, '\x00' FROM generate_series(1, $1) AS g;
`, held); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(b.ctx, `
INSERT INTO outbox.retired_keys (digest, outbox_id, participant_id, sequence_id, created_at)
SELECT outbox.key_digest('', 'gone-' || g, 'gone-' || g), gen_random_uuid(), 'gone', g, now() FROM generate_series(1, $1) AS g`, held); err != nil {
		t.Fatal(err)
	}
	wantStatisticsOfEmpty(t, b.pool, "idempotency_keys")

	conn := b.conn(t)
	modes := []string{"force_custom_plan", "force_generic_plan", "auto", "auto", "auto", "auto", "auto", "auto"}
	for round, plans := range append(modes, modes...) {
		reuse := round >= len(modes)
		// Batches of 100, then one instruction (its own statements).
		batch := 100
		if round%2 == 1 {
			batch = 1
		}
		ins := make([]pending.Instruction, batch)
		for i := range ins {
			n := strconv.Itoa(round*batch + i)
			ins[i] = pending.Instruction{InstructionID: "ins-" + n, ParticipantID: "p-" + strconv.Itoa(i%10), IdempotencyKey: "k-" + n,
				RailType: "sandbox", AmountMinor: 100, Currency: "USD", Destination: "acct-1"}
		}
		ins[batch-1].InstructionID, ins[batch-1].IdempotencyKey = "old-1", "old-1" // a duplicate
		if reuse {
			ins[batch-1].IdempotencyKey = "new-" + strconv.Itoa(round) // old-1 under a second key
		}
		tx, err := conn.Begin(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(b.ctx, `SELECT set_config('plan_cache_mode', $1, true)`, plans); err != nil {
			t.Fatal(err)
		}
		before := readsOf(t, tx, "outbox.idempotency_keys", "outbox.retired_keys")
		_, err = b.producer.EnqueueBatch(b.ctx, tx, ins)
		after := readsOf(t, tx, "outbox.idempotency_keys", "outbox.retired_keys")
		if rerr := tx.Rollback(b.ctx); err == nil {
			err = rerr
		}
		if !reuse && !errors.As(err, new(*pending.MismatchError)) {
			t.Fatalf("round %d: %v, want the duplicate's mismatch (its payload differs)", round, err)
		}
		if reuse && !errors.As(err, new(*pending.InstructionReusedError)) {
			t.Fatalf("round %d: %v, want old-1 refused under a second key", round, err)
		}
		for i, table := range []string{"idempotency_keys", "retired_keys"} {
			if n := after[i].seqTuples - before[i].seqTuples; n > 0 {
				t.Errorf("round %d (%s plans): sequential scans read %d rows of %s for a batch of %d", round, plans, n, table, batch)
			}
			if n := after[i].indexEntries - before[i].indexEntries; n > int64(4*batch) {
				t.Errorf("round %d (%s plans): %s's indexes returned %d entries for a batch of %d", round, plans, table, n, batch)
			}
		}
	}
}
