package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/migrations"
)

// producerURL is b's database as a fresh login role of outbox_producer
// (the roles created), its sessions scoped to tenant: what a producer
// service's `outbox enqueue` connects as. The pool is a superuser's, which
// reads what the owner's schema holds.
func (b *cliBundle) producerURL(t *testing.T, tenant string) (string, *pgxpool.Pool) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(b.url)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := pgx.ParseConfig(testdb.AdminURL(t))
	if err != nil {
		t.Fatal(err)
	}
	// Roles are created, and ownership handed over, by a superuser.
	cfg.ConnConfig.User, cfg.ConnConfig.Password = admin.User, admin.Password
	pool, err := pgxpool.NewWithConfig(b.ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := migrations.CreateRoles(b.ctx, pool, ""); err != nil {
		t.Fatal(err)
	}
	role := fmt.Sprintf("enqueue_%x", rand.Uint64())
	if _, err := pool.Exec(b.ctx, "CREATE ROLE "+role+" LOGIN IN ROLE outbox_producer"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cfg := cfg.Copy()
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err == nil {
			defer pool.Close()
			_, err = pool.Exec(context.Background(), "DROP ROLE IF EXISTS "+role)
		}
		if err != nil {
			t.Errorf("dropping %s: %v", role, err)
		}
	})
	u, err := url.Parse(b.url)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	q := u.Query()
	q.Set(migrations.TenantSetting, tenant) // pgx sends it at connect, as a run-time parameter
	u.RawQuery = q.Encode()
	return u.String(), pool
}

// TestEnqueueLineTheDatabaseRefusesDoesNotSinkItsBatch: a refusal only
// the database can give, and gives the batch's statement as a whole, such
// as a tenant the session may not write for (42501), failed every line of
// its --batch as DATABASE_ERROR, the good ones not enqueued. The batch is
// sent again line by line: the good lines are enqueued, the refused one
// is PERMISSION_DENIED (pending.ErrPermissionDenied: a configuration to
// fix, not the database's trouble; it was DATABASE_ERROR) with the
// database's message.
func TestEnqueueLineTheDatabaseRefusesDoesNotSinkItsBatch(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	producer, admin := b.producerURL(t, "A")
	line := func(key, tenant string) string { return inputJSON("p-"+key, key, "100", "tenant_id", tenant) }
	input := strings.Join([]string{line("k1", "A"), line("k2", "B"), line("k3", "A")}, "\n")
	r := invokeCLI(t, nil, input, "enqueue", "--database-url", producer, "--batch", "3")
	requireExit(t, r, 1)
	got := checkEnqueueOutput(t, r.stdout, []wantLine{wantReceipt(1), wantError("PERMISSION_DENIED", ""), wantReceipt(1)})
	if !strings.Contains(stdoutLines(t, r.stdout)[1], "42501") {
		t.Errorf("the refused line says %s, want the database's 42501", stdoutLines(t, r.stdout)[1])
	}
	var keys []string
	rows, err := admin.Query(b.ctx, `SELECT tenant_id || '/' || idempotency_key FROM outbox.pending ORDER BY 1`)
	if err == nil {
		keys, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(keys, " ") != "A/k1 A/k3" || got[0].outboxID == got[2].outboxID {
		t.Errorf("pending %q, want the good lines A/k1 and A/k3", keys)
	}
}

// TestEnqueueRefusedAsReadOnlyIsReadOnly: lines a read-only session
// refuses (a standby's connection after a failover, a role or database
// whose default is read-only) are READ_ONLY, not DATABASE_ERROR: nothing
// was enqueued, and the same lines sent again to the primary, under the
// same keys, go through, which a script needs to tell from a refusal for
// good. One line alone and a --batch alike; nothing is written.
func TestEnqueueRefusedAsReadOnlyIsReadOnly(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	if r := invokeCLI(t, nil, "", "migrate", "--database-url", b.url); r.code != 0 {
		t.Fatalf("migrate: %d %s", r.code, r.stderr)
	}
	readOnly := b.url + "&default_transaction_read_only=on"
	if !strings.Contains(b.url, "?") {
		readOnly = b.url + "?default_transaction_read_only=on"
	}
	input := strings.Join([]string{inputJSON("p1", "k1", "100"), inputJSON("p2", "k2", "100")}, "\n")
	for _, args := range [][]string{{"enqueue", "--database-url", readOnly}, {"enqueue", "--database-url", readOnly, "--batch", "2"}} {
		r := invokeCLI(t, nil, input, args...)
		requireExit(t, r, 1)
		checkEnqueueOutput(t, r.stdout, []wantLine{wantError(codeReadOnly, ""), wantError(codeReadOnly, "")})
	}
	var n int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox.idempotency_keys`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d keys (%v), want none", n, err)
	}
	r := invokeCLI(t, nil, input, "enqueue", "--database-url", b.url)
	requireExit(t, r, 0)
	checkEnqueueOutput(t, r.stdout, []wantLine{wantReceipt(1), wantReceipt(1)})
}

// TestCommitUnknownOutranksARefusalOfTheResend: after a send whose commit
// reply was lost, a resend that a read-only server refuses (the standby
// reached first after a failover) or that fails on the database settles
// nothing: the line stays COMMIT_UNKNOWN. A refusal of the line itself (a
// mismatch) is the line's answer, and without a lost reply nothing changes.
func TestCommitUnknownOutranksARefusalOfTheResend(t *testing.T) {
	t.Parallel()
	lost := errors.New("conn closed")
	for _, tc := range []struct {
		code    string
		unknown error
		want    string
	}{
		{codeReadOnly, lost, codeCommitUnknown},
		{codeDatabaseError, lost, codeCommitUnknown},
		{codeMismatch, lost, codeMismatch},
		{codeReadOnly, nil, codeReadOnly},
		{codeDatabaseError, nil, codeDatabaseError},
	} {
		if got := commitUnknown(&lineError{Code: tc.code}, tc.unknown).Code; got != tc.want {
			t.Errorf("%s after %v: %s, want %s", tc.code, tc.unknown, got, tc.want)
		}
	}
}
