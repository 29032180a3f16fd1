package main

import (
	"testing"
	"time"
)

// TestRailsResumeLostCommitReply: the connection of an `outbox rails
// resume` breaks after the resume was sent and committed. The command
// settles it on a new connection and reports it done, exit 0. It used to
// stop with the connection's error (exit 1), and the operator ran it
// again: had someone paused the rail meanwhile (a new incident), that
// second run ended their pause, which its operator never saw. Where the
// database cannot be reached again to tell, the line says COMMIT_UNKNOWN
// and the exit status is 4; a pause alike.
func TestRailsResumeLostCommitReply(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	proxy, db := b.proxied(t)
	events := func(action string) (n int) {
		t.Helper()
		if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox.rail_pause_events WHERE rail_type = 'sandbox' AND action = $1`, action).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	requireExit(t, b.cli(t, "", "rails", "--operator", "alice", "--reason", "rail down", "--wait", "0", "pause", "sandbox"), 0)

	// The answer to the resume's statement is lost: whether that reply was
	// the commit's or not, the line says what the database did.
	proxy.CutReplyAfter([]byte("resume_rail"))
	r := invokeCLI(t, nil, "", append([]string{"rails", "--operator", "alice", "--reason", "rail back", "resume", "sandbox"}, db...)...)
	if l, n := oneJSONLine[actionLine](t, r), events("RESUMED"); l.Done != (n == 1) || r.code != map[bool]int{true: 0, false: 1}[l.Done] ||
		!l.Done && l.Error != "NOT_DONE" {
		t.Fatalf("a resume whose answer was lost (%d RESUMED events) was reported as:\n%s", n, r)
	}
	if events("RESUMED") == 0 {
		requireExit(t, b.cli(t, "", "rails", "--operator", "alice", "--reason", "rail back", "resume", "sandbox"), 0)
	}
	requireExit(t, b.cli(t, "", "rails", "--operator", "alice", "--reason", "rail down", "--wait", "0", "pause", "sandbox"), 0)

	proxy.CutReplyAfter([]byte("commit"))
	r = invokeCLI(t, nil, "", append([]string{"rails", "--operator", "alice", "--reason", "rail back", "resume", "sandbox"}, db...)...)
	if n := events("RESUMED"); n != 2 {
		t.Fatalf("the cut resume: %d RESUMED events, want 1 (the cut was not after the commit):\n%s", n, r)
	}
	if l := oneJSONLine[actionLine](t, r); r.code != 0 || !l.Done {
		t.Fatalf("a resume whose commit's answer was lost, and that was done, was reported as:\n%s", r)
	}

	proxy.RefuseAfterCut(3 * time.Second)
	proxy.CutReplyAfter([]byte("commit"))
	r = invokeCLI(t, nil, "", append([]string{"rails", "--operator", "alice", "--reason", "rail down again", "--wait", "0", "pause", "sandbox"}, db...)...)
	if n := events("PAUSED"); n != 3 {
		t.Fatalf("the cut pause: %d PAUSED events, want 3:\n%s", n, r)
	}
	if l := oneJSONLine[actionLine](t, r); r.code != 4 || l.Done || l.Error != "COMMIT_UNKNOWN" {
		t.Fatalf("a pause whose commit's answer was lost, with the database out of reach, was reported as:\n%s", r)
	}
}
