package main

import (
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/ledgerline/outbox/internal/testdb"
)

// TestEnqueueCommitOutcomeUnknown: when the connection breaks after the
// database committed an enqueue and before its answer arrived, `outbox
// enqueue` must not report the line as failed: the instruction is queued
// and will be paid, and a script that takes DATABASE_ERROR for "not
// enqueued" would enqueue the payment again under a new key. It sends the
// same instructions again under the same keys, as docs/operations.md asks
// of every producer, and prints the receipt they answer with (the
// original outbox id, marked duplicate). Before the fix the line was a
// DATABASE_ERROR (exit 1) while the instruction was committed. Both the
// single-line path (one implicit transaction) and a --batch (an explicit
// one) are cut.
func TestEnqueueCommitOutcomeUnknown(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	u, err := url.Parse(b.url)
	if err != nil {
		t.Fatal(err)
	}
	proxy := testdb.StartHoldingProxy(t, u.Host)
	u.Host = proxy.Addr()
	// Exec mode (as behind PgBouncer): a statement's text and its
	// execution go in one message, so the cut lands on the reply of the
	// round trip that commits.
	db := []string{"--database-url", u.String(), "--pooler", "transaction"}

	check := func(what string, r cliResult, keys ...string) {
		t.Helper()
		committed := make([]string, len(keys))
		for i, key := range keys {
			if err := b.pool.QueryRow(b.ctx, `SELECT outbox_id::text FROM outbox.idempotency_keys WHERE idempotency_key = $1`,
				key).Scan(&committed[i]); err != nil {
				t.Fatalf("%s: key %s not committed: %v", what, key, err)
			}
		}
		if r.code != 0 {
			t.Fatalf("%s: every instruction committed (%v), but the command reported: %s", what, committed, r)
		}
		if !strings.Contains(r.stderr, "may have committed") {
			t.Fatalf("%s: the connection was not cut (the test proves nothing): %s", what, r)
		}
		lines := stdoutLines(t, r.stdout)
		if len(lines) != len(keys) {
			t.Fatalf("%s: want %d lines, got %s", what, len(keys), r)
		}
		for i, committed := range committed {
			got := decodeEnqueueLine(t, lines[i])
			if !got.receipt || got.outboxID != committed {
				t.Fatalf("%s: line %d is %+v, want the receipt of the committed instruction %s", what, i, got, committed)
			}
		}
	}

	// One instruction: its statements and the commit are one round trip.
	proxy.CutReplyAfter([]byte("idempotency_keys"))
	r := invokeCLI(t, nil, "", append([]string{"enqueue", "--instruction-id", "ins-1", "--participant-id", "m-1",
		"--idempotency-key", "key-1", "--rail", "sandbox", "--amount-minor", "100", "--currency", "USD",
		"--destination", "acct-1"}, db...)...)
	check("single", r, "key-1")

	// A batch: the explicit transaction's COMMIT is cut.
	var lines strings.Builder
	for i := 2; i <= 3; i++ {
		fmt.Fprintf(&lines, `{"instruction_id":"ins-%d","participant_id":"m-1","idempotency_key":"key-%d","rail":"sandbox","amount_minor":100,"currency":"USD","destination":"acct-1"}`+"\n", i, i)
	}
	proxy.CutReplyAfter([]byte("commit"))
	r = invokeCLI(t, nil, lines.String(), append([]string{"enqueue", "--batch", "2"}, db...)...)
	check("batch", r, "key-2", "key-3")
}

// TestEnqueueCommitUnknownThroughAFailover: the reply to an enqueue's
// commit is lost and then, for 3 s, the database refuses connections, as
// a crashed primary's address does until its standby is promoted. The
// resends under the same keys (3, within about a second) all fail, and the
// lines, whose instructions did commit and will be paid, were reported as
// DATABASE_ERROR with the last resend's "connection refused": what a
// script reads as "not enqueued", and then enqueues again under a new
// key. A line whose transaction may have committed is reported as
// COMMIT_UNKNOWN, telling the caller to send it again under the same key:
// a single instruction (whose failure comes wrapped as the batch's line 0)
// and a --batch alike.
func TestEnqueueCommitUnknownThroughAFailover(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	u, err := url.Parse(b.url)
	if err != nil {
		t.Fatal(err)
	}
	// A proxy each, as each refuses connections for a while after its cut.
	through := func() (*testdb.HoldingProxy, []string) {
		proxy := testdb.StartHoldingProxy(t, u.Host)
		v := *u
		v.Host = proxy.Addr()
		return proxy, []string{"--database-url", v.String(), "--pooler", "transaction"}
	}

	check := func(what string, r cliResult, keys ...string) {
		t.Helper()
		if !strings.Contains(r.stderr, "may have committed") {
			t.Fatalf("%s: the connection was not cut (the test proves nothing): %s", what, r)
		}
		var committed int
		if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox.idempotency_keys WHERE idempotency_key = ANY($1)`, keys).Scan(&committed); err != nil {
			t.Fatal(err)
		}
		if committed != len(keys) {
			t.Fatalf("%s: %d of the %d instructions committed: the cut was not after the commit", what, committed, len(keys))
		}
		out := stdoutLines(t, r.stdout)
		if len(out) != len(keys) {
			t.Fatalf("%s: want %d output lines: %s", what, len(keys), r)
		}
		for i, line := range out {
			got := decodeEnqueueLine(t, line)
			if got.receipt {
				continue // a resend got through: fine too
			}
			if got.code != "COMMIT_UNKNOWN" || !strings.Contains(got.message, "same idempotency key") {
				t.Errorf("%s: line %d, committed, is reported as %s (%s): want a receipt or COMMIT_UNKNOWN saying to send it again under the same idempotency key",
					what, i+1, got.code, got.message)
			}
		}
		if r.code != 1 {
			t.Errorf("%s: exit %d, want 1 (a line has no receipt)", what, r.code)
		}
	}

	// One instruction: its statements and the commit are one round trip.
	proxy, db := through()
	proxy.RefuseAfterCut(3 * time.Second)
	proxy.CutReplyAfter([]byte("idempotency_keys"))
	r := invokeCLI(t, nil, "", append([]string{"enqueue", "--instruction-id", "ins-1", "--participant-id", "m-1",
		"--idempotency-key", "key-1", "--rail", "sandbox", "--amount-minor", "100", "--currency", "USD",
		"--destination", "acct-1"}, db...)...)
	check("single", r, "key-1")

	// A batch: the explicit transaction's COMMIT is cut.
	var lines strings.Builder
	for i := 2; i <= 3; i++ {
		fmt.Fprintf(&lines, `{"instruction_id":"ins-%d","participant_id":"m-1","idempotency_key":"key-%d","rail":"sandbox","amount_minor":100,"currency":"USD","destination":"acct-1"}`+"\n", i, i)
	}
	proxy, db = through()
	proxy.RefuseAfterCut(3 * time.Second)
	proxy.CutReplyAfter([]byte("commit"))
	r = invokeCLI(t, nil, lines.String(), append([]string{"enqueue", "--batch", "2"}, db...)...)
	check("batch", r, "key-2", "key-3")
}
