package admin_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"

	"github.com/ledgerline/outbox/admin"
	"github.com/ledgerline/outbox/internal/store"
)

// TestAPIReplayActsOnTheDeadLetterItRead: the API's replay reads the dead
// letter (its answer says whether the rail may have acted) and then
// replays it; between the two another operator replayed it and it failed
// again, this time with its outcome unknown. The replay acts only on the
// failure it read: 409 with "error": "DEAD_LETTER_CHANGED", nothing done,
// the new failure still a dead letter, replayed once. It once replayed
// the new failure under an answer that said the rail had not acted. The
// replay is held between its read and its act by the participant's lock,
// which a transaction takes first and in which the other operator's
// replay, its claim and the new failure are then written.
func TestAPIReplayActsOnTheDeadLetterItRead(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	id := b.enqueue(t, "p1", "k1")
	b.record(t, b.claim(t, "r1", time.Hour), store.Failed, "RAIL_REJECTED", 0)

	hold, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = hold.Rollback(b.ctx) }()
	var holder int32
	if err := hold.QueryRow(b.ctx, `SELECT pg_backend_pid() FROM outbox.sequences WHERE participant_id = 'p1' FOR UPDATE`).Scan(&holder); err != nil {
		t.Fatal(err)
	}
	type answer struct {
		code int
		res  admin.ActionResult
		err  error
	}
	done := make(chan answer, 1)
	go func() {
		var a answer
		a.code, a.err = postJSON(b.ctx, b.url+"/api/v1/dead-letters/"+id.String()+"/replay", operatorSecret,
			map[string]string{"reason": "rail back"}, &a.res)
		done <- a
	}()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		var waiting bool
		if err := b.pool.QueryRow(b.ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE $1::int = ANY (pg_blocking_pids(pid)))`, holder).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		select {
		case a := <-done:
			t.Fatalf("the replay finished before it waited for the participant's lock: %d %+v %v", a.code, a.res, a.err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting for the replay to wait for the participant's lock")
		}
	}
	if ok, err := b.st.Replay(b.ctx, hold, id, "alice", "rail back"); err != nil || !ok {
		t.Fatalf("alice's replay: %v, %v", ok, err)
	}
	claimed, err := b.st.Claim(b.ctx, hold, store.ClaimParams{RelayerID: "r1", Limit: 1, Leases: map[string]time.Duration{"sandbox": time.Hour}})
	if err != nil || len(claimed) != 1 || claimed[0].OutboxID != id {
		t.Fatalf("claim: %v, %v", claimed, err)
	}
	c := claimed[0]
	attempt := uuid.Must(uuid.NewV7())
	if _, _, err := b.st.Record(b.ctx, hold, []store.Outcome{{Identity: c.Identity, AttemptID: attempt, ClaimAttemptID: c.AttemptID,
		AttemptNo: c.AttemptNo, RelayerID: "r1", ClaimedAt: c.ClaimedAt, State: store.Failed, ErrorCode: "RAIL_TIMEOUT",
		OutcomeUnknown: true, CountAttempt: true}}, store.HandoffParams{}); err != nil {
		t.Fatal(err)
	}
	if err := hold.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	a := <-done
	if a.err != nil || a.code != http.StatusConflict || a.res.Done || a.res.Error != admin.DeadLetterChanged {
		t.Fatalf("replay of a dead letter that changed since it was read: %d %+v %v (want 409, %s)", a.code, a.res, a.err, admin.DeadLetterChanged)
	}
	var dead, replays int
	if err := b.pool.QueryRow(b.ctx, `SELECT (SELECT count(*) FROM outbox.dead_letters WHERE outbox_id = $1 AND outcome_unknown),
		(SELECT count(*) FROM outbox.attempts WHERE outbox_id = $1 AND state = 'REPLAYED')`, id).Scan(&dead, &replays); err != nil || dead != 1 || replays != 1 {
		t.Fatalf("after the replays: %d dead letters marked outcome unknown, %d REPLAYED rows (%v), want 1 and 1", dead, replays, err)
	}
	if rep, err := b.st.Verify(b.ctx, b.pool, store.VerifyOptions{Ordered: true}); err != nil || !rep.OK() {
		t.Fatalf("verify: %+v, %v", rep, err)
	}
}

// postJSON posts body as JSON with secret and decodes the answer into out:
// for a goroutine, which may not end the test.
func postJSON(ctx context.Context, url, secret string, body, out any) (int, error) {
	data, err := json.Marshal(body)
	if err != nil {
		return 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(data))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+secret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, err
	}
	return resp.StatusCode, json.Unmarshal(answer, out)
}
