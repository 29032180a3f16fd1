package store_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/internal/store"
)

// bothRails are the leases of a relayer that claims the sandbox rail and
// one more.
var bothRails = map[string]time.Duration{"sandbox": longLease, "other": longLease}

func (b *recordBundle) claimAll(t *testing.T) []store.Claimed {
	t.Helper()
	claimed, err := b.st.Claim(b.ctx, b.pool, store.ClaimParams{RelayerID: "r-1", Limit: 10, Leases: bothRails})
	if err != nil {
		t.Fatal(err)
	}
	return claimed
}

func (b *recordBundle) pause(t *testing.T, railType string) {
	t.Helper()
	if ok, err := b.st.PauseRail(b.ctx, b.pool, railType, "olga", "bank maintenance"); err != nil || !ok {
		t.Fatalf("pause %s: %v, %v", railType, ok, err)
	}
}

func (b *recordBundle) resume(t *testing.T, railType string) {
	t.Helper()
	if ok, err := b.st.ResumeRail(b.ctx, b.pool, railType, "olga", "maintenance over"); err != nil || !ok {
		t.Fatalf("resume %s: %v, %v", railType, ok, err)
	}
}

// TestPausedRailIsNotClaimed: a paused rail's instructions are left
// pending by claims and by the hand-off (its successor is made due
// instead, for after the resume), other rails go on; a pause of every
// rail stops all of them; each pause and resume is recorded once, with
// who and why, in a record nobody can change.
func TestPausedRailIsNotClaimed(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	first := b.enqueue(t, "p-a", "a1")
	second := b.enqueue(t, "p-a", "a2")
	other := b.enqueue(t, "p-b", "b1")
	b.execAll(t, `UPDATE outbox.pending SET rail_type = 'other' WHERE outbox_id = '`+other.String()+`'`)

	b.pause(t, "sandbox")
	if ok, err := b.st.PauseRail(b.ctx, b.pool, "sandbox", "someone", "again"); err != nil || ok {
		t.Fatalf("a second pause: %v, %v (want false: already paused)", ok, err)
	}
	if got := b.claimAll(t); !sameIDs(got, other) {
		t.Fatalf("claimed %v with sandbox paused, want only the other rail's %s", outboxIDs(got), other)
	}
	sn, err := b.st.Snapshot(b.ctx, b.pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(sn.PausedRails) != 1 || sn.PausedRails[0].RailType != "sandbox" || sn.PausedRails[0].PausedBy != "olga" ||
		sn.PausedRails[0].Reason != "bank maintenance" {
		t.Fatalf("snapshot's paused rails: %+v", sn.PausedRails)
	}

	b.resume(t, "sandbox")
	claimed := b.claimAll(t)
	if !sameIDs(claimed, first) {
		t.Fatalf("claimed %v after the resume, want %s", outboxIDs(claimed), first)
	}
	// Paused while the head is in flight: its outcome does not hand its
	// successor on, but makes it due.
	b.pause(t, "sandbox")
	outcome := recordOutcome(t, claimed[0], "r-1", store.Dispatched)
	if _, handed, err := b.st.Record(b.ctx, b.pool, []store.Outcome{outcome},
		store.HandoffParams{RelayerID: "r-1", Limit: 5, Leases: bothRails, Refill: true}); err != nil || len(handed) != 0 {
		t.Fatalf("hand-off with sandbox paused: %v, %v (want nothing)", outboxIDs(handed), err)
	}
	var due bool
	if err := b.pool.QueryRow(b.ctx, `SELECT next_attempt_at <= now() FROM outbox.pending WHERE outbox_id = $1`, second).Scan(&due); err != nil || !due {
		t.Fatalf("the successor is due: %v, %v (want true)", due, err)
	}
	if got := b.claimAll(t); len(got) != 0 {
		t.Fatalf("claimed %v with sandbox paused", outboxIDs(got))
	}

	// Every rail: a pause of its own, ended only by its own resume.
	b.resume(t, "sandbox")
	b.pause(t, store.AllRails)
	if got := b.claimAll(t); len(got) != 0 {
		t.Fatalf("claimed %v with every rail paused", outboxIDs(got))
	}
	if ok, err := b.st.ResumeRail(b.ctx, b.pool, "sandbox", "olga", "not paused"); err != nil || ok {
		t.Fatalf("resume of a rail that is not paused: %v, %v (want false)", ok, err)
	}
	b.resume(t, store.AllRails)
	if got := b.claimAll(t); !sameIDs(got, second) {
		t.Fatalf("claimed %v after every rail resumed, want %s", outboxIDs(got), second)
	}

	events, err := b.st.RailPauseEvents(b.ctx, b.pool, 10)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range slices.Backward(events) {
		got = append(got, e.RailType+" "+e.Action+" by "+e.Operator+": "+e.Reason)
	}
	want := []string{
		"sandbox PAUSED by olga: bank maintenance", "sandbox RESUMED by olga: maintenance over",
		"sandbox PAUSED by olga: bank maintenance", "sandbox RESUMED by olga: maintenance over",
		"* PAUSED by olga: bank maintenance", "* RESUMED by olga: maintenance over",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("pause events:\n%q\nwant\n%q", got, want)
	}
	for _, q := range []string{`UPDATE outbox.rail_pause_events SET reason = 'nothing happened'`, `DELETE FROM outbox.rail_pause_events`,
		`TRUNCATE outbox.rail_pause_events`} {
		var pgErr *pgconn.PgError
		if _, err := b.pool.Exec(b.ctx, q); !errors.As(err, &pgErr) || pgErr.Code != "42501" {
			t.Errorf("%s: %v, want refused (42501)", q, err)
		}
	}
	b.verifyOK(t)
}

// TestPauseNeedsRailOperatorAndReason: each is refused, typed, before the
// database is asked, and by the database itself.
func TestPauseNeedsRailOperatorAndReason(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	for _, c := range []struct {
		rail, operator, reason string
		want                   error
	}{
		{"", "olga", "why", store.ErrRailType},
		{"sandbox", " ", "why", store.ErrOperatorAction},
		{"sandbox", "olga", "", store.ErrOperatorAction},
	} {
		if _, err := b.st.PauseRail(b.ctx, b.pool, c.rail, c.operator, c.reason); !errors.Is(err, c.want) {
			t.Errorf("pause %q by %q for %q: %v, want %v", c.rail, c.operator, c.reason, err, c.want)
		}
		if _, err := b.st.ResumeRail(b.ctx, b.pool, c.rail, c.operator, c.reason); !errors.Is(err, c.want) {
			t.Errorf("resume %q by %q for %q: %v, want %v", c.rail, c.operator, c.reason, err, c.want)
		}
	}
	for _, q := range []string{`SELECT outbox.pause_rail(' ', 'olga', 'why')`, `SELECT outbox.pause_rail('sandbox', '', 'why')`,
		`SELECT outbox.resume_rail('sandbox', 'olga', NULL)`} {
		var pgErr *pgconn.PgError
		if _, err := b.pool.Exec(b.ctx, q); !errors.As(err, &pgErr) || pgErr.Code != "22023" {
			t.Errorf("%s: %v, want refused (22023)", q, err)
		}
	}
	var n int
	if err := b.pool.QueryRow(b.ctx, `SELECT (SELECT count(*) FROM outbox.rail_pauses) + (SELECT count(*) FROM outbox.rail_pause_events)`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d rows written by refused pauses (%v)", n, err)
	}
}

// TestRailQuietWaitsForEarlierClaims: a claim whose snapshot was taken
// before the pause committed does not see it, and claims the paused rail.
// RailQuiet waits for such a transaction (found by its lock on pending),
// then for what it claimed to be recorded.
func TestRailQuietWaitsForEarlierClaims(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	id := b.enqueue(t, "p-a", "a1")

	// A claim that began before the pause: its snapshot (and its lock on
	// pending) taken, its rows not yet chosen.
	early, err := b.pool.BeginTx(b.ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = early.Rollback(context.WithoutCancel(b.ctx)) }()
	if _, err := early.Exec(b.ctx, `SELECT 1 FROM outbox.pending LIMIT 1`); err != nil {
		t.Fatal(err)
	}
	b.pause(t, "sandbox")

	// quiet asks RailQuiet, wait to end it. An answer of not quiet whose
	// figures say quiet was cut off before its reads were done, and is
	// asked again with twice the wait: on a loaded machine 200 ms did not
	// cover them ("{Transactions:0 InFlight:0 Held:0}, not quiet yet").
	quiet := func(wait time.Duration) (store.Quiet, error) {
		for {
			ctx, cancel := context.WithTimeout(b.ctx, wait)
			q, err := b.st.RailQuiet(ctx, b.pool, "sandbox", 10*time.Millisecond)
			cancel()
			if !errors.Is(err, store.ErrNotQuiet) || !q.Done() || wait > time.Minute {
				return q, err
			}
			wait *= 2
		}
	}
	claimed, err := b.st.Claim(b.ctx, early, store.ClaimParams{RelayerID: "r-1", Limit: 10, Leases: bothRails})
	if err != nil || len(claimed) != 1 || claimed[0].OutboxID != id {
		t.Fatalf("the early claim took %v, %v: want the paused rail's %s (its snapshot predates the pause)", claimed, err, id)
	}
	if q, err := quiet(200 * time.Millisecond); !errors.Is(err, store.ErrNotQuiet) || q.Transactions < 1 || q.Held != 1 {
		t.Fatalf("quiet with the early claim open: %+v, %v (want not quiet, its transaction open, 1 held)", q, err)
	}
	if err := early.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	if q, err := quiet(200 * time.Millisecond); !errors.Is(err, store.ErrNotQuiet) || q.Transactions != 0 || q.InFlight != 1 {
		t.Fatalf("quiet with the claim in flight: %+v, %v (want not quiet, 1 in flight)", q, err)
	}
	b.record(t, recordOutcome(t, claimed[0], "r-1", store.Dispatched))
	if q, err := quiet(5 * time.Second); err != nil || !q.Done() {
		t.Fatalf("quiet once recorded: %+v, %v", q, err)
	}
	b.verifyOK(t)
}

// TestTwoOperatorsPauseAndResumeAtOnce: two operators pause the same rail
// at once: the second waits for the first's pause to commit (the rail's
// row in rail_pauses) and answers false, so the rail is paused once, with
// the first operator's reason, and one PAUSED event; the same for two
// resumes. Each event names the operator, the reason and the database role.
func TestTwoOperatorsPauseAndResumeAtOnce(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	role := b.sessionRole(t)
	for _, c := range []struct {
		action string
		do     func(db store.Querier, operator, reason string) (bool, error)
	}{
		{"PAUSED", func(db store.Querier, operator, reason string) (bool, error) {
			return b.st.PauseRail(b.ctx, db, "sandbox", operator, reason)
		}},
		{"RESUMED", func(db store.Querier, operator, reason string) (bool, error) {
			return b.st.ResumeRail(b.ctx, db, "sandbox", operator, reason)
		}},
	} {
		tx, err := b.pool.Begin(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := c.do(tx, "alice", "first "+c.action); err != nil || !ok {
			t.Fatalf("alice: %v, %v", ok, err)
		}
		var second bool
		if err := b.waitingOn(t, tx, func(conn *pgxpool.Conn) (err error) {
			second, err = c.do(conn, "bob", "second "+c.action)
			return err
		}); err != nil || second {
			t.Fatalf("bob after alice (%s): %v, %v (want false)", c.action, second, err)
		}
	}
	events, err := b.st.RailPauseEvents(b.ctx, b.pool, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(events) != 2 {
		t.Fatalf("%d events, want one pause and one resume: %+v", len(events), events)
	}
	for i, want := range []string{"RESUMED", "PAUSED"} { // newest first
		e := events[i]
		if e.Action != want || e.Operator != "alice" || e.Reason != "first "+want || e.DatabaseRole == nil || *e.DatabaseRole != strings.Trim(role, `"`) {
			t.Errorf("event %d: %+v (role %v), want %s by alice as %s", i, e, e.DatabaseRole, want, role)
		}
	}
	if pauses, err := b.st.RailPauses(b.ctx, b.pool); err != nil || len(pauses) != 0 {
		t.Fatalf("pauses in force: %+v, %v (want none)", pauses, err)
	}
}

// TestResumeRailShown: a resume of the pause shown ends that pause only:
// after someone resumed it and paused the rail again, it returns
// ErrPauseChanged and the new pause stays, with no RESUMED event; with
// the rail not paused it reports false; the function refuses a resume
// without a reason, as resume_rail does.
func TestResumeRailShown(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	pausedAt := func() time.Time {
		t.Helper()
		pauses, err := b.st.RailPauses(b.ctx, b.pool)
		if err != nil || len(pauses) != 1 {
			t.Fatalf("pauses: %+v %v", pauses, err)
		}
		return pauses[0].PausedAt
	}
	b.pause(t, "sandbox")
	first := pausedAt()
	b.resume(t, "sandbox")
	time.Sleep(2 * time.Millisecond) // paused_at is the transaction's start, in microseconds
	b.pause(t, "sandbox")
	second := pausedAt()
	if ok, err := b.st.ResumeRailShown(b.ctx, b.pool, "sandbox", first, "pia", "from a stale view"); ok || !errors.Is(err, store.ErrPauseChanged) {
		t.Errorf("a resume of the first pause while the second is in force: %v, %v; want ErrPauseChanged", ok, err)
	}
	if got := pausedAt(); !got.Equal(second) {
		t.Fatalf("the pause in force after a refused resume: %v, want %v", got, second)
	}
	var stale int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox.rail_pause_events WHERE operator = 'pia'`).Scan(&stale); err != nil || stale != 0 {
		t.Fatalf("%d events of the refused resume (%v)", stale, err)
	}
	var pgErr *pgconn.PgError
	if _, err := b.pool.Exec(b.ctx, `SELECT outbox.resume_rail_shown('sandbox', $1, 'pia', NULL)`, second); !errors.As(err, &pgErr) || pgErr.Code != "22023" {
		t.Errorf("resume_rail_shown without a reason: %v, want refused (22023)", err)
	}
	if ok, err := b.st.ResumeRailShown(b.ctx, b.pool, "sandbox", second, "pia", "maintenance over"); !ok || err != nil {
		t.Fatalf("a resume of the pause in force: %v, %v", ok, err)
	}
	if ok, err := b.st.ResumeRailShown(b.ctx, b.pool, "sandbox", second, "pia", "again"); ok || err != nil {
		t.Errorf("a resume of a rail not paused: %v, %v; want false, nil", ok, err)
	}
}

// TestResumeRailShownInMilliseconds: a client that keeps times in
// milliseconds (a JavaScript Date) sends the pause it was shown with its
// microseconds cut off. That names the pause made within that
// millisecond: the resume ends it, where it was refused with
// ErrPauseChanged every time; a pause made since, in another
// millisecond, is still not ended by the earlier pause's time.
func TestResumeRailShownInMilliseconds(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	// pausedAt pauses the rail until its pause has microseconds of its
	// own (one in a thousand is made on a whole millisecond), and returns
	// its time.
	pausedAt := func() time.Time {
		t.Helper()
		for range 10 {
			b.pause(t, "sandbox")
			pauses, err := b.st.RailPauses(b.ctx, b.pool)
			if err != nil || len(pauses) != 1 {
				t.Fatalf("pauses: %+v %v", pauses, err)
			}
			if at := pauses[0].PausedAt; !at.Truncate(time.Millisecond).Equal(at) {
				return at
			}
			b.resume(t, "sandbox")
		}
		t.Fatal("ten pauses made on whole milliseconds")
		return time.Time{}
	}
	first := pausedAt()
	b.resume(t, "sandbox")
	time.Sleep(2 * time.Millisecond)
	second := pausedAt()
	if ok, err := b.st.ResumeRailShown(b.ctx, b.pool, "sandbox", first.Truncate(time.Millisecond), "pia", "from a stale view"); ok || !errors.Is(err, store.ErrPauseChanged) {
		t.Errorf("a resume of the first pause, in milliseconds, while the second is in force: %v, %v; want ErrPauseChanged", ok, err)
	}
	if ok, err := b.st.ResumeRailShown(b.ctx, b.pool, "sandbox", second.Truncate(time.Millisecond), "pia", "maintenance over"); !ok || err != nil {
		t.Fatalf("a resume of the pause in force, its time in milliseconds: %v, %v; want done", ok, err)
	}
	if pauses, err := b.st.RailPauses(b.ctx, b.pool); err != nil || len(pauses) != 0 {
		t.Fatalf("pauses after the resume: %+v %v", pauses, err)
	}
}
