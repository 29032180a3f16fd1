package main

import (
	"testing"
	"time"
)

// TestCancelLostCommitReply: the connection of an `outbox cancel` breaks
// after the cancel was sent. Where the commit's answer was lost (the
// instruction cancelled), the command settles it on a new connection and
// reports the line done, exit 0. It used to stop with the connection's
// error (exit 1) and no line; run again, it said "not pending: already
// settled": a payment the operator had just stopped, read as one that
// may have been sent. Where the database cannot be reached again to
// tell, the line says COMMIT_UNKNOWN and the exit status is 4.
func TestCancelLostCommitReply(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	settled, unsettled, cut := b.enqueued(t, "p1", "k1"), b.enqueued(t, "p2", "k2"), b.enqueued(t, "p3", "k3")
	proxy, db := b.proxied(t)

	// The answer to the cancel's statement is lost: whether that reply
	// was the commit's or not, the line says what the database did, and a
	// cancel not done is done by running it again.
	proxy.CutReplyAfter([]byte("cancel_pending"))
	r := invokeCLI(t, nil, "", append([]string{"cancel", "--operator", "olga", "--reason", "recalled", cut}, db...)...)
	if l, n := oneJSONLine[actionLine](t, r), b.attemptsIn(t, "CANCELLED", cut); l.OutboxID != cut || l.Done != (n == 1) || r.code != map[bool]int{true: 0, false: 1}[l.Done] ||
		!l.Done && l.Error != "NOT_DONE" {
		t.Fatalf("a cancel whose answer was lost (%d CANCELLED rows) was reported as:\n%s", n, r)
	}
	again := map[bool]int{true: 1, false: 0}[b.attemptsIn(t, "CANCELLED", cut) == 1] // 1: not pending any more
	requireExit(t, b.cli(t, "", "cancel", "--operator", "olga", "--reason", "recalled", cut), again)
	if n := b.attemptsIn(t, "CANCELLED", cut); n != 1 {
		t.Fatalf("after the cancel was run again: %d CANCELLED rows", n)
	}

	proxy.CutReplyAfter([]byte("commit"))
	r = invokeCLI(t, nil, "", append([]string{"cancel", "--operator", "olga", "--reason", "recalled", settled}, db...)...)
	if n := b.attemptsIn(t, "CANCELLED", settled); n != 1 {
		t.Fatalf("the cut cancel: %d CANCELLED rows, want 1 (the cut was not after the commit):\n%s", n, r)
	}
	if l := oneJSONLine[actionLine](t, r); r.code != 0 || !l.Done || l.OutboxID != settled {
		t.Fatalf("a cancel whose commit's answer was lost, and that was done, was reported as:\n%s", r)
	}

	proxy.RefuseAfterCut(3 * time.Second)
	proxy.CutReplyAfter([]byte("commit"))
	r = invokeCLI(t, nil, "", append([]string{"cancel", "--operator", "olga", "--reason", "recalled", unsettled}, db...)...)
	if n := b.attemptsIn(t, "CANCELLED", unsettled); n != 1 {
		t.Fatalf("the cut cancel: %d CANCELLED rows, want 1:\n%s", n, r)
	}
	if l := oneJSONLine[actionLine](t, r); r.code != 4 || l.Done || l.Error != "COMMIT_UNKNOWN" || l.OutboxID != unsettled {
		t.Fatalf("a cancel whose commit's answer was lost, with the database out of reach, was reported as:\n%s", r)
	}
	requireExit(t, b.cli(t, "", "audit", "verify"), 0)
}
