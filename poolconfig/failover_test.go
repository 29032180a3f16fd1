package poolconfig_test

import (
	"context"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/poolconfig"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// silentHost accepts TCP connections and never answers on them, as the
// address of a primary that hangs (or a proxy in front of a dead one)
// does; it is closed when the test ends.
func silentHost(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String()
}

// TestFailoverURLSkipsASilentHost: the failover URL of docs/operations.md
// names both servers, and a connection tries them in turn. When the first
// one is silent (the old primary hangs, or its address black-holes: then
// the kernel gives up on the handshake only after about two minutes),
// every new connection must move on to the second within a bound. Without
// a connect timeout pgx spends the caller's whole context on the first
// host: a relayer's claim (30 s) never got a connection, and a command
// hung until TCP gave up. Before the fix the ping below, with 25 s,
// failed without ever trying the live server.
func TestFailoverURLSkipsASilentHost(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(testdb.AdminURL(t))
	if err != nil {
		t.Fatal(err)
	}
	u.Host = silentHost(t) + "," + u.Host
	for name, s := range map[string]poolconfig.Settings{"relayer": poolconfig.Relayer("r-1"),
		"producer": poolconfig.Producer(), "operator": poolconfig.Operator("stats")} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg, err := pgxpool.ParseConfig(u.String())
			if err != nil {
				t.Fatal(err)
			}
			s.ApplyPool(cfg)
			pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			ctx, cancel := context.WithTimeout(t.Context(), 25*time.Second)
			defer cancel()
			start := time.Now()
			if err := pool.Ping(ctx); err != nil {
				t.Fatalf("ping through %s after %s: %v", u.Redacted(), time.Since(start).Round(time.Millisecond), err)
			}
			t.Logf("connected to the second host after %s", time.Since(start).Round(time.Millisecond))
		})
	}
}

// TestURLConnectTimeoutWins: a connect_timeout in the URL is the
// operator's choice and stays.
func TestURLConnectTimeoutWins(t *testing.T) {
	t.Parallel()
	cfg, err := pgxpool.ParseConfig("postgres://u@db1,db2/db?connect_timeout=3")
	if err != nil {
		t.Fatal(err)
	}
	poolconfig.Relayer("r-1").ApplyPool(cfg)
	if cfg.ConnConfig.ConnectTimeout != 3*time.Second {
		t.Fatalf("connect timeout %s, want the URL's 3s", cfg.ConnConfig.ConnectTimeout)
	}
}
