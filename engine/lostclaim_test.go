package engine

import (
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/pending"
	"github.com/ledgerline/outbox/rails"
)

// lostClaimScene is the scene of the lost-claim-reply tests: a relayer
// whose connections go through a proxy that cuts the reply to the first
// message holding the relayer's id once armed, a rail that holds the
// calls of participant "held" until release is closed, and leases of 25
// s (a 20 s rail timeout, which the held call must not reach on a loaded
// machine, and 5 s grace) that no reaper ends: only the relayer
// itself can move what it claimed before then.
type lostClaimScene struct {
	b       *testBundle
	direct  *pgxpool.Pool
	proxy   *testdb.HoldingProxy
	r       *Relayer
	id      string
	release chan struct{}

	logs lockedBuffer // the relayer's log

	mu    sync.Mutex
	calls map[string]int // rail calls by idempotency key
}

func setupLostClaim(t *testing.T, id string) *lostClaimScene {
	t.Helper()
	direct, proxied, proxy := testdb.NewProxied(t, 8, 0)
	s := &lostClaimScene{b: setupOn(t, direct, rails.SandboxOptions{}), direct: direct, proxy: proxy, id: id,
		release: make(chan struct{}), calls: map[string]int{}}
	s.b.useTransport(t, funcTransport(func(ctx context.Context, ins payment.Instruction) (rails.Result, error) {
		s.mu.Lock()
		s.calls[ins.IdempotencyKey]++
		s.mu.Unlock()
		if ins.ParticipantID == "held" {
			select {
			case <-s.release:
			case <-ctx.Done():
				return rails.Result{}, ctx.Err()
			}
		}
		return rails.Result{Code: rails.SandboxAccepted, Reference: "ref-" + ins.IdempotencyKey}, nil
	}), 20*time.Second)
	cfg := s.b.config(id)
	cfg.LeaseGrace = 5 * time.Second
	// Claims come only after a notification or work, or every 5 s (the
	// longest refresh of an idle registration): the test arms the cut
	// and enqueues within a moment of the relayer going quiet, so the
	// claim the notification prompts is the next to send its id.
	cfg.PollInterval, cfg.IdleRefresh = time.Hour, 5*time.Second
	cfg.Logger = slog.New(slog.NewTextHandler(&s.logs, nil))
	r, err := New(proxied, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(s.b.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = r.Stop(ctx)
	})
	s.r = r
	return s
}

// enqueue enqueues one instruction for each participant, in one
// transaction (one notification).
func (s *lostClaimScene) enqueue(t *testing.T, participants ...string) {
	t.Helper()
	batch := make([]pending.Instruction, len(participants))
	for i, p := range participants {
		batch[i] = instruction(p, 0)
	}
	if err := pgx.BeginFunc(s.b.ctx, s.direct, func(tx pgx.Tx) error {
		_, err := s.b.producer.EnqueueBatch(s.b.ctx, tx, batch)
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

// settle waits until the relayer is registered idle and sends nothing:
// the next message with its id is the claim a notification prompts.
func (s *lostClaimScene) settle(t *testing.T) {
	t.Helper()
	s.b.waitRegisteredIdle(t, s.id)
	for deadline := time.Now().Add(30 * time.Second); !s.proxy.QuietFor(200 * time.Millisecond); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the relayer's connections never went quiet")
		}
	}
}

// waitDispatched waits until n instructions are dispatched, failing if a
// lease ends first (what the relayer claimed sat in flight until then).
func (s *lostClaimScene) waitDispatched(t *testing.T, n int64) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); s.r.Stats().Dispatched < n; time.Sleep(20 * time.Millisecond) {
		var expired int
		if err := s.direct.QueryRow(s.b.ctx, `SELECT count(*) FROM outbox.inflight WHERE lease_until < now()`).Scan(&expired); err != nil {
			t.Fatal(err)
		}
		if expired > 0 {
			t.Fatalf("stats %+v: a claim sat in flight until its lease ended", s.r.Stats())
		}
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v: not dispatched", s.r.Stats())
		}
	}
}

// counts are the archive's RELEASED rows and zombie requeues.
func (s *lostClaimScene) counts(t *testing.T) (released, zombies int) {
	t.Helper()
	if err := s.direct.QueryRow(s.b.ctx, `SELECT count(*) FILTER (WHERE error_code = 'RELEASED'),
		count(*) FILTER (WHERE state = 'ZOMBIE_REQUEUE') FROM outbox.attempts`).Scan(&released, &zombies); err != nil {
		t.Fatal(err)
	}
	return released, zombies
}

// eachSentOnce checks that the rail was called once for each instruction
// and that audit verify passes with dispatched instructions dispatched.
func (s *lostClaimScene) eachSentOnce(t *testing.T, dispatched int64) {
	t.Helper()
	s.mu.Lock()
	for key, n := range s.calls {
		if n != 1 {
			t.Errorf("%s sent %d times, want once", key, n)
		}
	}
	s.mu.Unlock()
	if rep := s.b.verify(t, true); rep.Dispatched != dispatched {
		t.Fatalf("report %+v: want %d dispatched", rep, dispatched)
	}
}

// TestLostClaimReplyReleasesItsClaims: a claim commits and its reply is
// lost (the connection breaks after the commit). What it claimed is in
// flight under the relayer's id, which never learned of it: before the
// fix it sat there until its lease ended and the reaper requeued it as a
// zombie (and, with ordering on, its participant's queue waited behind
// it). Now the relayer's next claim first finds it and hands it back
// RELEASED, and it is claimed again and dispatched, once, well before
// the lease ends; the instruction the relayer dispatched before is left
// alone.
func TestLostClaimReplyReleasesItsClaims(t *testing.T) {
	t.Parallel()
	s := setupLostClaim(t, "r-lost-claim")
	s.enqueue(t, "first")
	s.waitDispatched(t, 1)
	// The cut is for the first message with the relayer's id after it is
	// armed: the claim the notification prompts, unless the idle
	// registration's refresh (every 5 s) comes in the moment between
	// arming and enqueueing. Then that refresh is cut instead, the claim
	// goes through, and the scene is played again with two more. A cut
	// claim is told by what it claimed, handed back RELEASED, not by the
	// log: the claim the idle registration makes (goIdle) fails as "idle
	// registration failing", logged once while it keeps failing alike, and
	// the test took such a cut claim for a refresh and played on.
	dispatched := int64(1)
	for try := 0; ; try++ {
		s.settle(t)
		s.proxy.CutReplyAfter([]byte(s.id))
		s.enqueue(t, fmt.Sprintf("pa%d", try), fmt.Sprintf("pb%d", try))
		dispatched += 2
		s.waitDispatched(t, dispatched)
		s.b.waitDrained(t, 10*time.Second)
		if released, _ := s.counts(t); released > 0 {
			break
		}
		if try == 2 {
			t.Fatalf("three cuts, none of them a claim's; logs:\n%s", s.logs.String())
		}
	}
	if released, zombies := s.counts(t); released != 2 || zombies != 0 {
		t.Fatalf("%d RELEASED rows and %d zombie requeues: want the lost claim's 2 released and no zombie", released, zombies)
	}
	s.eachSentOnce(t, dispatched)
}

// TestLostClaimReplyOfAClaimThatDidNotCommit: the reply of a claim that
// the database refused (rolled back) is lost; the relayer cannot tell it
// from a commit, so it looks, and must find nothing: not the instruction
// it claimed before and is dispatching still (its rail call held), which
// is in flight under its id too. That one ends with its own outcome, no
// RELEASED row anywhere.
func TestLostClaimReplyOfAClaimThatDidNotCommit(t *testing.T) {
	t.Parallel()
	s := setupLostClaim(t, "r-lost-uncommitted")
	s.enqueue(t, "held") // its call waits for release
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		s.mu.Lock()
		n := len(s.calls)
		s.mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the held instruction was never sent")
		}
	}
	s.settle(t)
	if _, err := s.direct.Exec(s.b.ctx, `
CREATE FUNCTION public.refuse_claim() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'refused' USING ERRCODE = 'P0001';
END $$;
CREATE TRIGGER refuse_claim BEFORE INSERT ON outbox.inflight FOR EACH ROW
  WHEN (NEW.participant_id = 'refused') EXECUTE FUNCTION public.refuse_claim();`); err != nil {
		t.Fatal(err)
	}
	s.proxy.CutReplyAfter([]byte(s.id))
	s.enqueue(t, "refused")
	// The cut claim's error, then the look, then a claim the trigger
	// refuses with the server's answer: the look has been made.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if err := s.r.Health().ClaimError; err != nil && strings.Contains(err.Error(), "refused") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("health %+v: no claim refused by the trigger", s.r.Health())
		}
	}
	// The cut landed on that claim: the claim loop's first failure was
	// the broken connection, not the trigger's refusal.
	if !regexp.MustCompile(`msg="claim failing; retrying with backoff[^\n]*unexpected EOF`).MatchString(s.logs.String()) {
		t.Fatalf("no claim failed on the cut connection; logs:\n%s", s.logs.String())
	}
	if strings.Contains(s.logs.String(), "before this run heard of any claim") {
		t.Fatalf("the relayer did not look (it had heard of the held claim); logs:\n%s", s.logs.String())
	}
	if _, err := s.direct.Exec(s.b.ctx, `DROP TRIGGER refuse_claim ON outbox.inflight`); err != nil {
		t.Fatal(err)
	}
	close(s.release)
	s.waitDispatched(t, 2)
	s.b.waitDrained(t, 10*time.Second)
	if released, zombies := s.counts(t); released != 0 || zombies != 0 {
		t.Fatalf("%d RELEASED rows and %d zombie requeues: want none", released, zombies)
	}
	s.eachSentOnce(t, 2)
}
