package engine

import (
	"bytes"
	"context"
	"log/slog"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/rails"
)

// TestLostCommitReplyReleasesItsHandoffs: the reply to an outcome write
// that committed, and whose hand-off claimed the participant's next
// instruction, is lost (the connection breaks after the commit). The
// recorder sends the outcome again, which finds it archived; the
// successor, claimed for this relayer by a transaction whose answer never
// came, must not sit in flight until its lease ends and the reaper
// requeues it as a zombie (a zombie count it did nothing to earn). Before
// the fix it did; now the recorder finds what the lost write handed off
// and hands it back (RELEASED), and it is dispatched at once.
func TestLostCommitReplyReleasesItsHandoffs(t *testing.T) {
	t.Parallel()
	l := setupLostReply(t, "lost", "cut-the-reply-to-this-write", "")
	r := l.start(t, "r-lost-reply", nil)
	// Both dispatched, before the successor's lease (11 s) could end: no
	// reaper runs here, so only the relayer itself can move it.
	l.waitBothDispatched(t, r)
	l.wantReleasedOnce(t)
}

// TestLostCommitReplyReleasesItsHandoffsWhenTheResendIsSplit: as
// TestLostCommitReplyReleasesItsHandoffs, but the resend is refused for its
// content (the database state changed between the writes: here a trigger,
// armed by the lost write's commit, refuses the next outcome write once
// with SQLSTATE 22023), so the recorder isolates the outcome and records
// it again in parts. The lost write's hand-off must still be handed back
// (RELEASED), not left in flight for the reaper; before the fix it was,
// the split forgot that a reply had been lost.
func TestLostCommitReplyReleasesItsHandoffsWhenTheResendIsSplit(t *testing.T) {
	t.Parallel()
	const marker = "cut-the-reply-to-this-write-then-refuse-the-resend"
	l := setupLostReply(t, "split", marker, refuseWritesAfterSQL(marker, "22023", true))
	r := l.start(t, "r-lost-split", nil)
	l.waitBothDispatched(t, r)
	var refused int64
	if err := l.direct.QueryRow(l.b.ctx, `SELECT last_value FROM public.refuse_once`).Scan(&refused); err != nil {
		t.Fatal(err)
	}
	if refused < 1 {
		t.Fatal("the resend was never refused: the test did not take the split path")
	}
	l.wantReleasedOnce(t)
}

// TestLostCommitReplyHandoffsAtAbandonedStopGoToTheReaper: the reply to a
// committed outcome write that handed off is lost, every resend is refused
// (a server error, not one about the outcome's content: the recorder keeps
// trying), and Stop abandons recording (StopRecordTimeout) before one goes
// through. The lost write's hand-off is not handed back: its RELEASED row
// is itself an outcome write, the kind that was not getting through (see
// README, "Relaying"). This test pins what happens instead: Stop returns
// once it abandons recording (the outcome counted LeftInFlight), the
// outcome is archived once, the hand-off stays leased to the stopped
// relayer, never dispatched, and the reaper requeues it after its lease
// (one ZOMBIE_REQUEUE), after which it is dispatched once.
func TestLostCommitReplyHandoffsAtAbandonedStopGoToTheReaper(t *testing.T) {
	t.Parallel()
	const marker = "cut-the-reply-to-this-write-then-stop"
	l := setupLostReply(t, "abandon", marker, refuseWritesAfterSQL(marker, "P0001", false))
	r := l.start(t, "r-lost-stop", nil)
	// The lost write committed (it armed the refusal) and the resends are
	// being refused.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var armed int
		if err := l.direct.QueryRow(l.b.ctx, `SELECT count(*) FROM public.refuse_armed`).Scan(&armed); err != nil {
			t.Fatal(err)
		}
		if armed > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the cut write never committed")
		}
	}
	time.Sleep(100 * time.Millisecond)
	// Stop gives recording StopRecordTimeout, then abandons it.
	ctx, cancel := context.WithTimeout(l.b.ctx, 30*time.Second)
	err := r.Stop(ctx)
	cancel()
	if err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if st := r.Stats(); st.LeftInFlight != 1 {
		t.Fatalf("stats %+v: want the refused outcome counted as left in flight", st)
	}
	if _, err := l.direct.Exec(l.b.ctx, `DELETE FROM public.refuse_armed`); err != nil {
		t.Fatal(err)
	}
	var cut, held, released int
	if err := l.direct.QueryRow(l.b.ctx, `SELECT (SELECT count(*) FROM outbox.attempts WHERE rail_reference = $1),
		(SELECT count(*) FROM outbox.inflight WHERE relayer_id = 'r-lost-stop'),
		(SELECT count(*) FROM outbox.attempts WHERE error_code = 'RELEASED')`, marker).Scan(&cut, &held, &released); err != nil {
		t.Fatal(err)
	}
	if cut != 1 || held != 1 || released != 0 {
		t.Fatalf("%d outcomes of the cut write, %d held in flight, %d released: want 1, 1 and 0", cut, held, released)
	}
	// The reaper requeues it after its lease; another relayer sends it.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		n, err := r.store.Reap(l.b.ctx, l.direct, 100, "test-reaper", 3)
		if err != nil {
			t.Fatal(err)
		}
		if len(n) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the reaper never requeued the hand-off")
		}
	}
	l.b.start(t, l.b.config("r-after-stop"))
	l.b.waitDrained(t, 10*time.Second)
	var zombies int
	if err := l.direct.QueryRow(l.b.ctx, `SELECT count(*) FROM outbox.attempts WHERE state = 'ZOMBIE_REQUEUE'`).Scan(&zombies); err != nil {
		t.Fatal(err)
	}
	if zombies != 1 {
		t.Fatalf("%d zombie requeues, want the hand-off's one", zombies)
	}
	if rep := l.b.verify(t, true); rep.Dispatched != 2 {
		t.Fatalf("report %+v: want 2 dispatched, each once", rep)
	}
}

// TestLostCommitReplyToTheResendToo: the reply to the resend is lost as
// well (the resend committed too: it found the outcome archived). The
// recorder must keep knowing that a reply was lost and, once a resend is
// answered, still hand back the first write's hand-off (RELEASED); the
// look is fenced to the transaction that archived the outcome, the first
// write, so the resends, which hand off nothing, add nothing to it.
func TestLostCommitReplyToTheResendToo(t *testing.T) {
	t.Parallel()
	l := setupLostReply(t, "twice", "cut-the-reply-to-this-write-and-its-resend", "")
	// Once the first write's reply is cut, cut the reply to the resend
	// that reads the archive (only the resend's statement for outcomes
	// already archived names late_outcome_prior, migration 050; before it,
	// archived_attempt). Armed together: armed by
	// the test once it saw the first write committed, the second cut came
	// after the resend on a loaded machine (the resend follows within
	// milliseconds), and the test failed.
	l.proxy.CutRepliesAfter([]byte(l.marker), []byte("late_outcome_prior("))
	var logs lockedBuffer
	r := l.start(t, "r-lost-twice", slog.New(slog.NewTextHandler(&logs, nil)))

	l.waitBothDispatched(t, r)
	// The writer logs how many writes failed once one succeeds.
	failed := 0
	if m := regexp.MustCompile(`record outcomes recovered.* failures=(\d+)`).FindStringSubmatch(logs.String()); m != nil {
		failed, _ = strconv.Atoi(m[1])
	}
	if failed < 2 {
		t.Fatalf("want the first write and its resend failed (their replies cut), logs:\n%s", logs.String())
	}
	l.wantReleasedOnce(t)
}

// refuseWritesAfterSQL arms triggers that refuse the outcome writes (their
// delete from inflight) once the write archiving marker has committed,
// with sqlstate: the next write only if once (a sequence, which a refused
// write does not roll back, counts), else every one. public.refuse_armed
// holds the arming write's transaction id.
func refuseWritesAfterSQL(marker, sqlstate string, once bool) string {
	onlyOnce := ""
	if once {
		onlyOnce = "\n     AND nextval('public.refuse_once') = 1"
	}
	return `
CREATE TABLE public.refuse_armed (xid bigint NOT NULL);
CREATE SEQUENCE public.refuse_once;
CREATE FUNCTION public.arm_refusal() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN INSERT INTO public.refuse_armed VALUES (txid_current()); RETURN NULL; END $$;
CREATE FUNCTION public.refuse_writes() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  -- Armed by a committed write, not the one running.
  IF EXISTS (SELECT 1 FROM public.refuse_armed WHERE xid IS DISTINCT FROM txid_current_if_assigned())` + onlyOnce + ` THEN
    RAISE EXCEPTION 'refused, for the test' USING ERRCODE = '` + sqlstate + `';
  END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER arm_refusal AFTER INSERT ON outbox.attempts FOR EACH ROW
  WHEN (NEW.rail_reference = '` + marker + `') EXECUTE FUNCTION public.arm_refusal();
CREATE TRIGGER refuse_writes BEFORE DELETE ON outbox.inflight FOR EACH STATEMENT
  EXECUTE FUNCTION public.refuse_writes();`
}

// lostReply is the scene of the lost-commit-reply tests: two instructions
// of one participant, a rail that answers the first with the marker as its
// reference (so only the first outcome's write carries it), and a proxy
// between the relayer and the database that cuts the reply to the write
// carrying it.
type lostReply struct {
	b       *testBundle
	direct  *pgxpool.Pool // past the proxy: the test's own statements
	proxied *pgxpool.Pool // through it: the relayer's
	proxy   *testdb.HoldingProxy
	marker  string
}

// setupLostReply sets the scene, its instructions' ids made from prefix;
// prepare (SQL, "" for none) runs first, to arm triggers on the schema.
func setupLostReply(t *testing.T, prefix, marker, prepare string) *lostReply {
	t.Helper()
	direct, proxied, proxy := testdb.NewProxied(t, 8, 0)
	b := setupOn(t, direct, rails.SandboxOptions{})
	if prepare != "" {
		if _, err := direct.Exec(b.ctx, prepare); err != nil {
			t.Fatal(err)
		}
	}
	b.useTransport(t, funcTransport(func(_ context.Context, ins payment.Instruction) (rails.Result, error) {
		ref := "ref-" + ins.IdempotencyKey
		if ins.SequenceID == 1 {
			ref = marker // only the first outcome's write carries it
		}
		return rails.Result{Code: rails.SandboxAccepted, Reference: ref}, nil
	}), time.Second)
	for i := range 2 {
		if _, err := b.producer.Enqueue(b.ctx, direct, instruction(prefix, i)); err != nil {
			t.Fatal(err)
		}
	}
	proxy.CutReplyAfter([]byte(marker))
	return &lostReply{b: b, direct: direct, proxied: proxied, proxy: proxy, marker: marker}
}

// start starts relayer id through the proxy, its leases ending 10 s
// after the rail's timeout (1 s) and no claim but the first (the
// successor comes by hand-off only), logging to logger if not nil; it is
// stopped when the test ends. The leases are short enough that a hand-off
// left for its lease ends within waitBothDispatched's 30 s, and long
// enough for a loaded machine: with a second after the timeout, the first
// claim waited past half its lease for its dispatch, which then handed it
// back RELEASED without calling the rail (its lease would end before the
// rail's timeout: a second RELEASED row), and the recovery from the lost
// reply outlasted the hand-off's lease.
func (l *lostReply) start(t *testing.T, id string, logger *slog.Logger) *Relayer {
	t.Helper()
	cfg := l.b.config(id)
	if logger != nil {
		cfg.Logger = logger
	}
	cfg.LeaseGrace = 10 * time.Second
	cfg.PollInterval = time.Hour
	r, err := New(l.proxied, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(l.b.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = r.Stop(ctx)
	})
	return r
}

// waitBothDispatched waits until r dispatched both instructions, failing
// if a lease ends first (the lost write's hand-off left for the reaper).
func (l *lostReply) waitBothDispatched(t *testing.T, r *Relayer) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); r.Stats().Dispatched < 2; time.Sleep(20 * time.Millisecond) {
		var expired int
		if err := l.direct.QueryRow(l.b.ctx, `SELECT count(*) FROM outbox.inflight WHERE lease_until < now()`).Scan(&expired); err != nil {
			t.Fatal(err)
		}
		if expired > 0 {
			t.Fatalf("stats %+v: the lost write's hand-off sat in flight until its lease ended", r.Stats())
		}
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v: not dispatched", r.Stats())
		}
	}
	l.b.waitDrained(t, 10*time.Second)
}

// wantReleasedOnce checks the archive: the cut write's outcome once, the
// lost write's hand-off handed back once (RELEASED), no zombie, both
// instructions dispatched.
func (l *lostReply) wantReleasedOnce(t *testing.T) {
	t.Helper()
	var cut, released, zombies int
	if err := l.direct.QueryRow(l.b.ctx, `SELECT count(*) FILTER (WHERE rail_reference = $1),
		count(*) FILTER (WHERE error_code = 'RELEASED'), count(*) FILTER (WHERE state = 'ZOMBIE_REQUEUE')
		FROM outbox.attempts`, l.marker).Scan(&cut, &released, &zombies); err != nil {
		t.Fatal(err)
	}
	if cut != 1 || released != 1 || zombies != 0 {
		t.Fatalf("%d outcomes of the cut write, %d hand-offs released, %d zombies: want 1, 1 and 0", cut, released, zombies)
	}
	if rep := l.b.verify(t, true); rep.Dispatched != 2 {
		t.Fatalf("report %+v: want 2 dispatched", rep)
	}
}

// lockedBuffer is a bytes.Buffer the relayer's goroutines may log into
// while a test reads it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}
