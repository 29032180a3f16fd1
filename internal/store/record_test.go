package store_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/pending"
	"github.com/ledgerline/outbox/reaper"
)

// recordBundle builds states with the real producer, claimer and reaper,
// and records outcomes by hand as a relayer would.
type recordBundle struct {
	ctx      context.Context
	pool     *pgxpool.Pool
	producer *pending.Producer
	st       *store.Store
	reaper   *reaper.Reaper
}

func setupRecord(t *testing.T) *recordBundle {
	t.Helper()
	pool := testdb.New(t)
	producer, err := pending.NewProducer(pending.Config{})
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.New("")
	if err != nil {
		t.Fatal(err)
	}
	rp, err := reaper.New(pool, reaper.Config{ReaperID: "test-reaper"})
	if err != nil {
		t.Fatal(err)
	}
	return &recordBundle{ctx: t.Context(), pool: pool, producer: producer, st: st, reaper: rp}
}

// conn acquires one connection of the bundle's pool for the rest of the
// test (tests that look at what a connection prepared, or need a *pgx.Conn).
func (b *recordBundle) conn(t *testing.T) *pgxpool.Conn {
	t.Helper()
	conn, err := b.pool.Acquire(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Release)
	return conn
}

// Leases: one that runs out almost at once (the relayer is presumed dead)
// and one that cannot run out during a test.
const (
	shortLease = 50 * time.Millisecond
	longLease  = time.Hour
)

func (b *recordBundle) enqueue(t *testing.T, participant, key string) uuid.UUID {
	t.Helper()
	r, err := b.producer.Enqueue(b.ctx, b.pool, pending.Instruction{
		InstructionID: "ins-" + key, ParticipantID: participant, IdempotencyKey: key,
		RailType: "sandbox", AmountMinor: 100, Currency: "USD", Destination: "acct-1",
	})
	if err != nil {
		t.Fatal(err)
	}
	return r.OutboxID
}

// claimOne claims one due instruction (the oldest) for relayer, ordered;
// when only suspects (reaped instructions) are due, one of them, as a
// relayer does.
func (b *recordBundle) claimOne(t *testing.T, relayer string, lease time.Duration) store.Claimed {
	t.Helper()
	p := store.ClaimParams{RelayerID: relayer, Limit: 1, Leases: map[string]time.Duration{"sandbox": lease}}
	claimed, err := b.st.Claim(b.ctx, b.pool, p)
	if err == nil && len(claimed) == 0 {
		p.Suspects = true
		claimed, err = b.st.Claim(b.ctx, b.pool, p)
	}
	if err != nil {
		t.Fatal(err)
	}
	if len(claimed) != 1 {
		t.Fatalf("%s claimed %d instructions, want 1", relayer, len(claimed))
	}
	return claimed[0]
}

// waitExpired waits (bounded) for the claims' leases to run out by the
// database's clock.
func (b *recordBundle) waitExpired(t *testing.T, claims ...store.Claimed) {
	t.Helper()
	for _, c := range claims {
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			var expired bool
			if err := b.pool.QueryRow(b.ctx, `SELECT $1 < now()`, c.LeaseUntil).Scan(&expired); err != nil {
				t.Fatal(err)
			}
			if expired {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("timed out waiting for the lease to expire")
			}
		}
	}
}

// reap waits for c's lease to run out and requeues it with the real
// reaper.
func (b *recordBundle) reap(t *testing.T, c store.Claimed) {
	t.Helper()
	b.waitExpired(t, c)
	requeued, err := b.reaper.RunOnce(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(requeued) != 1 || requeued[0].OutboxID != c.OutboxID {
		t.Fatalf("reaper requeued %+v, want %s", requeued, c.OutboxID)
	}
}

// onTimeAndLate enqueues two instructions (their participants and keys
// end in tag), claims the first for r1 with a lease that cannot run out
// and the second for "slow", and reaps the second: one outcome to record
// on time, one late.
func (b *recordBundle) onTimeAndLate(t *testing.T, tag string) (onTime, late store.Claimed) {
	t.Helper()
	onTimeID := b.enqueue(t, "p1"+tag, "k1"+tag)
	lateID := b.enqueue(t, "p2"+tag, "k2"+tag)
	onTime = b.claimOne(t, "r1", longLease)
	late = b.claimOne(t, "slow", shortLease)
	if onTime.OutboxID != onTimeID || late.OutboxID != lateID {
		t.Fatalf("claimed %s and %s, want %s then %s", onTime.OutboxID, late.OutboxID, onTimeID, lateID)
	}
	b.reap(t, late)
	return onTime, late
}

// recordOutcome builds the outcome of claim c as relayer would report it.
func recordOutcome(t *testing.T, c store.Claimed, relayer string, state store.State) store.Outcome {
	t.Helper()
	id, err := uuid.NewV7()
	if err != nil {
		t.Fatal(err)
	}
	o := store.Outcome{
		Identity: c.Identity, AttemptID: id, ClaimAttemptID: c.AttemptID, AttemptNo: c.AttemptNo,
		RelayerID: relayer, ClaimedAt: c.ClaimedAt, State: state, LatencyMS: 12, CountAttempt: true,
	}
	switch state {
	case store.Dispatched:
		o.RailReference, o.RailCode = "ref-"+c.IdempotencyKey, "ACCEPTED"
	case store.Retryable:
		o.RailCode, o.ErrorCode, o.ErrorMessage = "BUSY", "RAIL_UNAVAILABLE", "try later"
	case store.Failed:
		o.RailCode, o.ErrorCode, o.ErrorMessage = "R03", "RAIL_REJECTED", "no such account"
	}
	return o
}

func (b *recordBundle) record(t *testing.T, outcomes ...store.Outcome) []store.Recorded {
	t.Helper()
	rec, _, err := b.st.Record(b.ctx, b.pool, outcomes, store.HandoffParams{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rec) != len(outcomes) {
		t.Fatalf("recorded %d of %d outcomes", len(rec), len(outcomes))
	}
	return rec
}

// whereabouts says whether the instruction is pending, in flight (and under
// which attempt) and a dead letter.
type whereabouts struct {
	pending, dead bool
	inflight      *uuid.UUID
}

func (b *recordBundle) where(t *testing.T, id uuid.UUID) whereabouts {
	t.Helper()
	var w whereabouts
	err := b.pool.QueryRow(b.ctx, `
		SELECT EXISTS (SELECT 1 FROM outbox.pending WHERE outbox_id = $1),
		       EXISTS (SELECT 1 FROM outbox.dead_letters WHERE outbox_id = $1),
		       (SELECT attempt_id FROM outbox.inflight WHERE outbox_id = $1)`, id).Scan(&w.pending, &w.dead, &w.inflight)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// trail returns the instruction's attempts as "STATE#no" (with "+late").
func (b *recordBundle) trail(t *testing.T, id uuid.UUID) ([]string, []store.Attempt) {
	t.Helper()
	rows, err := b.st.Trail(b.ctx, b.pool, id)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]string, len(rows))
	for i, a := range rows {
		out[i] = string(a.State) + "#" + strconv.Itoa(a.AttemptNo)
		if a.Late {
			out[i] += "+late"
		}
	}
	return out, rows
}

func (b *recordBundle) verifyOK(t *testing.T) store.Report {
	t.Helper()
	r, err := b.st.Verify(b.ctx, b.pool, store.VerifyOptions{Ordered: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range r.Violations {
		t.Errorf("invariant violated: %s", v)
	}
	return r
}

func wantTrail(t *testing.T, got []string, want ...string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("trail %v, want %v", got, want)
	}
}

func TestRecordDispatched(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	id := b.enqueue(t, "p1", "k1")
	c := b.claimOne(t, "r1", longLease)
	o := recordOutcome(t, c, "r1", store.Dispatched)

	rec := b.record(t, o)
	if rec[0].OutboxID != id || rec[0].Late || rec[0].Withdrew || rec[0].NextAttemptAt != nil {
		t.Errorf("recorded %+v, want on time, nothing withdrawn, no next attempt", rec[0])
	}
	if w := b.where(t, id); w.pending || w.dead || w.inflight != nil {
		t.Errorf("dispatched instruction is still somewhere: %+v", w)
	}
	got, rows := b.trail(t, id)
	wantTrail(t, got, "DISPATCHING#1", "DISPATCHED#1")
	if len(rows) == 2 {
		a := rows[1]
		if a.AttemptID != o.AttemptID || a.ClaimAttemptID == nil || *a.ClaimAttemptID != c.AttemptID ||
			a.RelayerID == nil || *a.RelayerID != "r1" || !a.ClaimedAt.Equal(c.ClaimedAt) || a.CompletedAt == nil ||
			a.RailReference == nil || *a.RailReference != "ref-k1" || a.LatencyMS == nil || *a.LatencyMS != 12 ||
			a.NextAttemptAt != nil || a.ErrorCode != nil {
			t.Errorf("DISPATCHED row %+v does not match outcome %+v", a, o)
		}
	}
	if r := b.verifyOK(t); r.Dispatched != 1 || r.DispatchedTwice != 0 {
		t.Errorf("report %+v, want 1 dispatched", r)
	}
}

func TestRecordRetryable(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	counted := b.enqueue(t, "p1", "k1")
	notCounted := b.enqueue(t, "p2", "k2")
	c1 := b.claimOne(t, "r1", longLease) // p1
	c2 := b.claimOne(t, "r1", longLease) // p2
	if c1.OutboxID != counted || c2.OutboxID != notCounted {
		t.Fatalf("claimed %s then %s, want %s then %s", c1.OutboxID, c2.OutboxID, counted, notCounted)
	}
	o1 := recordOutcome(t, c1, "r1", store.Retryable)
	o1.RetryDelay = time.Hour
	o2 := recordOutcome(t, c2, "r1", store.Retryable)
	o2.RetryDelay, o2.CountAttempt, o2.ErrorCode = time.Hour, false, "CIRCUIT_OPEN"

	rec := b.record(t, o1, o2)
	for i, want := range []struct {
		id    uuid.UUID
		count int
	}{{counted, 1}, {notCounted, 0}} {
		r := rec[i]
		if r.OutboxID != want.id || r.Late || r.Withdrew || r.NextAttemptAt == nil {
			t.Errorf("recorded %+v, want on time with a next attempt", r)
			continue
		}
		var (
			count         int
			nextAt        time.Time
			wait          time.Duration
			seq           int64
			createdBefore bool
		)
		err := b.pool.QueryRow(b.ctx, `
			SELECT attempt_count, next_attempt_at, next_attempt_at - now(), sequence_id, created_at < next_attempt_at
			FROM outbox.pending WHERE outbox_id = $1`, want.id).Scan(&count, &nextAt, &wait, &seq, &createdBefore)
		if err != nil {
			t.Fatalf("%s is not pending: %v", want.id, err)
		}
		if count != want.count {
			t.Errorf("%s: attempt_count %d, want %d", want.id, count, want.count)
		}
		// next_attempt_at = (outcome time) + RetryDelay, so from a later
		// now() it is a little under an hour away, and never in the past.
		if wait <= 59*time.Minute || wait > time.Hour {
			t.Errorf("%s: due in %s, want just under 1h", want.id, wait)
		}
		if !nextAt.Equal(*r.NextAttemptAt) || seq != 1 || !createdBefore {
			t.Errorf("%s: pending next_attempt_at %s (recorded %s), sequence %d", want.id, nextAt, *r.NextAttemptAt, seq)
		}
		_, rows := b.trail(t, want.id)
		if len(rows) != 2 || rows[1].State != store.Retryable || rows[1].NextAttemptAt == nil || !rows[1].NextAttemptAt.Equal(nextAt) {
			t.Errorf("%s: trail %+v, want DISPATCHING then RETRYABLE due at %s", want.id, rows, nextAt)
		}
	}
	if w := b.where(t, counted); w.inflight != nil {
		t.Errorf("retried instruction still in flight under %s", w.inflight)
	}
	if r := b.verifyOK(t); r.Pending != 2 || r.InFlight != 0 {
		t.Errorf("report %+v, want 2 pending", r)
	}
}

// TestRecordMixedWrite: one write of a DISPATCHED, a RETRYABLE and a
// FAILED outcome (Record then sends the whole outcome statement, not the
// one for DISPATCHED outcomes alone) puts each where it belongs; a write
// of DISPATCHED outcomes alone leaves none behind.
func TestRecordMixedWrite(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	var claims []store.Claimed
	for i := range 4 {
		b.enqueue(t, fmt.Sprintf("p%d", i), fmt.Sprintf("k%d", i))
		claims = append(claims, b.claimOne(t, "r1", longLease))
	}
	b.record(t, recordOutcome(t, claims[0], "r1", store.Dispatched))
	b.record(t, recordOutcome(t, claims[1], "r1", store.Dispatched), recordOutcome(t, claims[2], "r1", store.Retryable),
		recordOutcome(t, claims[3], "r1", store.Failed))
	for i, want := range []whereabouts{{}, {}, {pending: true}, {dead: true}} {
		if w := b.where(t, claims[i].OutboxID); w != want {
			t.Errorf("outcome %d: %+v, want %+v", i, w, want)
		}
	}
	if r := b.verifyOK(t); r.Dispatched != 2 || r.Pending != 1 || r.DeadLetters != 1 || r.InFlight != 0 {
		t.Errorf("report %+v, want 2 dispatched, 1 pending, 1 dead letter", r)
	}
}

// TestOutcomeStatementTakesOnlyFencedOutcomes: the outcome statements a
// write sends first (with and without retries and dead letters) have no
// plan for an outcome whose in-flight row is gone. Given one next to an
// on-time outcome, each fails with OBLT1 and writes nothing, not even the
// on-time one; Record then writes the batch whole with the statement that
// takes both, and in a caller's transaction, which that failure would
// abort, sends that one at once.
func TestOutcomeStatementTakesOnlyFencedOutcomes(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	onTime, late := b.onTimeAndLate(t, "")
	idOnTime, idLate := onTime.OutboxID, late.OutboxID
	outcomes := []store.Outcome{recordOutcome(t, onTime, "r1", store.Dispatched), recordOutcome(t, late, "slow", store.Dispatched)}

	h := b.st.HotPath()
	for name, stmt := range map[string]string{"dispatched only": h.RecordDispatched, "with retries and dead letters": h.Record} {
		_, err := b.pool.Exec(b.ctx, stmt, store.RecordArgs(outcomes)...)
		if pgErr := (*pgconn.PgError)(nil); !errors.As(err, &pgErr) || pgErr.Code != "OBLT1" {
			t.Fatalf("%s: the outcome statement with a late outcome returned %v, want SQLSTATE OBLT1", name, err)
		}
		if w := b.where(t, idOnTime); w.inflight == nil || *w.inflight != onTime.AttemptID {
			t.Errorf("%s: the on-time outcome's instruction is %+v after the refused write, want still in flight", name, w)
		}
		got, _ := b.trail(t, idOnTime)
		wantTrail(t, got, "DISPATCHING#1")
	}

	rec := b.record(t, outcomes...)
	for _, r := range rec {
		if wantLate := r.ClaimAttemptID == late.AttemptID; r.Late != wantLate {
			t.Errorf("recorded %+v, want late %v", r, wantLate)
		}
	}
	got, _ := b.trail(t, idOnTime)
	wantTrail(t, got, "DISPATCHING#1", "DISPATCHED#1")
	got, _ = b.trail(t, idLate)
	wantTrail(t, got, "DISPATCHING#1", "ZOMBIE_REQUEUE#1", "DISPATCHED#1+late")

	// In a caller's transaction: one on-time and one late outcome again,
	// and the transaction goes on.
	onTime2, late2 := b.onTimeAndLate(t, "-tx")
	err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		rec, _, err := b.st.Record(b.ctx, tx, []store.Outcome{recordOutcome(t, onTime2, "r1", store.Dispatched),
			recordOutcome(t, late2, "slow", store.Dispatched)}, store.HandoffParams{})
		if err != nil {
			return err
		}
		if len(rec) != 2 {
			return fmt.Errorf("recorded %d of 2 outcomes", len(rec))
		}
		_, err = tx.Exec(b.ctx, `SELECT 1`)
		return err
	})
	if err != nil {
		t.Fatalf("recording in a transaction: %v", err)
	}
	got, _ = b.trail(t, onTime2.OutboxID)
	wantTrail(t, got, "DISPATCHING#1", "DISPATCHED#1")
	got, _ = b.trail(t, late2.OutboxID)
	wantTrail(t, got, "DISPATCHING#1", "ZOMBIE_REQUEUE#1", "DISPATCHED#1+late")
	if r := b.verifyOK(t); r.Dispatched != 4 || r.Pending != 0 || r.InFlight != 0 {
		t.Errorf("report %+v, want 4 dispatched, nothing pending or in flight", r)
	}
}

func TestRecordFailed(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	id := b.enqueue(t, "p1", "k1")
	c := b.claimOne(t, "r1", longLease)
	o := recordOutcome(t, c, "r1", store.Failed)

	rec := b.record(t, o)
	if rec[0].Late || rec[0].Withdrew || rec[0].NextAttemptAt != nil {
		t.Errorf("recorded %+v, want on time", rec[0])
	}
	var (
		count       int
		code, msg   string
		attemptID   uuid.UUID
		seq         int64
		enqueuedAt  time.Time
		hasAmount   bool
		failedAfter bool
	)
	err := b.pool.QueryRow(b.ctx, `
		SELECT attempt_count, error_code, error_message, attempt_id, sequence_id, created_at,
		       payload ? 'amount_minor', failed_at >= created_at
		FROM outbox.dead_letters WHERE outbox_id = $1`, id).Scan(&count, &code, &msg, &attemptID, &seq, &enqueuedAt, &hasAmount, &failedAfter)
	if err != nil {
		t.Fatalf("no dead letter: %v", err)
	}
	if count != 1 || code != "RAIL_REJECTED" || msg != "no such account" || attemptID != o.AttemptID || seq != 1 ||
		!enqueuedAt.Equal(c.EnqueuedAt) || !hasAmount || !failedAfter {
		t.Errorf("dead letter: count %d code %s msg %q attempt %s seq %d created %s payload %v", count, code, msg, attemptID, seq, enqueuedAt, hasAmount)
	}
	if w := b.where(t, id); w.pending || w.inflight != nil {
		t.Errorf("failed instruction is also elsewhere: %+v", w)
	}
	got, _ := b.trail(t, id)
	wantTrail(t, got, "DISPATCHING#1", "FAILED#1")
	if r := b.verifyOK(t); r.DeadLetters != 1 || r.Dispatched != 0 {
		t.Errorf("report %+v, want 1 dead letter", r)
	}
}

// TestRecordLateDispatchedWithdrawsCopy: the relayer's lease was reaped, but
// it did reach the rail and now reports DISPATCHED. The outcome is archived
// as late and the requeued copy, not yet claimed, is withdrawn: the
// instruction is dispatched, once.
func TestRecordLateDispatchedWithdrawsCopy(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	id := b.enqueue(t, "p1", "k1")
	c := b.claimOne(t, "slow", shortLease)
	b.reap(t, c)

	rec := b.record(t, recordOutcome(t, c, "slow", store.Dispatched))
	if !rec[0].Late || !rec[0].Withdrew {
		t.Errorf("recorded %+v, want late and withdrawn", rec[0])
	}
	if w := b.where(t, id); w.pending || w.dead || w.inflight != nil {
		t.Errorf("withdrawn instruction is still somewhere: %+v", w)
	}
	got, _ := b.trail(t, id)
	wantTrail(t, got, "DISPATCHING#1", "ZOMBIE_REQUEUE#1", "DISPATCHED#1+late")
	if r := b.verifyOK(t); r.Dispatched != 1 || r.Pending != 0 || r.DispatchedTwice != 0 {
		t.Errorf("report %+v, want dispatched once, nothing pending", r)
	}
}

// TestOutcomeRepeatsItsClaimNotItsInput: the outcome statement takes an
// instruction's identity, attempt number and relayer from its in-flight
// row, or for a late outcome from its claim's archive row, never from
// what the relayer sends (only the rail's answer and the ids that find
// the row). Outcomes whose identity a relayer got wrong are archived as
// their claims were made, and the chains still verify.
func TestOutcomeRepeatsItsClaimNotItsInput(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	onTime, late := b.onTimeAndLate(t, "")

	garble := func(o store.Outcome) store.Outcome {
		o.InstructionID, o.SequenceID, o.IdempotencyKey, o.RailType = "wrong", 99, "wrong", "wrong"
		o.TenantID, o.CorrelationID, o.AttemptNo, o.RelayerID = "wrong", "wrong", 42, "wrong"
		return o
	}
	rec := b.record(t, garble(recordOutcome(t, onTime, "r1", store.Dispatched)),
		garble(recordOutcome(t, late, "slow", store.Retryable)))
	if rec[0].Late || !rec[1].Late {
		t.Fatalf("recorded %+v, want the first on time and the second late", rec)
	}
	for _, c := range []store.Claimed{onTime, late} {
		_, rows := b.trail(t, c.OutboxID)
		last := rows[len(rows)-1]
		if last.ClaimAttemptID == nil || *last.ClaimAttemptID != c.AttemptID {
			t.Fatalf("%s: the last archive row %+v does not close claim %s", c.OutboxID, last, c.AttemptID)
		}
		if last.InstructionID != c.InstructionID || last.ParticipantID != c.ParticipantID || last.SequenceID != c.SequenceID ||
			last.IdempotencyKey != c.IdempotencyKey || last.RailType != c.RailType || last.TenantID != nil ||
			last.CorrelationID != nil || last.AttemptNo != c.AttemptNo || last.RelayerID == nil || *last.RelayerID == "wrong" ||
			!last.ClaimedAt.Equal(c.ClaimedAt) {
			t.Errorf("%s: outcome archived as %+v, want the claim's identity, attempt %d, relayer and time %v",
				c.OutboxID, last, c.AttemptNo, c.ClaimedAt)
		}
	}
	b.verifyOK(t)
}

// TestLateOutcomeOfAMissingClaimFails: a claim's DISPATCHING row commits
// before its rail is called and the archive is append-only, so a late
// outcome whose claim is not in the archive means archive rows were
// removed. The write fails (data_corrupted) and archives nothing, rather
// than an outcome that follows no claim.
func TestLateOutcomeOfAMissingClaimFails(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	b.enqueue(t, "p1", "k1")
	c := b.claimOne(t, "slow", shortLease)
	b.reap(t, c)
	o := recordOutcome(t, c, "slow", store.Retryable)
	o.ClaimAttemptID = uuid.Must(uuid.NewV7()) // a claim the archive never had
	_, _, err := b.st.Record(b.ctx, b.pool, []store.Outcome{o}, store.HandoffParams{})
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "XX001" || !strings.Contains(pgErr.Message, o.ClaimAttemptID.String()) {
		t.Fatalf("late outcome of a missing claim: %v, want data_corrupted naming the claim", err)
	}
	got, _ := b.trail(t, c.OutboxID)
	wantTrail(t, got, "DISPATCHING#1", "ZOMBIE_REQUEUE#1")
}

// TestRecordLateFailedDeadLettersCopy: a late terminal failure withdraws
// the pending copy into the dead letters.
func TestRecordLateFailedDeadLettersCopy(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	id := b.enqueue(t, "p1", "k1")
	c := b.claimOne(t, "slow", shortLease)
	b.reap(t, c)

	o := recordOutcome(t, c, "slow", store.Failed)
	rec := b.record(t, o)
	if !rec[0].Late || !rec[0].Withdrew {
		t.Errorf("recorded %+v, want late and withdrawn", rec[0])
	}
	w := b.where(t, id)
	if w.pending || w.inflight != nil || !w.dead {
		t.Errorf("late FAILED: %+v, want only a dead letter", w)
	}
	var (
		attemptID uuid.UUID
		code      string
		count     int
	)
	if err := b.pool.QueryRow(b.ctx, `SELECT attempt_id, error_code, attempt_count FROM outbox.dead_letters WHERE outbox_id = $1`, id).
		Scan(&attemptID, &code, &count); err != nil {
		t.Fatal(err)
	}
	if attemptID != o.AttemptID || code != "RAIL_REJECTED" {
		t.Errorf("dead letter names attempt %s (%s), want the late FAILED %s (RAIL_REJECTED)", attemptID, code, o.AttemptID)
	}
	// The failed attempt counts, as on the on-time path.
	if count != c.AttemptNo {
		t.Errorf("late dead letter has attempt_count %d, the failed attempt was #%d", count, c.AttemptNo)
	}
	got, _ := b.trail(t, id)
	wantTrail(t, got, "DISPATCHING#1", "ZOMBIE_REQUEUE#1", "FAILED#1+late")
	if r := b.verifyOK(t); r.DeadLetters != 1 || r.Pending != 0 {
		t.Errorf("report %+v, want one dead letter, nothing pending", r)
	}
}

// TestRecordLateRetryableLeavesCopy: a late retryable outcome changes
// nothing in the queue: the requeued copy is already the retry.
func TestRecordLateRetryableLeavesCopy(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	id := b.enqueue(t, "p1", "k1")
	c := b.claimOne(t, "slow", shortLease)
	b.reap(t, c)

	o := recordOutcome(t, c, "slow", store.Retryable)
	o.RetryDelay = time.Hour
	rec := b.record(t, o)
	if !rec[0].Late || rec[0].Withdrew || rec[0].NextAttemptAt != nil {
		t.Errorf("recorded %+v, want late, nothing withdrawn, no new due time", rec[0])
	}
	var (
		count int
		due   bool
	)
	if err := b.pool.QueryRow(b.ctx, `SELECT attempt_count, next_attempt_at <= now() FROM outbox.pending WHERE outbox_id = $1`, id).
		Scan(&count, &due); err != nil {
		t.Fatalf("the requeued copy is gone: %v", err)
	}
	if count != 0 || !due {
		t.Errorf("copy changed by a late retry: attempt_count %d, due %v", count, due)
	}
	got, _ := b.trail(t, id)
	wantTrail(t, got, "DISPATCHING#1", "ZOMBIE_REQUEUE#1", "RETRYABLE#1+late")
	b.verifyOK(t)
}

// TestRecordLateWhileCopyInFlight: the copy was claimed again before the
// slow relayer reported. The late outcome must not touch the new claim's
// in-flight row (fencing) and withdraws nothing; the archive shows both
// dispatches and the rail's idempotency key is what makes them one payment.
// A normal outcome recorded in the same batch is unaffected.
func TestRecordLateWhileCopyInFlight(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	id := b.enqueue(t, "p1", "k1")
	other := b.enqueue(t, "p2", "k2")
	slow := b.claimOne(t, "slow", shortLease) // p1
	if slow.OutboxID != id {
		t.Fatalf("claimed %s, want %s", slow.OutboxID, id)
	}
	b.reap(t, slow)
	// The plain claim takes p2's instruction, the suspect claim the copy.
	claims, err := b.st.Claim(b.ctx, b.pool, store.ClaimParams{
		RelayerID: "fast", Limit: 10, Leases: map[string]time.Duration{"sandbox": longLease},
	})
	if err != nil {
		t.Fatal(err)
	}
	suspects, err := b.st.Claim(b.ctx, b.pool, store.ClaimParams{
		RelayerID: "fast", Limit: 10, Leases: map[string]time.Duration{"sandbox": longLease}, Suspects: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	claims = append(claims, suspects...)
	var again, second store.Claimed
	for _, c := range claims {
		switch c.OutboxID {
		case id:
			again = c
		case other:
			second = c
		}
	}
	if len(claims) != 2 || again.AttemptID == uuid.Nil || second.AttemptID == uuid.Nil {
		t.Fatalf("re-claim got %+v, want the copy and p2's instruction", claims)
	}
	if again.AttemptNo != slow.AttemptNo {
		t.Errorf("copy claimed as attempt %d, want %d (a zombie does not count)", again.AttemptNo, slow.AttemptNo)
	}

	rec := b.record(t, recordOutcome(t, slow, "slow", store.Dispatched), recordOutcome(t, second, "fast", store.Dispatched))
	byID := map[uuid.UUID]store.Recorded{}
	for _, r := range rec {
		byID[r.OutboxID] = r
	}
	if r := byID[id]; !r.Late || r.Withdrew {
		t.Errorf("slow outcome recorded %+v, want late, nothing withdrawn", r)
	}
	if r := byID[other]; r.Late || r.Withdrew {
		t.Errorf("on-time outcome in the same batch recorded %+v", r)
	}
	w := b.where(t, id)
	if w.inflight == nil || *w.inflight != again.AttemptID || w.pending || w.dead {
		t.Errorf("the new claim's in-flight row was touched: %+v, want in flight under %s", w, again.AttemptID)
	}
	got, _ := b.trail(t, id)
	wantTrail(t, got, "DISPATCHING#1", "ZOMBIE_REQUEUE#1", "DISPATCHING#1", "DISPATCHED#1+late")
	if r := b.verifyOK(t); r.Dispatched != 2 || r.InFlight != 1 {
		t.Errorf("report %+v, want 2 dispatched (one late), 1 in flight", r)
	}

	// The new claim finishes too: dispatched twice, each claim closed once.
	if rec := b.record(t, recordOutcome(t, again, "fast", store.Dispatched)); rec[0].Late {
		t.Errorf("the current claim's outcome was recorded late: %+v", rec[0])
	}
	got, _ = b.trail(t, id)
	wantTrail(t, got, "DISPATCHING#1", "ZOMBIE_REQUEUE#1", "DISPATCHING#1", "DISPATCHED#1+late", "DISPATCHED#1")
	if r := b.verifyOK(t); r.Dispatched != 2 || r.DispatchedTwice != 1 || r.InFlight != 0 {
		t.Errorf("report %+v, want 2 dispatched, 1 of them twice, nothing in flight", r)
	}
}

// TestHandoffAfterALateOutcomeLeavesABusyParticipant: the late outcome of
// a participant whose reaped instruction is in flight again (another
// relayer claimed the reaper's copy) frees nobody. The hand-off after it
// must neither claim the participant's next instruction nor make it due:
// the participant is busy. Only the hand-off after the statement for late
// outcomes looks for that (handoffFencedSQL leaves the look out); sent
// after it, the hand-off claimed the successor beside the copy and the
// write failed on the one-in-flight index, or, asked for no claims, made
// the successor due while the copy was in flight.
func TestHandoffAfterALateOutcomeLeavesABusyParticipant(t *testing.T) {
	t.Parallel()
	for _, limit := range []int{10, 0} {
		t.Run("limit "+strconv.Itoa(limit), func(t *testing.T) {
			t.Parallel()
			b := setupRecord(t)
			id := b.enqueue(t, "p1", "k1")
			next := b.enqueue(t, "p1", "k2")
			slow := b.claimOne(t, "slow", shortLease)
			b.reap(t, slow)
			again := b.claimOne(t, "fast", longLease)
			if again.OutboxID != id {
				t.Fatalf("fast claimed %s, want the reaper's copy of %s", again.OutboxID, id)
			}

			rec, handed, err := b.st.Record(b.ctx, b.pool, []store.Outcome{recordOutcome(t, slow, "slow", store.Dispatched)},
				store.HandoffParams{RelayerID: "slow", Limit: limit, Leases: map[string]time.Duration{"sandbox": longLease}})
			if err != nil {
				t.Fatalf("recording the late outcome: %v", err)
			}
			if len(rec) != 1 || !rec[0].Late || len(handed) != 0 {
				t.Errorf("recorded %+v and handed on %d, want one late outcome and nothing handed on", rec, len(handed))
			}
			var waits bool
			if err := b.pool.QueryRow(b.ctx, `SELECT next_attempt_at = 'infinity' FROM outbox.pending WHERE outbox_id = $1`,
				next).Scan(&waits); err != nil {
				t.Fatal(err)
			}
			if w := b.where(t, id); !waits || w.inflight == nil || *w.inflight != again.AttemptID {
				t.Errorf("after the late outcome: successor waits %v, copy %+v; want it waiting behind the copy in flight under %s",
					waits, w, again.AttemptID)
			}

			// The copy's own outcome frees the participant: its successor is
			// handed on.
			_, handed, err = b.st.Record(b.ctx, b.pool, []store.Outcome{recordOutcome(t, again, "fast", store.Dispatched)},
				store.HandoffParams{RelayerID: "fast", Limit: 1, Leases: map[string]time.Duration{"sandbox": longLease}})
			if err != nil {
				t.Fatal(err)
			}
			if len(handed) != 1 || handed[0].OutboxID != next {
				t.Errorf("the copy's outcome handed on %+v, want %s", handed, next)
			}
			b.drain(t, handed)
			if r := b.verifyOK(t); r.Pending != 0 || r.InFlight != 0 {
				t.Errorf("report %+v, want nothing left", r)
			}
		})
	}
}

// TestRecordFencingAfterManualRetake: without the reaper, an operator (or
// a crashed-and-restarted claim) moved the instruction back to pending and
// it was claimed again; the first claim's outcome must not close the
// second claim's in-flight row.
// handRequeueSQL does by hand what the reaper does to the in-flight row of
// outbox $1, lease expired or not: the row back into pending (marked with
// the abandoned claim, as the reaper marks it, when $2) and a
// ZOMBIE_REQUEUE row archived in the instruction's hash chain.
const handRequeueSQL = `
WITH f AS (DELETE FROM outbox.inflight WHERE outbox_id = $1
           RETURNING *, gen_random_uuid() AS zombie_id, clock_timestamp() AS at),
h AS (SELECT f.*, outbox.attempt_hash(f.chain_head, f.zombie_id, f.outbox_id, f.instruction_id, f.participant_id,
        f.sequence_id, f.idempotency_key, f.rail_type, f.tenant_id, f.correlation_id, NULL, f.attempt_no, 'ZOMBIE_REQUEUE',
        f.relayer_id, f.attempt_id, f.claimed_at, f.at, NULL, NULL, NULL, 'ZOMBIE_REQUEUE', NULL, NULL, false, f.at) AS hash
      FROM f),
p AS (INSERT INTO outbox.pending (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
                                  tenant_id, correlation_id, payload, attempt_count, created_at, zombie_attempt_id, chain_head)
      SELECT outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type, tenant_id, correlation_id,
             payload, attempt_no - 1, created_at, CASE WHEN $2::bool THEN attempt_id END, hash FROM h)
INSERT INTO outbox.attempts (attempt_id, outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
                             tenant_id, correlation_id, attempt_no, state, relayer_id, claim_attempt_id, claimed_at,
                             completed_at, error_code, created_at, prev_hash, hash)
SELECT zombie_id, outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type, tenant_id,
       correlation_id, attempt_no, 'ZOMBIE_REQUEUE', relayer_id, attempt_id, claimed_at, at, 'ZOMBIE_REQUEUE', at, chain_head, hash
FROM h`

func TestRecordFencingAfterManualRetake(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	id := b.enqueue(t, "p1", "k1")
	first := b.claimOne(t, "r1", longLease)
	// What the reaper does, by hand, for a lease that has not expired.
	err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(b.ctx, handRequeueSQL, id, false)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	second := b.claimOne(t, "r2", longLease)

	rec := b.record(t, recordOutcome(t, first, "r1", store.Failed))
	if !rec[0].Late || rec[0].Withdrew {
		t.Errorf("stale outcome recorded %+v, want late, nothing withdrawn", rec[0])
	}
	if w := b.where(t, id); w.inflight == nil || *w.inflight != second.AttemptID || w.dead {
		t.Errorf("stale FAILED touched the new claim: %+v", w)
	}
	b.verifyOK(t)
}

// TestRecordRejectsBadState: only outcome states can be recorded, and
// nothing is written otherwise.
func TestRecordRejectsBadState(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	id := b.enqueue(t, "p1", "k1")
	c := b.claimOne(t, "r1", longLease)
	_, _, err := b.st.Record(b.ctx, b.pool, []store.Outcome{
		recordOutcome(t, c, "r1", store.Dispatched),
		recordOutcome(t, c, "r1", store.ZombieRequeue),
	}, store.HandoffParams{})
	if err == nil {
		t.Fatal("recording a ZOMBIE_REQUEUE outcome succeeded")
	}
	if w := b.where(t, id); w.inflight == nil || *w.inflight != c.AttemptID {
		t.Errorf("a rejected batch changed the queue: %+v", w)
	}
	if rec, _, err := b.st.Record(b.ctx, b.pool, nil, store.HandoffParams{}); err != nil || rec != nil {
		t.Errorf("empty batch: %v, %v", rec, err)
	}
}

// TestRecordLateWhileReaperHoldsTheRow: the relayer records while a reaper
// transaction holds the in-flight row. The outcome statement waits, then
// finds the row gone (late), and must still withdraw the copy the reaper
// committed meanwhile, even though its own snapshot predates that commit.
func TestRecordLateWhileReaperHoldsTheRow(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	id := b.enqueue(t, "p1", "k1")
	c := b.claimOne(t, "slow", longLease)

	// A reaper-like transaction: in-flight row out, copy back in (marked
	// with the abandoned claim, as the reaper does), not yet committed.
	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(b.ctx)
	if _, err := tx.Exec(b.ctx, handRequeueSQL, c.OutboxID, true); err != nil {
		t.Fatal(err)
	}

	done := make(chan []store.Recorded, 1)
	errc := make(chan error, 1)
	go func() {
		rec, _, err := b.st.Record(b.ctx, b.pool, []store.Outcome{recordOutcome(t, c, "slow", store.Dispatched)}, store.HandoffParams{})
		errc <- err
		done <- rec
	}()
	// Wait until the outcome statement is blocked on the row lock.
	deadline := time.Now().Add(20 * time.Second)
	for {
		var waiting int
		if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the outcome never waited for the reaper's lock")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	rec := <-done
	if !rec[0].Late || !rec[0].Withdrew {
		t.Fatalf("recorded %+v, want late and the copy withdrawn", rec[0])
	}
	if w := b.where(t, id); w.pending || w.inflight != nil || w.dead {
		t.Fatalf("instruction still queued after its late DISPATCHED: %+v", w)
	}
	if r := b.verifyOK(t); r.Dispatched != 1 || r.Pending != 0 {
		t.Fatalf("report %+v", r)
	}
}

// TestRecordRepeatAfterLostReply: a relayer whose commit reply was lost
// (connection cut, timeout after commit) sends the same outcomes again.
// Each is reported as it was first recorded, nothing is archived twice and
// the queue is not touched again.
func TestRecordRepeatAfterLostReply(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	idOK := b.enqueue(t, "p1", "k1")
	idRetry := b.enqueue(t, "p2", "k2")
	idLate := b.enqueue(t, "p3", "k3")
	claims, err := b.st.Claim(b.ctx, b.pool, store.ClaimParams{
		RelayerID: "r1", Limit: 2, Leases: map[string]time.Duration{"sandbox": longLease},
	})
	if err != nil || len(claims) != 2 {
		t.Fatalf("claimed %d (%v), want 2", len(claims), err)
	}
	slow := b.claimOne(t, "slow", shortLease)
	if slow.OutboxID != idLate {
		t.Fatalf("slow claimed %s, want %s", slow.OutboxID, idLate)
	}
	b.reap(t, slow)

	var outcomes []store.Outcome
	for _, c := range claims {
		state := store.Dispatched
		if c.OutboxID == idRetry {
			state = store.Retryable
		}
		outcomes = append(outcomes, recordOutcome(t, c, "r1", state))
	}
	outcomes = append(outcomes, recordOutcome(t, slow, "slow", store.Dispatched))
	first := b.record(t, outcomes...)
	again := b.record(t, outcomes...)

	byClaim := func(rs []store.Recorded) map[uuid.UUID]store.Recorded {
		m := map[uuid.UUID]store.Recorded{}
		for _, r := range rs {
			m[r.ClaimAttemptID] = r
		}
		return m
	}
	f, a := byClaim(first), byClaim(again)
	for _, o := range outcomes {
		if f[o.ClaimAttemptID].Late != a[o.ClaimAttemptID].Late {
			t.Errorf("outcome of %s: first recorded late=%v, repeat says late=%v", o.OutboxID, f[o.ClaimAttemptID].Late, a[o.ClaimAttemptID].Late)
		}
	}
	if r := f[slow.AttemptID]; !r.Late || !r.Withdrew {
		t.Errorf("late outcome first recorded as %+v, want late and withdrawn", r)
	}
	if r := a[slow.AttemptID]; r.Withdrew {
		t.Errorf("repeat withdrew again: %+v", r)
	}
	for id, want := range map[uuid.UUID][]string{
		idOK:    {"DISPATCHING#1", "DISPATCHED#1"},
		idRetry: {"DISPATCHING#1", "RETRYABLE#1"},
		idLate:  {"DISPATCHING#1", "ZOMBIE_REQUEUE#1", "DISPATCHED#1+late"},
	} {
		got, _ := b.trail(t, id)
		wantTrail(t, got, want...)
	}
	if w := b.where(t, idRetry); !w.pending {
		t.Errorf("the retry is not pending: %+v", w)
	}
	if r := b.verifyOK(t); r.Dispatched != 2 || r.Pending != 1 || r.Attempts != 7 {
		t.Errorf("report %+v, want 2 dispatched, 1 pending, 7 attempt rows", r)
	}
}

// TestRecordLateWithdrawIsFenced: a late terminal outcome withdraws only
// the copy the reaper requeued from its own claim. Once that copy was
// claimed again and is back in pending as a retry, or went to the dead
// letters and an operator replayed it, the late outcome leaves it alone.
func TestRecordLateWithdrawIsFenced(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		state store.State // of the late outcome
		after func(t *testing.T, b *recordBundle, copyClaim store.Claimed)
	}{
		{"copy retried", store.Dispatched, func(t *testing.T, b *recordBundle, c store.Claimed) {
			b.record(t, recordOutcome(t, c, "fast", store.Retryable))
		}},
		{"copy dead-lettered and replayed", store.Failed, func(t *testing.T, b *recordBundle, c store.Claimed) {
			b.record(t, recordOutcome(t, c, "fast", store.Failed))
			if ok, err := b.st.Replay(b.ctx, b.pool, c.OutboxID, "operator", "test"); err != nil || !ok {
				t.Fatalf("replay: %v %v", ok, err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setupRecord(t)
			id := b.enqueue(t, "p1", "k1")
			slow := b.claimOne(t, "slow", shortLease)
			b.reap(t, slow)
			tc.after(t, b, b.claimOne(t, "fast", longLease))

			rec := b.record(t, recordOutcome(t, slow, "slow", tc.state))
			if !rec[0].Late || rec[0].Withdrew {
				t.Errorf("late outcome recorded %+v, want late and nothing withdrawn", rec[0])
			}
			if w := b.where(t, id); !w.pending || w.dead || w.inflight != nil {
				t.Errorf("the pending copy was touched: %+v", w)
			}
			// The late outcome is archived as late, beside the reaper's
			// requeue that closed its claim on time.
			b.verifyOK(t)
		})
	}
}

// TestRecordReadsArchiveByKeyOnly: an outcome recorded on time reads
// nothing of the archive (the outcome statement's plan only inserts into
// it); a resent or late outcome reads it in late_outcome_prior
// (archived_attempt, by primary key; the outbox index since 050). With a large archive neither may scan it, or every flush would slow
// down as the archive grows.
func TestRecordReadsArchiveByKeyOnly(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	// 200,000 rows over 90 days: the current month's partition and the
	// default partition both hold many.
	if _, err := b.pool.Exec(b.ctx, `
		INSERT INTO outbox.attempts (attempt_id, outbox_id, instruction_id, participant_id, sequence_id, idempotency_key,
		                             rail_type, attempt_no, state, relayer_id, claimed_at, completed_at, created_at)
		SELECT ('00000000-0000-7000-8000-' || lpad(to_hex(g), 12, '0'))::uuid,
		       ('00000001-0000-7000-8000-' || lpad(to_hex(g), 12, '0'))::uuid,
		       'bulk-' || g, 'bulk-p' || (g % 1000), g / 1000 + 1, 'bulk-k' || g,
		       'sandbox', 1, 'DISPATCHED', 'bulk', ts, ts, ts
		FROM generate_series(1, 200000) g,
		     LATERAL (SELECT now() - (200000 - g) * interval '38880 milliseconds' AS ts) x`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(b.ctx, `ANALYZE outbox.attempts`); err != nil {
		t.Fatal(err)
	}
	rows, err := b.pool.Query(b.ctx, `SELECT DISTINCT c.relname FROM outbox.attempts a JOIN pg_class c ON c.oid = a.tableoid`)
	if err != nil {
		t.Fatal(err)
	}
	filled, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(filled) < 2 {
		t.Fatalf("archive rows are in partitions %v (%v), want at least 2", filled, err)
	}

	b.enqueue(t, "p1", "k1")
	c := b.claimOne(t, "r1", longLease)
	onTime := recordOutcome(t, c, "r1", store.Dispatched)
	nodes, plan := testdb.Explain(t, b.pool, b.st.RecordSQL(), store.RecordArgs([]store.Outcome{onTime})...)
	for _, n := range nodes {
		if strings.HasPrefix(n.Relation, "attempts") && n.NodeType != "ModifyTable" {
			t.Errorf("the outcome statement reads the archive by %s on %s:\n%s", n.NodeType, n.Relation, plan)
		}
	}
	if rec := b.record(t, onTime); rec[0].Late {
		t.Errorf("recorded %+v", rec[0])
	}

	// reads records o in a transaction and returns the scans it made of
	// the filled partitions, by kind: the backend's counts not yet
	// reported (which include its earlier transactions' until it reports
	// them, never inside a transaction) after the outcome, less before.
	reads := func(o store.Outcome) (seq, idx int64, rec store.Recorded) {
		t.Helper()
		if err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
			scans := func() (seq, idx int64, err error) {
				err = tx.QueryRow(b.ctx, `SELECT coalesce(sum(seq_scan), 0), coalesce(sum(idx_scan), 0)
					FROM pg_stat_xact_user_tables WHERE schemaname = 'outbox' AND relname = ANY($1)`, filled).Scan(&seq, &idx)
				return seq, idx, err
			}
			seq0, idx0, err := scans()
			if err != nil {
				return err
			}
			recs, _, err := b.st.Record(b.ctx, tx, []store.Outcome{o}, store.HandoffParams{})
			if err != nil {
				return err
			}
			if len(recs) != 1 {
				return fmt.Errorf("recorded %d outcomes, want 1", len(recs))
			}
			rec = recs[0]
			seq, idx, err = scans()
			seq, idx = seq-seq0, idx-idx0
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return seq, idx, rec
	}
	if seq, idx, rec := reads(onTime); seq != 0 || idx == 0 || rec.Late {
		t.Errorf("resent outcome: %d sequential and %d index scans of the archive, recorded %+v; want 0, at least 1, on time",
			seq, idx, rec)
	}
	b.enqueue(t, "p2", "k2")
	slow := b.claimOne(t, "slow", shortLease)
	b.reap(t, slow)
	if seq, idx, rec := reads(recordOutcome(t, slow, "slow", store.Retryable)); seq != 0 || idx == 0 || !rec.Late {
		t.Errorf("late outcome: %d sequential and %d index scans of the archive, recorded %+v; want 0, at least 1, late",
			seq, idx, rec)
	}
}

// A requeued zombie keeps its place in line: it has been due since the
// dead relayer claimed it, so work that became due later, while its lease
// ran out, does not go first.
func TestReapedZombieKeepsItsPlace(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	zombie := b.enqueue(t, "p-1", "k-1")
	z := b.claimOne(t, "r-0", shortLease)
	later := b.enqueue(t, "p-2", "k-2")
	b.reap(t, z)
	if c := b.claimOne(t, "r-1", longLease); c.OutboxID != zombie {
		t.Fatalf("claimed %s first, want the zombie %s (not %s, due after its claim)", c.OutboxID, zombie, later)
	}
	b.verifyOK(t) // the dead relayer's claim closed by the reaper, the new one in flight
}

// TestHandoffUnderReaperAndLateCompletion: the outcomes of twenty heads
// whose leases just ran out are recorded, with their successors handed
// on, while the reaper requeues the same heads. Whichever wins each
// instruction, nothing is lost, paid twice or stranded: an outcome the
// reaper beat is late, withdraws the requeued copy and the participant
// moves on; one that beat the reaper hands the successor on. Then the
// rest is drained by claims and outcomes, and every invariant holds. The
// first two rounds put the two in a fixed order (so both paths are sure to
// be taken), the others race them.
func TestHandoffUnderReaperAndLateCompletion(t *testing.T) {
	t.Parallel()
	const participants = 20
	orders := []string{"reaper first", "outcomes first", "together", "together", "together"}
	for round, order := range orders {
		b := setupRecord(t)
		for p := range participants {
			b.enqueue(t, "p-"+strconv.Itoa(p), strconv.Itoa(round)+"-a-"+strconv.Itoa(p))
			b.enqueue(t, "p-"+strconv.Itoa(p), strconv.Itoa(round)+"-b-"+strconv.Itoa(p))
		}
		heads, err := b.st.Claim(b.ctx, b.pool, store.ClaimParams{
			RelayerID: "r-0", Limit: 100, Leases: map[string]time.Duration{"sandbox": shortLease},
		})
		if err != nil || len(heads) != participants {
			t.Fatalf("claimed %d heads (%v), want %d", len(heads), err, participants)
		}
		time.Sleep(2 * shortLease)
		outcomes := make([]store.Outcome, len(heads))
		for i, c := range heads {
			outcomes[i] = recordOutcome(t, c, "r-0", store.Dispatched)
		}
		var (
			wg       sync.WaitGroup
			rec      []store.Recorded
			handed   []store.Claimed
			recErr   error
			requeued []reaper.Requeued
			reapErr  error
		)
		record := func() {
			rec, handed, recErr = b.st.Record(b.ctx, b.pool, outcomes,
				store.HandoffParams{RelayerID: "r-0", Limit: 100, Leases: map[string]time.Duration{"sandbox": longLease}, Refill: true})
		}
		reap := func() { requeued, reapErr = b.reaper.RunOnce(b.ctx) }
		switch order {
		case "reaper first":
			reap()
			record()
		case "outcomes first":
			record()
			reap()
		default:
			wg.Add(2)
			go func() { defer wg.Done(); record() }()
			go func() { defer wg.Done(); reap() }()
			wg.Wait()
		}
		if recErr != nil || reapErr != nil {
			t.Fatalf("record: %v; reap: %v", recErr, reapErr)
		}
		late := 0
		for _, r := range rec {
			if r.Late {
				late++
			}
		}
		t.Logf("round %d (%s): %d outcomes on time, %d late, %d requeued, %d handed on",
			round, order, len(rec)-late, late, len(requeued), len(handed))
		if late != len(requeued) || len(handed) != len(rec)-late {
			t.Errorf("%d late outcomes, %d requeued, %d of %d on time handed on", late, len(requeued), len(handed), len(rec)-late)
		}
		if (order == "reaper first" && late != participants) || (order == "outcomes first" && late != 0) {
			t.Errorf("%s: %d late outcomes", order, late)
		}
		b.drain(t, handed)
		r := b.verifyOK(t)
		if r.Dispatched != 2*participants || r.DispatchedTwice != 0 || r.Pending != 0 || r.InFlight != 0 {
			t.Fatalf("report %+v: want %d dispatched once each, nothing left", r, 2*participants)
		}
	}
}

// drain records held claims dispatched (handing successors on) and claims
// what is due, until nothing is pending or in flight. A round that claims
// nothing while work is left means a participant is stranded.
func (b *recordBundle) drain(t *testing.T, held []store.Claimed) {
	t.Helper()
	relayer := "r-0" // whose claims held are
	leases := map[string]time.Duration{"sandbox": longLease}
	for range 1000 {
		if len(held) == 0 {
			var err error
			held, err = b.st.Claim(b.ctx, b.pool, store.ClaimParams{RelayerID: "r-1", Limit: 100, Leases: leases})
			relayer = "r-1"
			if err != nil {
				t.Fatal(err)
			}
		}
		if len(held) == 0 {
			var left int
			if err := b.pool.QueryRow(b.ctx, `SELECT (SELECT count(*) FROM outbox.pending) + (SELECT count(*) FROM outbox.inflight)`).Scan(&left); err != nil {
				t.Fatal(err)
			}
			if left > 0 {
				t.Fatalf("%d instructions left and none due: stranded", left)
			}
			return
		}
		outcomes := make([]store.Outcome, len(held))
		for i, c := range held {
			outcomes[i] = recordOutcome(t, c, relayer, store.Dispatched)
		}
		_, next, err := b.st.Record(b.ctx, b.pool, outcomes, store.HandoffParams{RelayerID: "r-1", Limit: 100, Leases: leases})
		if err != nil {
			t.Fatal(err)
		}
		held, relayer = next, "r-1"
	}
	t.Fatal("not drained after 1000 rounds")
}

// TestPoisonInstructionIsDeadLettered: an instruction whose relayer dies
// on it every time is requeued up to the zombie limit (3), then the next
// expiry makes it a dead letter marked outcome unknown, and its
// participant's next instruction is dispatched. A replay gives it a fresh
// zombie budget.
func TestPoisonInstructionIsDeadLettered(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	poison := b.enqueue(t, "p1", "k1")
	next := b.enqueue(t, "p1", "k2")
	for i := range reaper.DefaultZombieLimit + 1 {
		if i == 2 {
			// Twice a zombie, it is a suspect: the plain claim leaves it
			// alone (relayers dispatch suspects alone), and its
			// participant waits behind it.
			if c, err := b.st.Claim(b.ctx, b.pool, store.ClaimParams{RelayerID: "r", Limit: 10,
				Leases: map[string]time.Duration{"sandbox": longLease}}); err != nil || len(c) != 0 {
				t.Fatalf("plain claim with only a suspect due: %+v %v, want nothing", c, err)
			}
		}
		c := b.claimOne(t, fmt.Sprintf("doomed-%d", i), shortLease)
		if c.OutboxID != poison {
			t.Fatalf("claim %d took %s, want the poison instruction %s (its participant is blocked behind it)", i, c.OutboxID, poison)
		}
		b.reap(t, c)
	}
	if w := b.where(t, poison); !w.dead || w.pending || w.inflight != nil {
		t.Fatalf("poison instruction is %+v, want a dead letter", w)
	}
	dls, err := b.st.DeadLetters(b.ctx, b.pool, false, 10)
	if err != nil || len(dls) != 1 || dls[0].ErrorCode != "ZOMBIE_LIMIT" || !dls[0].OutcomeUnknown {
		t.Fatalf("dead letters %+v (%v), want one ZOMBIE_LIMIT, outcome unknown", dls, err)
	}
	got, _ := b.trail(t, poison)
	wantTrail(t, got, "DISPATCHING#1", "ZOMBIE_REQUEUE#1", "DISPATCHING#1", "ZOMBIE_REQUEUE#1",
		"DISPATCHING#1", "ZOMBIE_REQUEUE#1", "DISPATCHING#1", "FAILED#1")
	if s := b.reaper.Stats(); s.DeadLettered != 1 || s.Requeued != int64(reaper.DefaultZombieLimit) {
		t.Errorf("reaper stats %+v, want 1 dead-lettered and %d requeued", s, reaper.DefaultZombieLimit)
	}

	// The participant moved on.
	c := b.claimOne(t, "r1", longLease)
	if c.OutboxID != next {
		t.Fatalf("claimed %s, want the participant's next instruction %s", c.OutboxID, next)
	}
	b.record(t, recordOutcome(t, c, "r1", store.Dispatched))
	b.verifyOK(t)

	// Replayed, it has its whole zombie budget again: one more death is
	// a requeue, not a dead letter.
	if ok, err := b.st.Replay(b.ctx, b.pool, poison, "alice", "rail fixed the crash"); err != nil || !ok {
		t.Fatalf("replay: %v %v", ok, err)
	}
	b.reap(t, b.claimOne(t, "doomed-again", shortLease))
	if w := b.where(t, poison); !w.pending {
		t.Fatalf("replayed poison instruction after one more death is %+v, want pending", w)
	}
	b.verifyOK(t)
}

// TestLateDispatchedSettlesPoisonDeadLetter: a relayer that was presumed
// dead on a poison instruction's first claim (killed mid-stop, say) records
// DISPATCHED after the reaper dead-lettered the instruction, outcome
// unknown: the outcome is known now, the dead letter goes, and the
// instruction is in exactly one place, dispatched.
func TestLateDispatchedSettlesPoisonDeadLetter(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	poison := b.enqueue(t, "p1", "k1")
	var first store.Claimed
	for i := range reaper.DefaultZombieLimit + 1 {
		c := b.claimOne(t, fmt.Sprintf("doomed-%d", i), shortLease)
		if i == 0 {
			first = c
		}
		b.reap(t, c)
	}
	if w := b.where(t, poison); !w.dead {
		t.Fatalf("poison instruction is %+v, want a dead letter", w)
	}
	rec := b.record(t, recordOutcome(t, first, "doomed-0", store.Dispatched))
	if !rec[0].Late {
		t.Fatalf("the first claim's outcome was not late: %+v", rec[0])
	}
	if w := b.where(t, poison); w.dead || w.pending || w.inflight != nil {
		t.Fatalf("after the late DISPATCHED the instruction is %+v, want dispatched only", w)
	}
	b.verifyOK(t)
}

// TestLateOutcomeOfThePoisonedClaimVerifies: the claim the reaper closed
// by making its instruction a dead letter (FAILED, ZOMBIE_LIMIT) may
// still have its outcome come late, from a relayer that was only slow;
// audit verify counts that closing row as the reaper's, as it counts a
// ZOMBIE_REQUEUE, and does not report the claim closed twice. It counted
// only ZOMBIE_REQUEUE rows, so the late outcome of the last claim of a
// poison instruction failed "every claim closed once".
func TestLateOutcomeOfThePoisonedClaimVerifies(t *testing.T) {
	t.Parallel()
	for _, state := range []store.State{store.Dispatched, store.Failed, store.Retryable} {
		t.Run(string(state), func(t *testing.T) {
			t.Parallel()
			b := setupRecord(t)
			poison := b.enqueue(t, "p1", "k1")
			var last store.Claimed
			for i := range reaper.DefaultZombieLimit + 1 {
				last = b.claimOne(t, fmt.Sprintf("doomed-%d", i), shortLease)
				b.reap(t, last)
			}
			if w := b.where(t, poison); !w.dead {
				t.Fatalf("poison instruction is %+v, want a dead letter", w)
			}
			if rec := b.record(t, recordOutcome(t, last, "doomed-last", state)); !rec[0].Late {
				t.Fatalf("the poisoned claim's outcome was not late: %+v", rec[0])
			}
			b.verifyOK(t)
		})
	}
}

// TestLateOutcomesReadTheQueueByKey: late outcomes come in numbers when
// leases run out during an incident, which is also when a backlog builds.
// Withdrawing the reaper's requeued copies must find them by key, not scan
// pending, also when pending's statistics are those of the vacuumed empty
// table (0 rows on its pages: PostgreSQL then estimates one row whatever
// it holds). A join the planner chose read all 20,000 rows for one
// withdrawal.
func TestLateOutcomesReadTheQueueByKey(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	statisticsOfEmpty(t, b.pool, "pending")
	ids := []uuid.UUID{b.enqueue(t, "p1", "k1"), b.enqueue(t, "p2", "k2")}
	var claims []store.Claimed
	for range ids {
		claims = append(claims, b.claimOne(t, "slow", shortLease))
	}
	b.waitExpired(t, claims...)
	if requeued, err := b.reaper.RunOnce(b.ctx); err != nil || len(requeued) != 2 {
		t.Fatalf("reaper requeued %+v (%v), want both", requeued, err)
	}
	// The backlog, and dead letters of years past.
	for _, q := range []string{otherBacklogSQL, `
INSERT INTO outbox.dead_letters (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
                                 payload, attempt_count, error_code, attempt_id, created_at, failed_at, acknowledged_at)
SELECT gen_random_uuid(), 'old-' || g, 'old-' || (g % 500), g, 'old-' || g, 'sandbox', '{}', 1, 'RAIL_REJECTED',
       gen_random_uuid(), now() - interval '1 year', now() - interval '1 year', now() - interval '1 year'
FROM generate_series(1, 20000) AS g`, `ANALYZE outbox.dead_letters`} {
		if _, err := b.pool.Exec(b.ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	wantStatisticsOfEmpty(t, b.pool, "pending")

	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(b.ctx)
	tables := []string{"outbox.pending", "outbox.dead_letters"}
	before := readsOf(t, tx, tables...)
	rec, _, err := b.st.Record(b.ctx, tx, []store.Outcome{
		recordOutcome(t, claims[0], "slow", store.Dispatched), recordOutcome(t, claims[1], "slow", store.Failed),
	}, store.HandoffParams{})
	if err != nil {
		t.Fatal(err)
	}
	after := readsOf(t, tx, tables...)
	for i, r := range rec {
		if !r.Late || !r.Withdrew {
			t.Errorf("outcome %d recorded %+v, want late and withdrawn", i, r)
		}
	}
	for i, table := range tables {
		if n := after[i].seqTuples - before[i].seqTuples; n > 0 {
			t.Errorf("sequential scans read %d rows of %s to record two late outcomes", n, table)
		}
		if n := after[i].indexEntries - before[i].indexEntries; n > 20 {
			t.Errorf("%s's indexes returned %d entries to record two late outcomes", table, n)
		}
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	if w := b.where(t, ids[0]); w.pending || w.dead || w.inflight != nil {
		t.Errorf("late DISPATCHED: %+v, want nowhere", w)
	}
	if w := b.where(t, ids[1]); w.pending || !w.dead || w.inflight != nil {
		t.Errorf("late FAILED: %+v, want only a dead letter", w)
	}
}

// TestRecordCapsALatencyPastTheArchiveColumn: a call that took longer than
// latency_ms (an int) can hold, 24.8 days (only a transport that ignores
// its deadline), is archived with the most the column holds; it used to
// wrap to a negative latency, and a negative one (a clock step) is 0.
func TestRecordCapsALatencyPastTheArchiveColumn(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	for key, ms := range map[string]int{"k-long": 1 << 40, "k-negative": -5} {
		id := b.enqueue(t, "p-"+key, key)
		o := recordOutcome(t, b.claimOne(t, "r1", longLease), "r1", store.Dispatched)
		o.LatencyMS = ms
		b.record(t, o)
		want := map[string]int{"k-long": math.MaxInt32, "k-negative": 0}[key]
		var got int
		if err := b.pool.QueryRow(b.ctx, `SELECT latency_ms FROM outbox.attempts WHERE outbox_id = $1 AND state = 'DISPATCHED'`, id).Scan(&got); err != nil || got != want {
			t.Errorf("%s: latency %d ms archived as %d (%v), want %d", key, ms, got, err, want)
		}
	}
}

// TestRecordTakesTheLockOfARetrysParticipant: a write of a terminal and a
// retryable outcome takes the locks of both participants (a retry may
// change who is its participant's head, requeuedSQL), not only the
// terminal one's. Held by another transaction (a replay or cancel of the
// retry's participant), the lock makes the write wait; a write that took
// only the terminal participants' locks whenever it had one went ahead.
func TestRecordTakesTheLockOfARetrysParticipant(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	done, retried := b.enqueue(t, "p-done", "k-done"), b.enqueue(t, "p-retry", "k-retry")
	c1, c2 := b.claimOne(t, "r1", longLease), b.claimOne(t, "r1", longLease)
	if c1.OutboxID != done || c2.OutboxID != retried {
		t.Fatalf("claimed %s and %s, want %s then %s", c1.OutboxID, c2.OutboxID, done, retried)
	}
	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(b.ctx) }()
	execAll(t, tx, `SELECT 1 FROM outbox.sequences WHERE participant_id = 'p-retry' FOR UPDATE`)

	conn := b.conn(t)
	written := make(chan error, 1)
	outcomes := []store.Outcome{recordOutcome(t, c1, "r1", store.Dispatched), recordOutcome(t, c2, "r1", store.Retryable)}
	go func() {
		_, _, err := b.st.Record(b.ctx, conn, outcomes, store.HandoffParams{})
		written <- err
	}()
	b.waitForLock(t, conn.Conn().PgConn().PID(), written)
	select {
	case err := <-written:
		t.Fatalf("the write ended (%v) while the retried instruction's participant was locked elsewhere", err)
	default:
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-written; err != nil {
		t.Fatal(err)
	}
	if w := b.where(t, retried); !w.pending {
		t.Fatalf("retried instruction: %+v, want pending", w)
	}
	b.verifyOK(t)
}
