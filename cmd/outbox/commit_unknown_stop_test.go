package main

import (
	"strings"
	"testing"
	"time"
)

// TestCommitUnknownKeepsItsExitWhenTheCommandStops: a `dlq replay` or a
// `cancel` of several ids whose first action's commit cannot be settled
// (COMMIT_UNKNOWN: the database out of reach) stops at the next id, which
// it cannot read or act on either. The exit status is still 4: it was 1,
// the status of a command whose lines were not done, so that a script
// (or an operator) ran it again, and the first id's replay, which may
// have been done, could be done a second time, on a new failure.
func TestCommitUnknownKeepsItsExitWhenTheCommandStops(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	enqueue, deadLetter := b.enqueued, b.deadLettered
	proxy, db := b.proxied(t)

	first, second := deadLetter(t, "p1", "k1"), deadLetter(t, "p2", "k2")
	proxy.RefuseAfterCut(3 * time.Second)
	proxy.CutReplyAfter([]byte("commit"))
	r := invokeCLI(t, nil, "", append([]string{"dlq", "replay", "--operator", "bob", "--reason", "rail back", first, second}, db...)...)
	if r.code != 4 || !strings.Contains(r.stdout, "COMMIT_UNKNOWN") {
		t.Fatalf("a dlq replay stopped after a line's COMMIT_UNKNOWN exited %d, want 4:\n%s", r.code, r)
	}
	time.Sleep(3 * time.Second) // the refusals end

	one, two := enqueue(t, "p3", "k3"), enqueue(t, "p4", "k4")
	proxy.RefuseAfterCut(3 * time.Second)
	proxy.CutReplyAfter([]byte("commit"))
	r = invokeCLI(t, nil, "", append([]string{"cancel", "--operator", "bob", "--reason", "recalled", one, two}, db...)...)
	if r.code != 4 || !strings.Contains(r.stdout, "COMMIT_UNKNOWN") {
		t.Fatalf("a cancel stopped after a line's COMMIT_UNKNOWN exited %d, want 4:\n%s", r.code, r)
	}
}
