package store_test

import (
	"bytes"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"

	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/internal/testdb"
)

// tamperHistory is a small history written by the real transitions, one
// instruction through each of them.
type tamperHistory struct {
	dispatched, retried, replayed, reaped uuid.UUID
}

// history builds the tamperHistory: dispatched at once; retried, then
// dispatched; failed, replayed by an operator, then dispatched; its lease
// reaped, then dispatched. Every instruction ends dispatched, each on its
// own participant.
func (b *recordBundle) history(t *testing.T) tamperHistory {
	t.Helper()
	var h tamperHistory
	h.dispatched = b.enqueue(t, "p1", "k1")
	b.record(t, recordOutcome(t, b.claimOne(t, "r1", longLease), "r1", store.Dispatched))

	h.retried = b.enqueue(t, "p2", "k2")
	retry := recordOutcome(t, b.claimOne(t, "r1", longLease), "r1", store.Retryable)
	b.record(t, retry)
	b.record(t, recordOutcome(t, b.claimOne(t, "r1", longLease), "r1", store.Dispatched))

	h.replayed = b.enqueue(t, "p3", "k3")
	b.record(t, recordOutcome(t, b.claimOne(t, "r1", longLease), "r1", store.Failed))
	if ok, err := b.st.Replay(b.ctx, b.pool, h.replayed, "alice", "test"); err != nil || !ok {
		t.Fatalf("replay: %v %v", ok, err)
	}
	b.record(t, recordOutcome(t, b.claimOne(t, "r1", longLease), "r1", store.Dispatched))

	h.reaped = b.enqueue(t, "p4", "k4")
	b.reap(t, b.claimOne(t, "dead-relayer", shortLease))
	b.record(t, recordOutcome(t, b.claimOne(t, "r2", longLease), "r2", store.Dispatched))
	return h
}

// checkpoint takes a checkpoint that covers every row archived so far.
func (b *recordBundle) checkpoint(t *testing.T) *store.Checkpoint {
	t.Helper()
	time.Sleep(2 * time.Millisecond)
	cp, err := b.st.TakeCheckpoint(b.ctx, b.pool, time.Millisecond, 0)
	if err != nil {
		t.Fatal(err)
	}
	if cp == nil {
		t.Fatal("no checkpoint taken")
	}
	return cp
}

// verifyTampered runs verify (against an export, when one is given) and
// returns its invariant-7 violations. It runs it on one connection and on
// four: the reports must be the same.
func (b *recordBundle) verifyTampered(t *testing.T, export []store.Checkpoint) []store.Violation {
	t.Helper()
	r, err := b.st.Verify(b.ctx, b.pool, store.VerifyOptions{Ordered: true, Checkpoints: export})
	if err != nil {
		t.Fatal(err)
	}
	parallel, err := b.st.Verify(b.ctx, b.pool, store.VerifyOptions{Ordered: true, Checkpoints: export, Workers: 4})
	if err != nil {
		t.Fatal(err)
	}
	// Checkpoints read one at a time: what carries from one batch to the
	// next (the last checkpoint, the export's matches) must be enough.
	batched, err := store.WithCheckpointBatch(b.st, 1).Verify(b.ctx, b.pool, store.VerifyOptions{Ordered: true, Checkpoints: export})
	if err != nil {
		t.Fatal(err)
	}
	r.Duration, parallel.Duration, batched.Duration = 0, 0, 0
	if !reflect.DeepEqual(r, parallel) {
		t.Fatalf("verify on four connections differs from verify on one:\n%+v\n%+v", parallel, r)
	}
	if !reflect.DeepEqual(r, batched) {
		t.Fatalf("verify reading one checkpoint at a time differs:\n%+v\n%+v", batched, r)
	}
	var out []store.Violation
	for _, v := range r.Violations {
		if v.Invariant == 7 {
			out = append(out, v)
		}
	}
	return out
}

// wantBreak fails unless a violation of check mentions every one of words.
func wantBreak(t *testing.T, got []store.Violation, check string, words ...string) {
	t.Helper()
	for _, v := range got {
		if v.Check != check {
			continue
		}
		all := true
		for _, w := range words {
			all = all && strings.Contains(v.Detail, w)
		}
		if all {
			return
		}
	}
	t.Errorf("no %q violation mentioning %q; got %v", check, words, got)
}

// TestChainCoversEveryTransition: the real writers (claim, every outcome,
// reaper, replay) leave chains and checkpoints that verify, and the report
// says how much it checked.
func TestChainCoversEveryTransition(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	b.history(t)
	first := b.checkpoint(t)
	if first.Rows != 15 || first.PrevHash != nil {
		t.Errorf("first checkpoint %+v, want 15 rows and no previous", first)
	}
	b.enqueue(t, "p5", "k5")
	b.record(t, recordOutcome(t, b.claimOne(t, "r1", longLease), "r1", store.Dispatched))
	second := b.checkpoint(t)
	if !second.PeriodStart.Equal(first.PeriodEnd) || !bytes.Equal(second.PrevHash, first.Hash) || second.Rows != 2 {
		t.Errorf("second checkpoint %+v does not follow %+v with 2 rows", second, first)
	}
	r := b.verifyOK(t)
	if r.Chained != 17 || r.Checkpoints != 2 {
		t.Errorf("verify checked %d chained rows and %d checkpoints, want 17 and 2", r.Chained, r.Checkpoints)
	}
	// The export round-trips and matches.
	cps, err := b.st.Checkpoints(b.ctx, b.pool)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := store.WriteCheckpoints(&buf, cps); err != nil {
		t.Fatal(err)
	}
	back, err := store.ReadCheckpoints(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if got := b.verifyTampered(t, back); len(got) != 0 {
		t.Errorf("untouched archive against its own export: %v", got)
	}
}

// TestTamperingIsReported: each way an insider can change the archive, as
// the owning role or as a superuser, is reported by verify with the
// instruction it touched (or the period, when the instruction is gone).
func TestTamperingIsReported(t *testing.T) {
	t.Parallel()
	// Tampers run as the tables' owner (the tests' role); those that set
	// session_replication_role run as a superuser (execAll switches).
	tampers := []struct {
		name string
		// withCheckpoint: a checkpoint covers the history before tampering.
		withCheckpoint bool
		tamper         func(t *testing.T, b *recordBundle, h tamperHistory)
		want           func(t *testing.T, got []store.Violation, h tamperHistory)
	}{{
		name: "owner disables the trigger and forges amount and reference",
		tamper: func(t *testing.T, b *recordBundle, h tamperHistory) {
			b.execAll(t,
				`ALTER TABLE outbox.attempts DISABLE TRIGGER attempts_append_only`,
				fmt.Sprintf(`UPDATE outbox.attempts SET payload = jsonb_set(payload, '{amount_minor}', '100000000')
				             WHERE outbox_id = '%s' AND state = 'DISPATCHING'`, h.dispatched),
				fmt.Sprintf(`UPDATE outbox.attempts SET rail_reference = 'forged'
				             WHERE outbox_id = '%s' AND state = 'DISPATCHED'`, h.retried),
				`ALTER TABLE outbox.attempts ENABLE TRIGGER attempts_append_only`)
		},
		want: func(t *testing.T, got []store.Violation, h tamperHistory) {
			wantBreak(t, got, "row hashes", h.dispatched.String(), "does not match its hash")
			wantBreak(t, got, "row hashes", h.retried.String(), "does not match its hash")
		},
	}, {
		name: "superuser rewrites with session_replication_role = replica",
		tamper: func(t *testing.T, b *recordBundle, h tamperHistory) {
			b.execAll(t, `SET session_replication_role = replica`,
				fmt.Sprintf(`UPDATE outbox.attempts SET error_message = 'all fine', created_at = created_at
				             WHERE outbox_id = '%s' AND state = 'REPLAYED'`, h.replayed))
		},
		want: func(t *testing.T, got []store.Violation, h tamperHistory) {
			wantBreak(t, got, "row hashes", h.replayed.String())
		},
	}, {
		name: "a row taken out of the middle of a chain",
		tamper: func(t *testing.T, b *recordBundle, h tamperHistory) {
			b.execAll(t, `SET session_replication_role = replica`,
				fmt.Sprintf(`DELETE FROM outbox.attempts WHERE outbox_id = '%s' AND state = 'RETRYABLE'`, h.retried))
		},
		want: func(t *testing.T, got []store.Violation, h tamperHistory) {
			wantBreak(t, got, "chain links", h.retried.String(), "follows a row that is not in the archive")
		},
	}, {
		name: "the head row of a pending instruction deleted",
		tamper: func(t *testing.T, b *recordBundle, h tamperHistory) {
			id := b.enqueue(t, "p9", "k9")
			b.record(t, recordOutcome(t, b.claimOne(t, "r1", longLease), "r1", store.Retryable))
			b.execAll(t, `SET session_replication_role = replica`,
				fmt.Sprintf(`DELETE FROM outbox.attempts WHERE outbox_id = '%s' AND state = 'RETRYABLE'`, id))
		},
		want: func(t *testing.T, got []store.Violation, h tamperHistory) {
			wantBreak(t, got, "chain heads", "pending row", "its chain head is not in the archive")
		},
	}, {
		// The hot row forgets its chain head: the archive is intact, but a
		// head deleted now would go unseen.
		name: "the chain head of a pending instruction cleared",
		tamper: func(t *testing.T, b *recordBundle, h tamperHistory) {
			id := b.enqueue(t, "p9", "k9")
			b.record(t, recordOutcome(t, b.claimOne(t, "r1", longLease), "r1", store.Retryable))
			b.execAll(t, fmt.Sprintf(`UPDATE outbox.pending SET chain_head = NULL WHERE outbox_id = '%s'`, id))
		},
		want: func(t *testing.T, got []store.Violation, h tamperHistory) {
			wantBreak(t, got, "chain heads", "pending row", "has no chain head, but its instruction has chained archive rows")
		},
	}, {
		name:           "a whole instruction deleted: attempts, key, sequence",
		withCheckpoint: true,
		tamper: func(t *testing.T, b *recordBundle, h tamperHistory) {
			b.execAll(t, `SET session_replication_role = replica`,
				fmt.Sprintf(`DELETE FROM outbox.attempts WHERE outbox_id = '%s'`, h.dispatched),
				fmt.Sprintf(`DELETE FROM outbox.idempotency_keys WHERE outbox_id = '%s'`, h.dispatched),
				`UPDATE outbox.sequences SET next_sequence_id = next_sequence_id - 1 WHERE participant_id = 'p1'`)
		},
		want: func(t *testing.T, got []store.Violation, h tamperHistory) {
			wantBreak(t, got, "checkpoint digests", "13 rows in the archive, 15 when it was taken")
		},
	}, {
		// Same number of rows, each matching its hash and linked: only the
		// period's digest differs from the checkpoint's.
		name:           "a row changed and rehashed under a checkpoint",
		withCheckpoint: true,
		tamper: func(t *testing.T, b *recordBundle, h tamperHistory) {
			b.execAll(t, `SET session_replication_role = replica`, fmt.Sprintf(forgeAndRehash, h.dispatched, h.dispatched))
		},
		want: func(t *testing.T, got []store.Violation, h tamperHistory) {
			wantBreak(t, got, "checkpoint digests", "15 rows in the archive, 15 when it was taken")
			for _, v := range got {
				if v.Check == "row hashes" || v.Check == "chain links" {
					t.Errorf("the rehashed row was reported as %s (%s): the case would not show the digest", v.Check, v.Detail)
				}
			}
		},
	}, {
		// The last row of a chain cut loose from its predecessor and
		// rehashed: it matches its hash and follows no missing row, but
		// its instruction's chain now starts twice.
		name: "a row made to start a chain of its own",
		tamper: func(t *testing.T, b *recordBundle, h tamperHistory) {
			b.execAll(t, `SET session_replication_role = replica`,
				fmt.Sprintf(`UPDATE outbox.attempts SET prev_hash = NULL WHERE outbox_id = '%s' AND state = 'DISPATCHED'`, h.retried),
				fmt.Sprintf(rehashDispatched, h.retried))
		},
		want: func(t *testing.T, got []store.Violation, h tamperHistory) {
			wantBreak(t, got, "chain links", h.retried.String(), "starts a second chain")
		},
	}, {
		// The middle one of three checkpoints deleted: the periods left
		// still digest, but one is missing between them.
		name:           "a checkpoint taken out of the middle",
		withCheckpoint: true,
		tamper: func(t *testing.T, b *recordBundle, h tamperHistory) {
			cps := b.threeCheckpoints(t)
			b.execAll(t, `SET session_replication_role = replica`,
				fmt.Sprintf(`DELETE FROM outbox.checkpoints WHERE period_start = '%s'`, cps[1].PeriodStart.Format(time.RFC3339Nano)))
		},
		want: func(t *testing.T, got []store.Violation, h tamperHistory) {
			wantBreak(t, got, "checkpoint chain", "a checkpoint is missing")
		},
	}, {
		// The first checkpoint deleted: the rest are contiguous and still
		// digest; only the next one's link to it is left to tell.
		name:           "the first checkpoint deleted",
		withCheckpoint: true,
		tamper: func(t *testing.T, b *recordBundle, h tamperHistory) {
			cps := b.threeCheckpoints(t)
			b.execAll(t, `SET session_replication_role = replica`,
				fmt.Sprintf(`DELETE FROM outbox.checkpoints WHERE period_start = '%s'`, cps[0].PeriodStart.Format(time.RFC3339Nano)))
		},
		want: func(t *testing.T, got []store.Violation, h tamperHistory) {
			wantBreak(t, got, "checkpoint chain", "does not follow the checkpoint before it")
		},
	}, {
		name:           "the month's partition dropped",
		withCheckpoint: true,
		tamper: func(t *testing.T, b *recordBundle, h tamperHistory) {
			b.execAll(t, `DO $$ BEGIN
				EXECUTE format('DROP TABLE outbox.%I', 'attempts_' || to_char(now() AT TIME ZONE 'UTC', 'YYYY_MM'));
			END $$`)
		},
		want: func(t *testing.T, got []store.Violation, h tamperHistory) {
			wantBreak(t, got, "checkpoint digests", "0 rows in the archive, 15 when it was taken")
		},
	}, {
		name:           "a checkpoint changed",
		withCheckpoint: true,
		tamper: func(t *testing.T, b *recordBundle, h tamperHistory) {
			b.execAll(t, `SET session_replication_role = replica`,
				`UPDATE outbox.checkpoints SET row_count = row_count - 2`)
		},
		want: func(t *testing.T, got []store.Violation, h tamperHistory) {
			wantBreak(t, got, "checkpoint chain", "does not match its hash")
		},
	}}
	for _, tc := range tampers {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setupRecord(t)
			h := b.history(t)
			if tc.withCheckpoint {
				b.checkpoint(t)
			}
			if got := b.verifyTampered(t, nil); len(got) != 0 {
				t.Fatalf("before tampering: %v", got)
			}
			tc.tamper(t, b, h)
			tc.want(t, b.verifyTampered(t, nil), h)
		})
	}
}

// TestRewriteOfEverythingNeedsTheExport: the owner changes a row, then
// recomputes its hash and every checkpoint with the schema's own
// functions. The database alone can no longer tell; the auditor's export,
// kept outside it, can.
func TestRewriteOfEverythingNeedsTheExport(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	h := b.history(t)
	b.checkpoint(t)
	export, err := b.st.Checkpoints(b.ctx, b.pool)
	if err != nil {
		t.Fatal(err)
	}

	// The forgery: a terminal row (nothing follows it in its chain)
	// changed and rehashed, then the checkpoints taken again from scratch.
	b.execAll(t, `SET session_replication_role = replica`,
		fmt.Sprintf(forgeAndRehash, h.dispatched, h.dispatched),
		`DELETE FROM outbox.checkpoints`,
		`SELECT outbox.take_checkpoint(clock_timestamp())`)

	if got := b.verifyTampered(t, nil); len(got) != 0 {
		t.Errorf("a complete rewrite is beyond what the database alone can show, yet verify reported %v", got)
	}
	got := b.verifyTampered(t, export)
	if len(got) == 0 {
		t.Fatal("verify against the export reported nothing")
	}
	wantBreak(t, got, "exported checkpoints", export[0].PeriodStart.UTC().Format("2006-01-02"))
}

// forgeAndRehash changes the rail reference of an instruction's DISPATCHED
// row (the last of its chain: nothing follows it) and recomputes its hash
// with the schema's own function, so the row matches its hash and its
// chain still links; only a checkpoint that covers it can tell. Two %s:
// the outbox id, twice.
const forgeAndRehash = `UPDATE outbox.attempts SET rail_reference = 'forged' WHERE outbox_id = '%s' AND state = 'DISPATCHED';
	` + rehashDispatched

// rehashDispatched recomputes the hash of an instruction's DISPATCHED row
// (%s: its outbox id) from its columns as they are now.
const rehashDispatched = `UPDATE outbox.attempts a SET hash = outbox.attempt_hash(a.prev_hash, a.attempt_id, a.outbox_id,
	    a.instruction_id, a.participant_id, a.sequence_id, a.idempotency_key, a.rail_type, a.tenant_id, a.correlation_id,
	    a.payload, a.attempt_no, a.state, a.relayer_id, a.claim_attempt_id, a.claimed_at, a.completed_at,
	    a.next_attempt_at, a.rail_reference, a.rail_code, a.error_code, a.error_message, a.latency_ms, a.late, a.created_at)
	  WHERE outbox_id = '%s' AND state = 'DISPATCHED'`

// threeCheckpoints takes two more checkpoints after the one the history
// already has, each over one more dispatched instruction, and returns the
// three.
func (b *recordBundle) threeCheckpoints(t *testing.T) []store.Checkpoint {
	t.Helper()
	for i := range 2 {
		p := fmt.Sprintf("p-more-%d", i)
		b.enqueue(t, p, "k-"+p)
		b.record(t, recordOutcome(t, b.claimOne(t, "r1", longLease), "r1", store.Dispatched))
		b.checkpoint(t)
	}
	cps, err := b.st.Checkpoints(b.ctx, b.pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(cps) != 3 {
		t.Fatalf("%d checkpoints, want 3", len(cps))
	}
	return cps
}

// execAll runs statements in order on one session (settings such as
// session_replication_role stay on it): the tests' role, which owns the
// tables, or a superuser when the first statement sets
// session_replication_role, which only a superuser may.
func (b *recordBundle) execAll(t *testing.T, statements ...string) {
	t.Helper()
	cfg := b.pool.Config().ConnConfig.Copy()
	if strings.Contains(statements[0], "session_replication_role") {
		admin, err := pgx.ParseConfig(testdb.AdminURL(t))
		if err != nil {
			t.Fatal(err)
		}
		cfg.User, cfg.Password = admin.User, admin.Password
	}
	conn, err := pgx.ConnectConfig(b.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(b.ctx)
	for _, s := range statements {
		if _, err := conn.Exec(b.ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
}
