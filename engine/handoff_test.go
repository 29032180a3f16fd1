package engine

import (
	"context"
	"testing"
	"time"

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
	direct, proxied, proxy := testdb.NewProxied(t, 8, 0)
	const marker = "cut-the-reply-to-this-write"
	b := setupOn(t, direct, rails.SandboxOptions{})
	b.useTransport(t, funcTransport(func(_ context.Context, ins payment.Instruction) (rails.Result, error) {
		ref := "ref-" + ins.IdempotencyKey
		if ins.SequenceID == 1 {
			ref = marker // only the first outcome's write carries it
		}
		return rails.Result{Code: rails.SandboxAccepted, Reference: ref}, nil
	}), time.Second)
	for i := range 2 {
		if _, err := b.producer.Enqueue(b.ctx, direct, instruction("lost", i)); err != nil {
			t.Fatal(err)
		}
	}
	proxy.CutReplyAfter([]byte(marker))

	cfg := b.config("r-lost-reply")
	cfg.LeaseGrace = time.Second
	cfg.PollInterval = time.Hour // no claim but the first: the successor comes by hand-off
	r, err := New(proxied, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = r.Stop(ctx)
	})

	// Both dispatched, before the successor's lease (2 s) could end: no
	// reaper runs here, so only the relayer itself can move it.
	for deadline := time.Now().Add(30 * time.Second); r.Stats().Dispatched < 2; time.Sleep(20 * time.Millisecond) {
		var expired int
		if err := direct.QueryRow(b.ctx, `SELECT count(*) FROM outbox.inflight WHERE lease_until < now()`).Scan(&expired); err != nil {
			t.Fatal(err)
		}
		if expired > 0 {
			t.Fatalf("stats %+v: the lost write's hand-off sat in flight until its lease ended", r.Stats())
		}
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v: not dispatched", r.Stats())
		}
	}
	b.waitDrained(t, 10*time.Second)
	var cut, released, zombies int
	if err := direct.QueryRow(b.ctx, `SELECT count(*) FILTER (WHERE rail_reference = $1),
		count(*) FILTER (WHERE error_code = 'RELEASED'), count(*) FILTER (WHERE state = 'ZOMBIE_REQUEUE')
		FROM outbox.attempts`, marker).Scan(&cut, &released, &zombies); err != nil {
		t.Fatal(err)
	}
	if cut != 1 || released != 1 || zombies != 0 {
		t.Fatalf("%d outcomes of the cut write, %d hand-offs released, %d zombies: want 1, 1 and 0", cut, released, zombies)
	}
	if rep := b.verify(t, true); rep.Dispatched != 2 {
		t.Fatalf("report %+v: want 2 dispatched", rep)
	}
}
