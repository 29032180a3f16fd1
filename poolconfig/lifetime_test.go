package poolconfig_test

import (
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/poolconfig"
)

// After a database restart or a failover, a relayer opens its connections
// within a moment of each other, and pgxpool closes a connection once it
// reaches its lifetime (an hour by default) at its next acquire or
// release. Without jitter, every connection made together then reached its
// lifetime together, an hour later and every hour after that: each
// relayer of the fleet reconnected all of its connections in the same
// instant (a fork and an authentication each, on the primary), and the
// statements waiting for them waited for the connects. With the jitter
// ApplyPool sets, their lifetimes differ by up to a quarter of it, so
// they are renewed apart. The lifetime is cut to eight seconds here (the
// jitter scales with it; pgxpool draws it in whole seconds, so two here).
func TestConnectionsMadeTogetherAreRenewedApart(t *testing.T) {
	t.Parallel()
	const n = 20
	const lifetime = 8 * time.Second
	cfg, err := pgxpool.ParseConfig(testdb.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = n
	cfg.MaxConnLifetime = lifetime
	poolconfig.Relayer("lifetime-test").ApplyPool(cfg)
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	// n connections opened at once, as after a restart.
	made := map[uint32]time.Time{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	conns := make(chan *pgxpool.Conn, n)
	for range n {
		wg.Go(func() {
			c, err := pool.Acquire(t.Context())
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			made[c.Conn().PgConn().PID()] = time.Now()
			mu.Unlock()
			conns <- c
		})
	}
	wg.Wait()
	close(conns)
	for c := range conns {
		c.Release()
	}
	if t.Failed() || len(made) != n {
		t.Fatalf("opened %d connections, want %d", len(made), n)
	}

	// A busy relayer: every connection is used and released again and
	// again; each is closed at the first release past its lifetime.
	gone := map[uint32]time.Duration{}
	for deadline := time.Now().Add(2 * lifetime); len(gone) < n && time.Now().Before(deadline); {
		alive := map[uint32]bool{}
		for _, c := range pool.AcquireAllIdle(t.Context()) {
			alive[c.Conn().PgConn().PID()] = true
			c.Release()
		}
		now := time.Now()
		for pid, at := range made {
			if _, ok := gone[pid]; !ok && !alive[pid] {
				gone[pid] = now.Sub(at)
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	if len(gone) < n {
		t.Fatalf("%d of %d connections renewed within %s", len(gone), n, 2*lifetime)
	}
	shortest, longest := time.Duration(1<<62), time.Duration(0)
	for _, d := range gone {
		shortest, longest = min(shortest, d), max(longest, d)
	}
	// Each draws 0 or 1 s of jitter: their lifetimes span a second but
	// for a chance of 2^-19 that all drew the same.
	if longest-shortest < 500*time.Millisecond {
		t.Errorf("connections opened together lived %s to %s: renewed together (no jitter on their lifetime)", shortest, longest)
	}
	t.Logf("connections opened together lived %s to %s (lifetime %s)", shortest, longest, lifetime)
}

// A jitter the URL sets is the operator's choice and stays.
func TestURLLifetimeJitterWins(t *testing.T) {
	t.Parallel()
	cfg, err := pgxpool.ParseConfig("postgres://u@db1/db?pool_max_conn_lifetime=2h&pool_max_conn_lifetime_jitter=7s")
	if err != nil {
		t.Fatal(err)
	}
	poolconfig.Relayer("r-1").ApplyPool(cfg)
	if cfg.MaxConnLifetimeJitter != 7*time.Second {
		t.Fatalf("lifetime jitter %s, want the URL's 7s", cfg.MaxConnLifetimeJitter)
	}
	cfg, err = pgxpool.ParseConfig("postgres://u@db1/db?pool_max_conn_lifetime=2h")
	if err != nil {
		t.Fatal(err)
	}
	poolconfig.Relayer("r-1").ApplyPool(cfg)
	if cfg.MaxConnLifetimeJitter != 30*time.Minute {
		t.Fatalf("lifetime jitter %s, want a quarter of the URL's 2h lifetime", cfg.MaxConnLifetimeJitter)
	}
}
