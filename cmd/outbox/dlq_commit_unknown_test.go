package main

import (
	"strings"
	"testing"
	"time"
)

// TestDLQReplayLostCommitReply: the connection of a `dlq replay` breaks
// after its transaction was sent. Where the commit's answer was lost (the
// replay done), the command settles what happened on a new connection and
// reports the line done, exit 0: it used to exit 1 with the connection's
// error and no line, a replay reported as failed. The operator ran it
// again, and once the replayed instruction had failed again (in seconds,
// for a rail that refuses it) that second run replayed the new failure: a
// dead letter replayed twice for one decision, the second time without
// anyone having looked at it. Where the connection broke before the
// commit was sent, the line says done false and the command exits 1:
// nothing was done, and running it again is safe and does it once. Where
// the database cannot be reached again to tell, the line says
// COMMIT_UNKNOWN and the exit status is 4: check before running it again.
func TestDLQReplayLostCommitReply(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	proxy, db := b.proxied(t)

	// The commit's answer is lost: the replay is done.
	committed, notSent, unsettled := b.deadLettered(t, "p1", "k1"), b.deadLettered(t, "p2", "k2"), b.deadLettered(t, "p3", "k3")
	proxy.CutReplyAfter([]byte("commit"))
	r := invokeCLI(t, nil, "", append([]string{"dlq", "replay", "--operator", "bob", "--reason", "rail back", committed}, db...)...)
	if n := b.attemptsIn(t, "REPLAYED", committed); n != 1 {
		t.Fatalf("the cut replay: %d REPLAYED rows, want 1 (the cut was not after the commit):\n%s", n, r)
	}
	if l := oneJSONLine[actionLine](t, r); r.code != 0 || !l.Done || l.OutboxID != committed {
		t.Fatalf("a replay whose commit's answer was lost, and that was done, was reported as:\n%s", r)
	}

	// The connection breaks before the commit is sent: nothing is done.
	proxy.CutReplyAfter([]byte("replay_dead_letter"))
	r = invokeCLI(t, nil, "", append([]string{"dlq", "replay", "--operator", "bob", "--reason", "rail back", notSent}, db...)...)
	if n := b.attemptsIn(t, "REPLAYED", notSent); n != 0 {
		t.Fatalf("a replay cut before its commit: %d REPLAYED rows, want 0:\n%s", n, r)
	}
	if l := oneJSONLine[actionLine](t, r); r.code != 1 || l.Done || l.OutboxID != notSent || !strings.Contains(r.stdout, "nothing done") {
		t.Fatalf("a replay cut before its commit, not done, was reported as:\n%s", r)
	}
	requireExit(t, b.cli(t, "", "dlq", "replay", "--operator", "bob", "--reason", "rail back", notSent), 0)
	if n := b.attemptsIn(t, "REPLAYED", notSent); n != 1 {
		t.Fatalf("the replay run again: %d REPLAYED rows, want 1", n)
	}

	// The commit's answer is lost and the database cannot be reached
	// again to tell: the line says the replay may have been done, and the
	// exit status is 4, not 1 (whose lines were not done).
	proxy.RefuseAfterCut(3 * time.Second)
	proxy.CutReplyAfter([]byte("commit"))
	r = invokeCLI(t, nil, "", append([]string{"dlq", "replay", "--operator", "bob", "--reason", "rail back", unsettled}, db...)...)
	if n := b.attemptsIn(t, "REPLAYED", unsettled); n != 1 {
		t.Fatalf("the cut replay: %d REPLAYED rows, want 1:\n%s", n, r)
	}
	if l := oneJSONLine[actionLine](t, r); r.code != 4 || l.Done || l.Error != "COMMIT_UNKNOWN" || l.OutboxID != unsettled {
		t.Fatalf("a replay whose commit's answer was lost, with the database out of reach, was reported as:\n%s", r)
	}
	requireExit(t, b.cli(t, "", "audit", "verify"), 0)
}
