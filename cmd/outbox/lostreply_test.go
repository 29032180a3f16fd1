package main

import (
	"encoding/json"
	"net/url"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"

	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/internal/testdb"
)

// The set-up the tests of operator commands whose connection breaks
// share.

// enqueued enqueues one instruction through `outbox enqueue` and returns
// its outbox id.
func (b *cliBundle) enqueued(t *testing.T, participant, key string) string {
	t.Helper()
	r := b.cli(t, inputJSON(participant, key, "100"), "enqueue")
	requireExit(t, r, 0)
	return decodeEnqueueLine(t, stdoutLines(t, r.stdout)[0]).outboxID
}

// deadLettered enqueues one instruction and makes it a dead letter: a
// claim by relayer r1 and a RAIL_REJECTED failure.
func (b *cliBundle) deadLettered(t *testing.T, participant, key string) string {
	t.Helper()
	st, err := store.New("")
	if err != nil {
		t.Fatal(err)
	}
	id := b.enqueued(t, participant, key)
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

// proxied starts a proxy to the test's database that can cut replies and
// returns it with the flags of a connection through it. Exec mode (as
// behind PgBouncer): a statement's text and its execution go in one
// message, so a cut lands on the reply of the round trip named.
func (b *cliBundle) proxied(t *testing.T) (*testdb.HoldingProxy, []string) {
	t.Helper()
	u, err := url.Parse(b.url)
	if err != nil {
		t.Fatal(err)
	}
	proxy := testdb.StartHoldingProxy(t, u.Host)
	u.Host = proxy.Addr()
	return proxy, []string{"--database-url", u.String(), "--pooler", "transaction"}
}

// actionLine is the line an operator command (cancel, dlq replay or ack,
// rails pause or resume) prints for one action.
type actionLine struct {
	OutboxID string `json:"outbox_id"`
	Done     bool   `json:"done"`
	Error    string `json:"error"`
}

// oneJSONLine decodes r's output, which must be one JSON line.
func oneJSONLine[T any](t *testing.T, r cliResult) T {
	t.Helper()
	var l T
	if lines := stdoutLines(t, r.stdout); len(lines) != 1 || json.Unmarshal([]byte(lines[0]), &l) != nil {
		t.Fatalf("want one line:\n%s", r)
	}
	return l
}

// attemptsIn counts the archive's rows of outbox id in state.
func (b *cliBundle) attemptsIn(t *testing.T, state, id string) (n int) {
	t.Helper()
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox.attempts WHERE outbox_id = $1 AND state = $2`, id, state).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
