package admin_test

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/admin"
	"github.com/ledgerline/outbox/engine"
	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/pending"
	"github.com/ledgerline/outbox/rails"
)

// TestReadinessWhileTheRelayersConnectionsAreRefused: the admin address
// has a connection of its own (--admin-database-url, another role), and
// the database refuses the relayer's role any new connection (its
// CONNECTION LIMIT reached: SQLSTATE 53300, as for max_connections). The
// relayer's LISTEN connection stays up and the admin's pool answers, so
// before the fix /readyz said ready while every claim of the relayer
// failed; now its relayer check fails, saying its claims fail, until a
// claim succeeds again.
func TestReadinessWhileTheRelayersConnectionsAreRefused(t *testing.T) {
	t.Parallel()
	lr := startLimitedRelayer(t, engine.Config{PollInterval: 50 * time.Millisecond}, rails.SandboxOptions{})
	lr.waitFor(t, "ready before the limit", func(rd admin.Readiness) bool { return rd.Status == "ready" })
	lr.refuse(t)
	lr.wantRelayerCause(t, "claims fail")
	if !lr.r.Health().Listening {
		t.Errorf("the LISTEN connection went down too: the test no longer shows what it means to")
	}
	lr.allow(t)
	lr.waitFor(t, "ready once connections are allowed again", func(rd admin.Readiness) bool { return rd.Status == "ready" })
}

// TestReadinessWhileOutcomesCannotBeWritten: the relayer holds one slot,
// whose dispatch is under way when the database starts refusing its
// role's connections. Its outcome cannot be written, and with every slot
// held the claim loop claims nothing, so no claim fails: before the fix
// /readyz said ready all along; now its relayer check fails, saying its
// outcome writes fail, and the outcome is written once connections are
// allowed again.
func TestReadinessWhileOutcomesCannotBeWritten(t *testing.T) {
	t.Parallel()
	lr := startLimitedRelayer(t, engine.Config{PollInterval: 50 * time.Millisecond, MaxConcurrency: 1},
		rails.SandboxOptions{LatencyMin: 2 * time.Second, LatencyMax: 2 * time.Second})
	lr.waitFor(t, "ready before the limit", func(rd admin.Readiness) bool { return rd.Status == "ready" })
	if _, err := pending.Enqueue(t.Context(), lr.own, pending.Instruction{InstructionID: "i-1", ParticipantID: "p-1",
		IdempotencyKey: "k-1", RailType: "sandbox", AmountMinor: 100, Currency: "USD", Destination: "acct-1"}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); lr.r.Stats().Claimed == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the instruction was not claimed")
		}
	}
	lr.refuse(t)
	lr.wantRelayerCause(t, "outcome writes fail")
	if st := lr.r.Stats(); st.Dispatched != 0 {
		t.Fatalf("stats %+v: the outcome was written while connections were refused", st)
	}
	lr.allow(t)
	lr.waitFor(t, "ready once connections are allowed again", func(rd admin.Readiness) bool { return rd.Status == "ready" })
	for deadline := time.Now().Add(10 * time.Second); lr.r.Stats().Dispatched != 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v: the outcome was not written once connections were allowed", lr.r.Stats())
		}
	}
}

// limitedRelayer is a relayer whose pool logs in as a role of its own,
// whose CONNECTION LIMIT the test sets, and an admin server on another
// pool (the database's owner), as with --admin-database-url.
type limitedRelayer struct {
	r          *engine.Relayer
	srv        *admin.Server
	own, super *pgxpool.Pool
	role       string
}

func startLimitedRelayer(t *testing.T, cfg engine.Config, opts rails.SandboxOptions) *limitedRelayer {
	t.Helper()
	ctx := t.Context()
	dbURL := testdb.URL(t)
	own, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(own.Close)
	super, err := pgxpool.New(ctx, testdb.AdminURL(t)) // the database's owner may not create roles
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(super.Close)
	var owner string
	if err := own.QueryRow(ctx, "SELECT current_user").Scan(&owner); err != nil {
		t.Fatal(err)
	}
	role := fmt.Sprintf("limited_relayer_%d", time.Now().UnixNano())
	if _, err := super.Exec(ctx, "CREATE ROLE "+role+" LOGIN IN ROLE "+owner); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = super.Exec(context.Background(), "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", role)
		_, _ = super.Exec(context.Background(), "DROP ROLE IF EXISTS "+role)
	})
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	pcfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		t.Fatal(err)
	}
	pcfg.ConnConfig.RuntimeParams["application_name"] = role
	relayerPool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(relayerPool.Close)
	set, err := rails.NewSet(rails.Options{Type: "sandbox", Profile: payment.Generic{}, Transport: rails.NewSandbox(opts)})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Rails = set
	r, err := engine.New(relayerPool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = r.Stop(sctx)
	})
	srv, err := admin.New(admin.Config{Pool: own, Relayer: r})
	if err != nil {
		t.Fatal(err)
	}
	return &limitedRelayer{r: r, srv: srv, own: own, super: super, role: role}
}

// refuse refuses the role any new connection and ends its pool's; its
// LISTEN connection (named "... listen") is left up.
func (lr *limitedRelayer) refuse(t *testing.T) {
	t.Helper()
	if _, err := lr.super.Exec(t.Context(), "ALTER ROLE "+lr.role+" CONNECTION LIMIT 0"); err != nil {
		t.Fatal(err)
	}
	if _, err := lr.super.Exec(t.Context(), "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1 AND application_name = $1",
		lr.role); err != nil {
		t.Fatal(err)
	}
}

// allow lifts the role's connection limit.
func (lr *limitedRelayer) allow(t *testing.T) {
	t.Helper()
	if _, err := lr.super.Exec(t.Context(), "ALTER ROLE "+lr.role+" CONNECTION LIMIT -1"); err != nil {
		t.Fatal(err)
	}
}

// waitFor waits up to 10 s for a readiness ok accepts.
func (lr *limitedRelayer) waitFor(t *testing.T, what string, ok func(admin.Readiness) bool) admin.Readiness {
	t.Helper()
	var rd admin.Readiness
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if rd = lr.srv.Readiness(t.Context()); ok(rd) {
			return rd
		}
		if time.Now().After(deadline) {
			t.Fatalf("readiness %+v: want %s", rd, what)
		}
	}
}

// wantRelayerCause waits for not_ready with the relayer's check failed,
// its cause containing cause, and no other check failed.
func (lr *limitedRelayer) wantRelayerCause(t *testing.T, cause string) {
	t.Helper()
	rd := lr.waitFor(t, "not_ready while the relayer's connections are refused", func(rd admin.Readiness) bool { return rd.Status == "not_ready" })
	found := false
	for _, c := range rd.Checks {
		switch {
		case c.Name == "relayer" && !c.OK && strings.Contains(c.Cause, cause):
			found = true
		case c.Name != "relayer" && !c.OK:
			t.Errorf("check %+v failed: only the relayer's should", c)
		}
	}
	if !found {
		t.Fatalf("readiness %+v: want the relayer check failed, saying its %s", rd, cause)
	}
}
