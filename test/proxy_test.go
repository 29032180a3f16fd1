package test

import (
	"net"
	"sync"
	"testing"
	"time"
)

// blackHoleProxy forwards TCP connections to a target (the database) and
// can black-hole them: while held, no byte is copied in either direction,
// but every socket stays open, as with a network partition that drops
// packets silently. Bytes read just before the hold are delivered after it,
// late, exactly like retransmissions after a partition heals.
type blackHoleProxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	cond   *sync.Cond
	held   bool
	closed bool
	conns  map[net.Conn]struct{}

	wg sync.WaitGroup
}

// startProxy listens on a free loopback port; it is closed when the test
// ends.
func startProxy(t *testing.T, target string) *blackHoleProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &blackHoleProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.acceptLoop()
	t.Cleanup(p.close)
	return p
}

// addr is the proxy's host:port.
func (p *blackHoleProxy) addr() string { return p.ln.Addr().String() }

// blackHole stops all traffic until resume.
func (p *blackHoleProxy) blackHole() {
	p.mu.Lock()
	p.held = true
	p.mu.Unlock()
}

// resume lets the traffic flow again.
func (p *blackHoleProxy) resume() {
	p.mu.Lock()
	p.held = false
	p.cond.Broadcast()
	p.mu.Unlock()
}

func (p *blackHoleProxy) close() {
	p.mu.Lock()
	p.closed = true
	p.cond.Broadcast()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.ln.Close()
	p.wg.Wait()
}

func (p *blackHoleProxy) acceptLoop() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		p.wg.Add(1)
		go p.serve(client)
	}
}

// track registers open sockets so close can shut them; false if the proxy
// is already closed.
func (p *blackHoleProxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		if p.closed {
			c.Close()
			continue
		}
		p.conns[c] = struct{}{}
	}
	return !p.closed
}

func (p *blackHoleProxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.conns, c)
	}
}

func (p *blackHoleProxy) serve(client net.Conn) {
	defer p.wg.Done()
	server, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		client.Close()
		return
	}
	if !p.track(client, server) {
		return
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.pipe(server, client) }()
	go func() { defer wg.Done(); p.pipe(client, server) }()
	wg.Wait()
	p.untrack(client, server)
}

// pipe copies src to dst, waiting out holds between a read and its write.
// When either side ends, both sockets are closed, which ends the other
// direction too.
func (p *blackHoleProxy) pipe(dst, src net.Conn) {
	defer func() {
		dst.Close()
		src.Close()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.waitOpen() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// waitOpen blocks while the proxy is held; false once it is closed.
func (p *blackHoleProxy) waitOpen() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.held && !p.closed {
		p.cond.Wait()
	}
	return !p.closed
}
