package main

import (
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"

	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/internal/testdb"
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
	st, err := store.New("")
	if err != nil {
		t.Fatal(err)
	}
	enqueue := func(participant, key string) string {
		t.Helper()
		r := b.cli(t, inputJSON(participant, key, "100"), "enqueue")
		requireExit(t, r, 0)
		return decodeEnqueueLine(t, stdoutLines(t, r.stdout)[0]).outboxID
	}
	deadLetter := func(participant, key string) string {
		t.Helper()
		id := enqueue(participant, key)
		claimed, err := st.Claim(b.ctx, b.pool, store.ClaimParams{RelayerID: "r1", Limit: 1, Leases: map[string]time.Duration{"sandbox": time.Hour}})
		if err != nil || len(claimed) != 1 || claimed[0].OutboxID.String() != id {
			t.Fatalf("claim: %v, %v (want %s)", claimed, err, id)
		}
		c := claimed[0]
		attempt, _ := uuid.NewV7()
		if _, _, err := st.Record(b.ctx, b.pool, []store.Outcome{{Identity: c.Identity, AttemptID: attempt, ClaimAttemptID: c.AttemptID,
			AttemptNo: c.AttemptNo, RelayerID: "r1", ClaimedAt: c.ClaimedAt, State: store.Failed, ErrorCode: "RAIL_REJECTED",
			CountAttempt: true}}, store.HandoffParams{}); err != nil {
			t.Fatal(err)
		}
		return id
	}
	u, err := url.Parse(b.url)
	if err != nil {
		t.Fatal(err)
	}
	proxy := testdb.StartHoldingProxy(t, u.Host)
	u.Host = proxy.Addr()
	db := []string{"--database-url", u.String(), "--pooler", "transaction"}

	first, second := deadLetter("p1", "k1"), deadLetter("p2", "k2")
	proxy.RefuseAfterCut(3 * time.Second)
	proxy.CutReplyAfter([]byte("commit"))
	r := invokeCLI(t, nil, "", append([]string{"dlq", "replay", "--operator", "bob", "--reason", "rail back", first, second}, db...)...)
	if r.code != 4 || !strings.Contains(r.stdout, "COMMIT_UNKNOWN") {
		t.Fatalf("a dlq replay stopped after a line's COMMIT_UNKNOWN exited %d, want 4:\n%s", r.code, r)
	}
	time.Sleep(3 * time.Second) // the refusals end

	one, two := enqueue("p3", "k3"), enqueue("p4", "k4")
	proxy.RefuseAfterCut(3 * time.Second)
	proxy.CutReplyAfter([]byte("commit"))
	r = invokeCLI(t, nil, "", append([]string{"cancel", "--operator", "bob", "--reason", "recalled", one, two}, db...)...)
	if r.code != 4 || !strings.Contains(r.stdout, "COMMIT_UNKNOWN") {
		t.Fatalf("a cancel stopped after a line's COMMIT_UNKNOWN exited %d, want 4:\n%s", r.code, r)
	}
}
