package poolconfig_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/poolconfig"
)

func TestApply(t *testing.T) {
	t.Parallel()
	cfg, err := pgx.ParseConfig("postgres://u@localhost/db")
	if err != nil {
		t.Fatal(err)
	}
	if skipped := poolconfig.Relayer("r-1").Apply(cfg); len(skipped) != 0 {
		t.Fatalf("direct connection skipped %v", skipped)
	}
	want := map[string]string{"application_name": "outbox-relay r-1", "statement_timeout": "30000",
		"lock_timeout": "5000", "idle_in_transaction_session_timeout": "60000"}
	for k, v := range want {
		if cfg.RuntimeParams[k] != v {
			t.Errorf("%s = %q, want %q", k, cfg.RuntimeParams[k], v)
		}
	}
	if cfg.DefaultQueryExecMode != pgx.QueryExecModeCacheStatement {
		t.Errorf("direct connection: exec mode %v changed", cfg.DefaultQueryExecMode)
	}

	// The URL's application_name wins; behind a transaction pooler the
	// timeouts are reported, not sent, and statements are not cached.
	cfg, _ = pgx.ParseConfig("postgres://u@localhost/db?application_name=mine")
	s := poolconfig.Producer()
	s.Pooler = poolconfig.PoolerTransaction
	skipped := s.Apply(cfg)
	if cfg.RuntimeParams["application_name"] != "mine" || cfg.RuntimeParams["statement_timeout"] != "" {
		t.Errorf("params %v", cfg.RuntimeParams)
	}
	if !slices.Equal(skipped, []string{"statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout"}) {
		t.Errorf("skipped %v", skipped)
	}
	if cfg.DefaultQueryExecMode != pgx.QueryExecModeExec || cfg.StatementCacheCapacity != 0 {
		t.Errorf("behind a pooler: exec mode %v, statement cache %d", cfg.DefaultQueryExecMode, cfg.StatementCacheCapacity)
	}

	// Names are cut to PostgreSQL's 63 bytes on a rune boundary.
	cfg, _ = pgx.ParseConfig("postgres://u@localhost/db")
	poolconfig.Settings{ApplicationName: strings.Repeat("é", 40)}.Apply(cfg)
	if n := cfg.RuntimeParams["application_name"]; len(n) > 63 || !strings.HasPrefix(strings.Repeat("é", 40), n) {
		t.Errorf("application_name %q (%d bytes)", n, len(n))
	}
	if _, err := poolconfig.ParsePooler("session"); err == nil {
		t.Error("unknown pooler accepted")
	}
}

// TestApplyRoundsTimeoutsUp guards against a positive timeout being sent
// as 0, which PostgreSQL reads as no timeout at all: --lock-timeout 500us
// must stay a bound. Durations are rounded up to whole milliseconds, so no
// bound becomes shorter than asked either.
func TestApplyRoundsTimeoutsUp(t *testing.T) {
	t.Parallel()
	cfg, err := pgx.ParseConfig("postgres://u@localhost/db")
	if err != nil {
		t.Fatal(err)
	}
	poolconfig.Settings{LockTimeout: 500 * time.Microsecond, StatementTimeout: 1500 * time.Microsecond,
		IdleInTransactionTimeout: 2 * time.Second}.Apply(cfg)
	want := map[string]string{"lock_timeout": "1", "statement_timeout": "2", "idle_in_transaction_session_timeout": "2000"}
	for k, v := range want {
		if cfg.RuntimeParams[k] != v {
			t.Errorf("%s = %q, want %q", k, cfg.RuntimeParams[k], v)
		}
	}
}

// A producer service's pool behind PgBouncer in transaction mode.
func ExampleSettings_ApplyPool() {
	cfg, err := pgxpool.ParseConfig("postgres://payments@pgbouncer:6432/payments")
	if err != nil {
		panic(err)
	}
	s := poolconfig.Producer()
	s.Pooler = poolconfig.PoolerTransaction
	s.StatementTimeout = 5 * time.Second
	notApplied := s.ApplyPool(cfg) // then pgxpool.NewWithConfig(ctx, cfg)
	fmt.Println(cfg.ConnConfig.RuntimeParams["application_name"], cfg.ConnConfig.DefaultQueryExecMode)
	fmt.Println("set on the role instead:", notApplied)
	// Output:
	// outbox-producer exec
	// set on the role instead: [statement_timeout lock_timeout idle_in_transaction_session_timeout]
}

// TestValidateTakesWhatTheServerTakes: Validate's bound is PostgreSQL's:
// a statement timeout of MaxTimeout connects, one a millisecond longer is
// refused by the server at connect (so Validate refuses it first), and a
// negative one, which Apply would drop without a word, is refused too.
func TestValidateTakesWhatTheServerTakes(t *testing.T) {
	t.Parallel()
	url := testdb.URL(t)
	for _, c := range []struct {
		d      time.Duration
		server bool // the server accepts it
	}{
		{poolconfig.MaxTimeout, true},
		{poolconfig.MaxTimeout + time.Millisecond, false},
	} {
		cfg, err := pgx.ParseConfig(url)
		if err != nil {
			t.Fatal(err)
		}
		s := poolconfig.Settings{StatementTimeout: c.d}
		s.Apply(cfg)
		conn, err := pgx.ConnectConfig(t.Context(), cfg)
		if err == nil {
			conn.Close(t.Context())
		}
		if (err == nil) != c.server {
			t.Fatalf("statement timeout %v: connect = %v, want the server to accept it: %v", c.d, err, c.server)
		}
		if verr := s.Validate(); (verr == nil) != c.server || (verr != nil && !errors.Is(verr, poolconfig.ErrInvalidSettings)) {
			t.Errorf("statement timeout %v: Validate = %v, want ErrInvalidSettings exactly when the server refuses it", c.d, verr)
		}
	}
	for _, s := range []poolconfig.Settings{{StatementTimeout: -time.Second}, {LockTimeout: -time.Millisecond},
		{IdleInTransactionTimeout: -time.Minute}, {ConnectTimeout: -time.Second}} {
		if err := s.Validate(); !errors.Is(err, poolconfig.ErrInvalidSettings) {
			t.Errorf("%+v: Validate = %v, want ErrInvalidSettings", s, err)
		}
	}
	if err := poolconfig.Relayer("r-1").Validate(); err != nil {
		t.Errorf("the relayer's defaults: Validate = %v", err)
	}
}
