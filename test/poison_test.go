package test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/ledgerline/outbox/attempts"
	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/pending"
	"github.com/ledgerline/outbox/rails"
)

// TestFaultPoisonInstruction: one instruction kills every relayer process
// that dispatches it (an in-process sandbox rail with a crash key: the
// process exits in the middle of the call). Dead relayers are replaced as a
// supervisor would. The reapers requeue it up to the zombie limit (3),
// then dead-letter it, outcome unknown, and the crash loop ends; its
// participant's later instructions and everyone else's are dispatched
// (those in flight beside it become suspects, dispatched alone, so it is
// the only dead letter); invariants hold.
func TestFaultPoisonInstruction(t *testing.T) {
	heavy(t)
	dbURL := testdb.URL(t)
	pool := openPool(t, dbURL)

	cfg := rails.Config{
		Transports: map[string]rails.TransportConfig{
			"crashing": {Kind: "sandbox", Sandbox: &rails.SandboxConfig{CrashKeys: []string{"poison"}}},
		},
		Rails: []rails.RailConfig{{Type: "sandbox", Profile: "generic", Transport: "crashing",
			Currencies: []string{"USD"}, Timeout: railTimeout.String()}},
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	railsConfig := filepath.Join(t.TempDir(), "rails.json")
	if err := os.WriteFile(railsConfig, b, 0o644); err != nil {
		t.Fatal(err)
	}

	// The poison instruction first in its participant's line, then two
	// more of the same participant and some of others.
	ins := func(participant, key string) pending.Instruction {
		return pending.Instruction{InstructionID: "ins-" + key, ParticipantID: participant, IdempotencyKey: key,
			RailType: "sandbox", AmountMinor: 100, Currency: "USD", Destination: "acct-1"}
	}
	batch := []pending.Instruction{ins("victim", "poison"), ins("victim", "after-1"), ins("victim", "after-2")}
	for i := range 20 {
		batch = append(batch, ins(fmt.Sprintf("other-%d", i%5), fmt.Sprintf("other-%d", i)))
	}
	if _, err := pending.EnqueueBatch(t.Context(), pool, batch); err != nil {
		t.Fatal(err)
	}

	f := newFleet(t, railsConfig, func(int) string { return dbURL })
	for slot := range 2 {
		f.start(slot)
	}
	deaths := 0
	superviseUntil := func(what string, done func() (bool, string)) {
		poll(t, 2*time.Minute, what, func() (bool, string) {
			for slot, p := range f.current {
				if p.exited() {
					deaths++
					p.intended.Store(true) // expected: the crash key
					f.start(slot)
				}
			}
			ok, detail := done()
			return ok, fmt.Sprintf("%s, relayer deaths %d", detail, deaths)
		})
	}
	superviseUntil("the poison instruction dead-lettered and the queue empty", func() (bool, string) {
		c := mustInts(t, pool, `SELECT
			(SELECT count(*) FROM outbox.dead_letters d JOIN outbox.idempotency_keys k USING (outbox_id)
			 WHERE k.idempotency_key = 'poison' AND d.error_code = 'ZOMBIE_LIMIT' AND d.outcome_unknown),
			(SELECT count(*) FROM outbox.pending) + (SELECT count(*) FROM outbox.inflight)`)
		return c[0] == 1 && c[1] == 0, fmt.Sprintf("poison dead-lettered %d, queued %d", c[0], c[1])
	})
	// Instructions in flight beside the poison died with it (twice at
	// most: then they were suspects, which relayers dispatch alone), so
	// they were dispatched and the poison died alone from then on. It is
	// the only dead letter.
	archive, err := attempts.New("")
	if err != nil {
		t.Fatal(err)
	}
	dls, err := archive.DeadLetters(t.Context(), pool, true, 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(dls) != 1 || dls[0].InstructionID != "ins-poison" || dls[0].ErrorCode != "ZOMBIE_LIMIT" || !dls[0].OutcomeUnknown {
		t.Errorf("dead letters %+v, want only the poison instruction, ZOMBIE_LIMIT, outcome unknown", dls)
	}
	superviseUntil("everything but the poison dispatched", func() (bool, string) {
		c := mustInts(t, pool, `SELECT
			(SELECT count(DISTINCT outbox_id) FROM outbox.attempts WHERE state = 'DISPATCHED'),
			(SELECT count(*) FROM outbox.pending) + (SELECT count(*) FROM outbox.inflight)`)
		return c[0] == int64(len(batch)-1) && c[1] == 0, fmt.Sprintf("dispatched %d of %d, queued %d", c[0], len(batch)-1, c[1])
	})
	f.stopAll()

	// Four claims died: three requeues, then the dead letter.
	trail := mustInts(t, pool, `SELECT
		count(*) FILTER (WHERE state = 'DISPATCHING'), count(*) FILTER (WHERE state = 'ZOMBIE_REQUEUE'),
		count(*) FILTER (WHERE state = 'FAILED' AND error_code = 'ZOMBIE_LIMIT')
		FROM outbox.attempts a JOIN outbox.idempotency_keys k USING (outbox_id) WHERE k.idempotency_key = 'poison'`)
	if trail[0] != 4 || trail[1] != 3 || trail[2] != 1 {
		t.Errorf("poison trail: %d claims, %d zombie requeues, %d ZOMBIE_LIMIT failures; want 4, 3, 1", trail[0], trail[1], trail[2])
	}
	if deaths < 4 {
		t.Errorf("%d relayer deaths, want at least the 4 claims of the poison instruction", deaths)
	}
	// Suspects (instructions requeued twice already) were dispatched
	// alone: while a suspect's claim was open, its relayer had no other
	// claim open. That is what keeps the poison from killing others with
	// it; the dead-letter count above shows it only when the timing of a
	// run happens to put a second claim beside the poison.
	rows, err := pool.Query(t.Context(), `
		WITH claims AS (
		  SELECT c.attempt_id, c.outbox_id, c.relayer_id,
		         (SELECT count(*) FROM outbox.attempts z
		          WHERE z.outbox_id = c.outbox_id AND z.state = 'ZOMBIE_REQUEUE' AND z.created_at < c.created_at) >= 2 AS suspect,
		         tstzrange(c.created_at, coalesce((SELECT min(x.created_at) FROM outbox.attempts x
		                                           WHERE x.claim_attempt_id = c.attempt_id AND NOT x.late), 'infinity')) AS open
		  FROM outbox.attempts c WHERE c.state = 'DISPATCHING')
		SELECT format('suspect %s (claim %s of %s) was in flight beside claim %s of %s', d.outbox_id, d.attempt_id,
		              d.relayer_id, c.attempt_id, c.outbox_id)
		FROM claims d JOIN claims c ON c.relayer_id = d.relayer_id AND c.attempt_id <> d.attempt_id AND c.open && d.open
		WHERE d.suspect`)
	if err != nil {
		t.Fatal(err)
	}
	beside, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range beside {
		t.Errorf("not dispatched alone: %s", b)
	}
	suspectClaims := mustInts(t, pool, `SELECT count(*) FROM outbox.attempts c WHERE c.state = 'DISPATCHING' AND (
		SELECT count(*) FROM outbox.attempts z WHERE z.outbox_id = c.outbox_id AND z.state = 'ZOMBIE_REQUEUE' AND z.created_at < c.created_at) >= 2`)[0]
	if suspectClaims < 2 {
		t.Errorf("%d claims of suspects, want at least the poison's last two", suspectClaims)
	}
	// Its participant's later instructions went out, after it ended (the
	// order itself is invariant 4, which verifyNow checks).
	if n := mustInts(t, pool, `SELECT count(DISTINCT sequence_id) FROM outbox.attempts
		WHERE participant_id = 'victim' AND state = 'DISPATCHED' AND sequence_id > 1`)[0]; n != 2 {
		t.Errorf("victim's later instructions dispatched: %d, want 2", n)
	}
	verifyNow(t, pool, "after the poison instruction")
	victims := mustInts(t, pool, `SELECT count(DISTINCT outbox_id) FROM outbox.attempts WHERE state = 'ZOMBIE_REQUEUE'`)[0] - 1
	t.Logf("poison instruction: %d relayer deaths, dead-lettered after %d requeues; %d instructions died beside it, then went out",
		deaths, trail[1], victims)
}
