package main

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

// TestCommandsDoNotHangBehindALock: with someone holding an ACCESS
// EXCLUSIVE lock on the pending table, `outbox stats` and `outbox reap`
// fail with PostgreSQL's lock timeout (SQLSTATE 55P03) instead of waiting
// for as long as the lock is held.
func TestCommandsDoNotHangBehindALock(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(b.ctx, "LOCK outbox.pending IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"stats"}, {"reap"}} {
		done := make(chan cliResult, 1)
		go func() { done <- b.cli(t, "", args[0], append(args[1:], "--lock-timeout", "300ms")...) }()
		select {
		case r := <-done:
			if r.code != 1 || !strings.Contains(r.stderr, "55P03") {
				t.Errorf("%v behind the lock: want exit 1 with a lock timeout (55P03), got %s", args, r)
			}
		case <-time.After(time.Minute):
			t.Fatalf("%v is still waiting for the lock after a minute", args)
		}
	}
}

// TestConnectionsAreNamed: operators find every connection in
// pg_stat_activity: the relayer's pool as "outbox-relay <relayer id>", its
// LISTEN connection with " listen" appended, a producer as
// "outbox-producer".
func TestConnectionsAreNamed(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	ctx, cancel := context.WithCancel(b.ctx)
	relayDone := make(chan error, 1)
	stdin, stdinW := io.Pipe()
	enqueueDone := make(chan error, 1)
	go func() {
		env := &environment{stdin: strings.NewReader(""), stdout: io.Discard, stderr: io.Discard, getenv: func(string) string { return "" }}
		relayDone <- run(ctx, env, []string{"relay", "--database-url", b.url, "--relayer-id", "named-1"})
	}()
	go func() {
		env := &environment{stdin: stdin, stdout: io.Discard, stderr: io.Discard, getenv: func(string) string { return "" }}
		enqueueDone <- run(ctx, env, []string{"enqueue", "--database-url", b.url})
	}()
	if _, err := io.WriteString(stdinW, inputJSON("p1", "k1", "100")+"\n"); err != nil {
		t.Fatal(err)
	}
	want := []string{"outbox-relay named-1", "outbox-relay named-1 listen", "outbox-producer"}
	deadline := time.Now().Add(30 * time.Second)
	for {
		var missing []string
		for _, name := range want {
			var n int
			if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database()`, name).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				missing = append(missing, name)
			}
		}
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no connection named %q in pg_stat_activity", missing)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The producer ends at the end of its input (cancelling it while it
	// commits its last batch would fail that batch); then the relay stops.
	stdinW.Close()
	if err := <-enqueueDone; err != nil {
		t.Errorf("enqueue: %v", err)
	}
	cancel()
	if err := <-relayDone; err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("relay: %v", err)
	}
}

// TestDatabaseTimeoutFlagsOutOfRange: a negative --statement-timeout,
// --lock-timeout or --idle-in-transaction-timeout (a flipped sign) or one
// beyond PostgreSQL's largest (2147483647 ms, 24.8 days) is a usage error,
// exit 2, before anything connects or is written. A negative one used to
// be dropped without a word, so the sessions ran with no timeout at all
// (the server's or role's, "0"): an enqueue went through, a migration ran
// without its lock bound. One beyond the range was sent at connect and
// refused by the server on every connection: `outbox relay` started and
// retried its connections for as long as it ran, dispatching nothing.
func TestDatabaseTimeoutFlagsOutOfRange(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	for _, flag := range []string{"--statement-timeout", "--lock-timeout", "--idle-in-transaction-timeout"} {
		for _, v := range []string{"-30s", "720h"} {
			r := b.cli(t, "", "migrate", "--schema", "cli_tmo", flag, v, "up")
			if r.code != 2 || !strings.Contains(r.stderr, flag) || r.stdout != "" {
				t.Errorf("migrate %s %s: want exit 2 naming %s, got %s", flag, v, flag, r)
			}
			r = b.cli(t, inputJSON("p-tmo", "k-tmo"+flag+v, "100")+"\n", "enqueue", flag, v)
			if r.code != 2 || !strings.Contains(r.stderr, flag) || r.stdout != "" {
				t.Errorf("enqueue %s %s: want exit 2 naming %s, got %s", flag, v, flag, r)
			}
		}
	}
	var n int
	if err := b.pool.QueryRow(b.ctx, `SELECT (SELECT count(*) FROM pg_namespace WHERE nspname = 'cli_tmo') + (SELECT count(*) FROM outbox.pending)`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("refused commands wrote %d things (schema cli_tmo, pending rows)", n)
	}
	// The relay refuses it at once rather than running without a database.
	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	done := make(chan cliResult, 1)
	go func() {
		var stderr strings.Builder
		env := &environment{stdin: strings.NewReader(""), stdout: io.Discard, stderr: &stderr, getenv: func(string) string { return "" }}
		err := run(ctx, env, []string{"relay", "--database-url", b.url, "--statement-timeout", "720h"})
		done <- cliResult{code: exitCode(env, err), stderr: stderr.String()}
	}()
	select {
	case r := <-done:
		if r.code != 2 || !strings.Contains(r.stderr, "--statement-timeout") {
			t.Errorf("relay --statement-timeout 720h: want exit 2 naming the flag, got %s", r)
		}
	case <-time.After(30 * time.Second):
		cancel()
		<-done
		t.Errorf("relay --statement-timeout 720h was still running after 30s (retrying connections the server refuses)")
	}
}
