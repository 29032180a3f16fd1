package engine

import (
	"context"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/attempts"
	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/pending"
	"github.com/ledgerline/outbox/rails"
)

// holdingProxy forwards TCP connections to the database and can
// black-hole the ones open at a moment for good, as a primary that died
// without a word does to the connections it had (its address answers no
// more, and nothing resets them), while connections opened afterwards
// flow (to the new primary). A held connection's bytes are read and
// dropped, so the client's kernel sees them acknowledged: the client
// notices nothing until its own deadline, as with a real black hole
// before TCP gives up (about 15 minutes of retransmissions on Linux).
type holdingProxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	conns  map[*heldConn]struct{}
	closed chan struct{}
	wg     sync.WaitGroup
}

// heldConn is one proxied connection.
type heldConn struct {
	client, server net.Conn
	mu             sync.Mutex
	held           bool
}

func startHoldingProxy(t *testing.T, target string) *holdingProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &holdingProxy{ln: ln, target: target, conns: map[*heldConn]struct{}{}, closed: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *holdingProxy) addr() string { return p.ln.Addr().String() }

// holdExisting black-holes every connection open now, for good.
func (p *holdingProxy) holdExisting() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.mu.Lock()
		c.held = true
		c.mu.Unlock()
	}
	return len(p.conns)
}

func (p *holdingProxy) close() {
	close(p.closed)
	p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.client.Close()
		c.server.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *holdingProxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			client.Close()
			continue
		}
		c := &heldConn{client: client, server: server}
		p.mu.Lock()
		p.conns[c] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(c, server, client)
		go p.pipe(c, client, server)
	}
}

// pipe copies src to dst until either ends or the proxy closes; while c
// is held, what src sends is dropped and nothing reaches dst.
func (p *holdingProxy) pipe(c *heldConn, dst, src net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if err != nil {
			if !c.isHeld() {
				dst.Close()
			}
			return
		}
		if c.isHeld() {
			continue
		}
		if _, err := dst.Write(buf[:n]); err != nil {
			return
		}
	}
}

func (c *heldConn) isHeld() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.held
}

// TestClaimLoopSurvivesBlackHoledConnections: when the connections a
// relayer's pool holds go silent for good (the primary died without
// resetting them; new connections reach the new primary), every
// statement of the claim loop must give up on its connection within the
// relayer's statement deadline, so that the next one opens a fresh
// connection. A statement without a deadline on such a connection hangs
// until TCP gives up, about 15 minutes on Linux, and the claim loop with
// it: nothing is claimed meanwhile. Before the fix the check for suspects
// (store.SuspectsDue, which the claim loop runs four times a second before
// its claim) had no deadline, and the instruction enqueued after the hole
// was never dispatched.
func TestClaimLoopSurvivesBlackHoledConnections(t *testing.T) {
	t.Parallel()
	dbURL := testdb.URL(t)
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	direct, err := pgxpool.New(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(direct.Close)
	proxy := startHoldingProxy(t, u.Host)
	u.Host = proxy.addr()
	cfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 4
	proxied, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxied.Close)
	// Every connection the pool may hold is open (and idle) before the
	// hole, so that the claim loop's next statements all take silent ones
	// (a pool opens a connection only when none is idle).
	var conns []*pgxpool.Conn
	for range cfg.MaxConns {
		c, err := proxied.Acquire(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}

	producer, err := pending.NewProducer(pending.Config{})
	if err != nil {
		t.Fatal(err)
	}
	archive, _ := attempts.New("")
	sbx := rails.NewSandbox(rails.SandboxOptions{Seed: 1})
	set, err := rails.NewSet(rails.Options{Type: "sandbox", Profile: payment.Generic{}, Transport: sbx,
		Timeout: 2 * time.Second, Breaker: rails.BreakerOptions{Disabled: true}})
	if err != nil {
		t.Fatal(err)
	}
	b := &testBundle{ctx: t.Context(), pool: proxied, producer: producer, archive: archive, sandbox: sbx, rails: set}
	rc := b.config("r-hole")
	rc.PollOnly = true
	r, err := New(proxied, rc)
	if err != nil {
		t.Fatal(err)
	}
	const deadline = time.Second
	r.testHooks.statementDeadline = deadline
	if err := r.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = r.Stop(ctx)
	})

	enqueue := func(i int) {
		t.Helper()
		if _, err := producer.Enqueue(b.ctx, direct, instruction("hole", i)); err != nil {
			t.Fatal(err)
		}
	}
	enqueue(0)
	statsOnceDispatched(t, r, 1)
	if n := proxied.Stat().TotalConns(); n != cfg.MaxConns {
		t.Fatalf("the pool has %d connections, want %d", n, cfg.MaxConns)
	}

	held := proxy.holdExisting()
	t.Logf("black-holed %d connections", held)
	// The claim loop runs into the silent connections within a claim or
	// two; then the next instruction arrives.
	time.Sleep(3 * deadline)
	enqueue(1)
	// Each silent connection costs a statement deadline at most, the claim
	// loop's backoff a few seconds more.
	within := 10*deadline + 10*time.Second
	start := time.Now()
	for r.Stats().Dispatched < 2 {
		if time.Since(start) > within {
			t.Fatalf("the instruction enqueued after the black hole was not dispatched within %s: %+v", within, r.Stats())
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("dispatched %s after it was enqueued", time.Since(start).Round(time.Millisecond))
}
