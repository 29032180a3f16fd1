package rails

import (
	"io"
	"net/http"
	"sync"
	"time"
)

// DefaultConnectionMaxAge is how long the built-in webhook client sends new
// requests over the connections it has opened before it opens new ones
// ([WebhookOptions.ConnectionMaxAge]).
const DefaultConnectionMaxAge = time.Minute

// renewingTransport sends each request through an *http.Transport made at
// most maxAge ago. A relayer under steady load never leaves a connection
// idle long enough for IdleConnTimeout to close it, and HTTP/2 carries
// every request over one connection, so without this a rail endpoint moved
// by DNS (a failover to another site, a retired address) was reached at
// its old address until that connection broke: connections are resolved
// and dialled only when opened. A transport past its age takes no new
// request; its connections close as soon as their last answer has been
// read, so a request in flight is never cut.
type renewingTransport struct {
	newTransport func() *http.Transport
	maxAge       time.Duration
	now          func() time.Time

	mu      sync.Mutex
	current *http.Transport
	born    time.Time
	// retired are the transports past their age with answers still open,
	// and how many: each is forgotten when its last answer is read.
	retired map[*http.Transport]int
	open    int // the current transport's open answers
}

func newRenewingTransport(newTransport func() *http.Transport, maxAge time.Duration) *renewingTransport {
	return &renewingTransport{newTransport: newTransport, maxAge: maxAge, now: time.Now,
		retired: make(map[*http.Transport]int)}
}

// RoundTrip sends req through the current transport, made anew once the
// last one has reached its age.
func (r *renewingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	tr := r.begin()
	resp, err := tr.RoundTrip(req)
	if err != nil {
		r.end(tr)
		return resp, err
	}
	resp.Body = &renewingBody{ReadCloser: resp.Body, closed: func() { r.end(tr) }}
	return resp, nil
}

// begin returns the transport for a new request and counts its answer
// open.
func (r *renewingTransport) begin() *http.Transport {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	if r.current == nil || now.Sub(r.born) >= r.maxAge {
		if old := r.current; old != nil {
			// Its idle connections close now, the busy ones as their
			// answers are read (end).
			old.CloseIdleConnections()
			if r.open > 0 {
				r.retired[old] = r.open
			}
		}
		r.current, r.born, r.open = r.newTransport(), now, 0
	}
	r.open++
	return r.current
}

// end counts an answer of tr read (or a request failed). A transport past
// its age then closes its idle connections, the one just used among them.
func (r *renewingTransport) end(tr *http.Transport) {
	r.mu.Lock()
	if tr == r.current {
		r.open--
		r.mu.Unlock()
		return
	}
	if r.retired[tr]--; r.retired[tr] <= 0 {
		delete(r.retired, tr)
	}
	r.mu.Unlock()
	tr.CloseIdleConnections()
}

// CloseIdleConnections closes the idle connections of every transport
// (http.Client.CloseIdleConnections calls it).
func (r *renewingTransport) CloseIdleConnections() {
	r.mu.Lock()
	transports := make([]*http.Transport, 0, len(r.retired)+1)
	for tr := range r.retired {
		transports = append(transports, tr)
	}
	if r.current != nil {
		transports = append(transports, r.current)
	}
	r.mu.Unlock()
	for _, tr := range transports {
		tr.CloseIdleConnections()
	}
}

// renewingBody calls closed after the answer's body is closed, when its
// connection has gone back to its transport's idle pool.
type renewingBody struct {
	io.ReadCloser
	once   sync.Once
	closed func()
}

func (b *renewingBody) Close() error {
	err := b.ReadCloser.Close()
	b.once.Do(b.closed)
	return err
}
