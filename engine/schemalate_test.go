package engine

import (
	"io"
	"log/slog"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ledgerline/outbox/migrations"
	"github.com/ledgerline/outbox/pending"
	"github.com/ledgerline/outbox/rails"
)

// gate is a TCP forwarder to a database that drops every connection until
// it is opened: a database unreachable for a while.
type gate struct {
	ln     net.Listener
	target string
	open   atomic.Bool
}

func startGate(t *testing.T, target string) *gate {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := &gate{ln: ln, target: target}
	var conns sync.WaitGroup
	accepting := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-accepting; conns.Wait() })
	go func() {
		defer close(accepting)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if !g.open.Load() {
				c.Close()
				continue
			}
			conns.Add(1)
			go func() {
				defer conns.Done()
				defer c.Close()
				s, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer s.Close()
				go func() { _, _ = io.Copy(s, c); s.Close() }()
				_, _ = io.Copy(c, s)
			}()
		}
	}()
	return g
}

// TestRelayerStartedWhileUnreachableWaitsForTheMigration: a relayer checks
// the schema's version before it starts, and refuses one older than its
// build (its statements need it). But a database it cannot reach at start
// is no reason to refuse: it starts and keeps trying, and before the fix
// it then never checked the version at all. A new build's relayer started
// during a database outage, on a schema not migrated yet (a rolling deploy
// that replaced the binaries first), claimed and called the rail with
// statements of a schema that was not there: on one before 039, every
// outcome write failed for want of retry_at after the rail was called,
// and each instruction went back to the rail when its lease ran out. It
// must check the version once the database answers, claim nothing while
// the schema is behind, say so, and start claiming once it is migrated.
func TestRelayerStartedWhileUnreachableWaitsForTheMigration(t *testing.T) {
	t.Parallel()
	b := setup(t, rails.SandboxOptions{})
	const schema = "late"
	if err := migrations.MigrateWith(b.ctx, b.pool, migrations.Options{Schema: schema, TargetVersion: 38}); err != nil {
		t.Fatal(err)
	}
	producer, err := pending.NewProducer(pending.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := producer.Enqueue(b.ctx, b.pool, instruction("late", 1)); err != nil {
		t.Fatal(err)
	}

	u, err := url.Parse(b.pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	g := startGate(t, u.Host)
	pool := poolFor(t, b.pool.Config().ConnString(), func(u *url.URL) { u.Host = g.ln.Addr().String() })
	cfg := b.config("late")
	cfg.Schema, cfg.PollOnly = schema, true
	logs := &recordingHandler{}
	cfg.Logger = slog.New(logs)
	r, err := New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(b.ctx); err != nil {
		t.Fatalf("Start with the database unreachable: %v", err)
	}
	t.Cleanup(func() { _ = r.Stop(b.ctx) })

	g.open.Store(true)
	waitFor(t, 30*time.Second, "the relayer saying the schema is behind", func() bool {
		return logs.count(slog.LevelWarn, "schema check failing") > 0 || b.sandbox.Stats().Calls > 0
	})
	if calls := b.sandbox.Stats().Calls; calls != 0 {
		t.Fatalf("the relayer called the rail %d times on a schema at 038", calls)
	}
	var inflight int
	if err := b.pool.QueryRow(b.ctx, "SELECT count(*) FROM late.inflight").Scan(&inflight); err != nil || inflight != 0 {
		t.Fatalf("%d instructions in flight on a schema at 038 (%v), want none", inflight, err)
	}

	if err := migrations.MigrateWith(b.ctx, b.pool, migrations.Options{Schema: schema}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "the instruction sent once the schema is migrated", func() bool {
		var left int
		if err := b.pool.QueryRow(b.ctx, "SELECT (SELECT count(*) FROM late.pending) + (SELECT count(*) FROM late.inflight)").Scan(&left); err != nil {
			t.Fatal(err)
		}
		return left == 0
	})
	if st := b.sandbox.Stats(); st.Calls != 1 || st.Payments != 1 {
		t.Errorf("sandbox %+v, want one call, one payment", st)
	}
}
