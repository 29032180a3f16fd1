package testdb

import (
	"bytes"
	"context"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// HoldingProxy forwards TCP connections to the database and can
// black-hole the ones open at a moment for good, as a primary that died
// without a word does to the connections it had (its address answers no
// more, and nothing resets them), while connections opened afterwards
// flow (to the new primary). A held connection's bytes are read and
// dropped, so the client's kernel sees them acknowledged: the client
// notices nothing until its own deadline, as with a real black hole
// before TCP gives up (about 15 minutes of retransmissions on Linux).
type HoldingProxy struct {
	ln     net.Listener
	target string

	mu        sync.Mutex
	conns     map[*heldConn]struct{}
	closed    chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup
	// lastActive is when bytes last passed either way (Unix nanoseconds).
	lastActive atomic.Int64
	// cutAfter, if not empty, arms CutReplyAfter (CutRepliesAfter): the
	// next client message holding cutAfter[0] makes its connection's reply
	// the one that is cut, and arms the next marker.
	cutAfter [][]byte
	// refuseFor (RefuseAfterCut) is how long, from the armed cut on, the
	// proxy refuses new connections; refuseUntil is when that ends.
	refuseFor   time.Duration
	refuseUntil time.Time
	// seen, if not empty (CutReplyAfterSeen), holds the cut back until a
	// client message holds it; seenBy is the connection that sent it, the
	// only one the cut then lands on.
	seen   []byte
	seenBy *heldConn
}

// heldConn is one proxied connection.
type heldConn struct {
	client, server net.Conn
	mu             sync.Mutex
	held           bool
	cut            bool // the next reply is dropped and the connection closed
	awaiting       bool // the client spoke last: a reply is due
}

// StartHoldingProxy listens on a free loopback port and forwards to
// target; it is closed when the test ends.
func StartHoldingProxy(t TB, target string) *HoldingProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testdb: proxy: %v", err)
	}
	p := &HoldingProxy{ln: ln, target: target, conns: map[*heldConn]struct{}{}, closed: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// NewProxied makes a fresh test database (URL) and two pools of it:
// direct, and proxied, of maxConns connections through a HoldingProxy,
// with open of them opened and left idle, so that the next statements on
// proxied take connections the proxy can hold (a pool opens a connection
// only when none is idle). Both pools close when the test ends.
func NewProxied(t TB, maxConns int32, open int) (direct, proxied *pgxpool.Pool, proxy *HoldingProxy) {
	t.Helper()
	ctx := context.Background()
	dbURL := URL(t)
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	if direct, err = pgxpool.New(ctx, dbURL); err != nil {
		t.Fatalf("testdb: %v", err)
	}
	t.Cleanup(direct.Close)
	proxy = StartHoldingProxy(t, u.Host)
	u.Host = proxy.Addr()
	cfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		t.Fatalf("testdb: %v", err)
	}
	cfg.MaxConns = maxConns
	if proxied, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		t.Fatalf("testdb: %v", err)
	}
	t.Cleanup(proxied.Close)
	// The proxy closes before the pool does: a pool's Close waits for its
	// connections, and one the proxy holds would answer only to TCP's own
	// give-up (each of them costing the test up to pgxpool's 15 s).
	t.Cleanup(proxy.close)
	var conns []*pgxpool.Conn
	for range open {
		c, err := proxied.Acquire(ctx)
		if err != nil {
			t.Fatalf("testdb: %v", err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
	return direct, proxied, proxy
}

// CutReplyAfter arms a cut, once: on the first connection whose client
// sends bytes holding marker, the server's next reply is dropped and both
// sockets are closed, as when a connection breaks after the server acted
// on a request (committed a transaction) and before its answer arrived.
func (p *HoldingProxy) CutReplyAfter(marker []byte) { p.CutRepliesAfter(marker) }

// CutRepliesAfter arms cuts one after the other: a cut as CutReplyAfter's
// for markers[0], and once it has cut, one for markers[1], and so on.
// Armed together, a later cut cannot miss the message it is for (the
// resend that follows a cut reply at once), as a cut armed by the test
// after the first one could.
func (p *HoldingProxy) CutRepliesAfter(markers ...[]byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cutAfter = markers
}

// CutReplyAfterSeen is CutReplyAfter(marker) for a message after one
// holding seen, on the connection that sent that one: a cut of the commit
// of one transaction (its statement named by seen) when others commit
// before it.
func (p *HoldingProxy) CutReplyAfterSeen(seen, marker []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cutAfter, p.seen, p.seenBy = [][]byte{marker}, seen, nil
}

// RefuseAfterCut makes the next armed cut (CutReplyAfter) also refuse
// every connection opened within d of it: each is closed as soon as it is
// accepted, as a crashed primary's address refuses connections until its
// standby is promoted. Connections open before the cut are not touched.
func (p *HoldingProxy) RefuseAfterCut(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refuseFor = d
}

// refusing reports whether a connection accepted now is to be refused.
func (p *HoldingProxy) refusing() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return time.Now().Before(p.refuseUntil)
}

// Addr is the proxy's host:port.
func (p *HoldingProxy) Addr() string { return p.ln.Addr().String() }

// QuietFor reports whether nothing has passed through the proxy for d and
// no connection waits for a reply (its client spoke last): a program whose
// statements go through it is between them, none in flight.
func (p *HoldingProxy) QuietFor(d time.Duration) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.mu.Lock()
		awaiting := c.awaiting
		c.mu.Unlock()
		if awaiting {
			return false
		}
	}
	return time.Since(time.Unix(0, p.lastActive.Load())) >= d
}

// HoldExisting black-holes every connection open now, for good, and
// returns how many there were.
func (p *HoldingProxy) HoldExisting() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.mu.Lock()
		c.held = true
		c.mu.Unlock()
	}
	return len(p.conns)
}

// close ends every connection and the listener; a second call does
// nothing.
func (p *HoldingProxy) close() {
	p.closeOnce.Do(p.closeNow)
}

func (p *HoldingProxy) closeNow() {
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

func (p *HoldingProxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		if p.refusing() {
			client.Close()
			continue
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
func (p *HoldingProxy) pipe(c *heldConn, dst, src net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 || err != nil {
			p.lastActive.Store(time.Now().UnixNano())
			c.mu.Lock()
			c.awaiting = err == nil && src == c.client
			c.mu.Unlock()
		}
		if err != nil {
			if !c.isHeld() {
				dst.Close()
			}
			return
		}
		if c.isHeld() {
			continue
		}
		if src == c.server && c.cutNow() {
			c.client.Close()
			c.server.Close()
			return
		}
		if src == c.client {
			p.armCut(c, buf[:n])
		}
		if _, err := dst.Write(buf[:n]); err != nil {
			return
		}
	}
}

// armCut marks c's next reply for the cut when data holds the armed
// marker (CutReplyAfter), and disarms it.
func (p *HoldingProxy) armCut(c *heldConn, data []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.cutAfter) == 0 {
		return
	}
	if len(p.seen) > 0 {
		if bytes.Contains(data, p.seen) {
			p.seen, p.seenBy = nil, c
		}
		return
	}
	if p.seenBy != nil && p.seenBy != c || !bytes.Contains(data, p.cutAfter[0]) {
		return
	}
	p.seenBy = nil
	p.cutAfter = p.cutAfter[1:]
	if p.refuseFor > 0 {
		p.refuseUntil, p.refuseFor = time.Now().Add(p.refuseFor), 0
	}
	c.mu.Lock()
	c.cut = true
	c.mu.Unlock()
}

// cutNow reports whether c's reply is to be cut.
func (c *heldConn) cutNow() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cut
}

func (c *heldConn) isHeld() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.held
}
