package store_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ledgerline/outbox/internal/store"
)

// transitionOps are the moves FuzzTransitions makes, each chosen by one
// byte of its input and given the next byte as its argument.
var transitionOps = []string{"enqueue", "claim", "claim-short", "outcome", "reap", "late-outcome", "replay", "cancel", "acknowledge", "resend", "pause", "resume"}

// transitions is FuzzTransitions' picture of one run: the claims it holds
// and those the reaper took back from it.
type transitions struct {
	b    *recordBundle
	n    int
	held []heldClaim
	// reaped are claims the reaper requeued: their outcomes come late.
	reaped []reapedClaim
	// recorded are the outcomes recorded on time, which a relayer whose
	// write's reply was lost sends again.
	recorded []store.Outcome
	log      []string
}

// reapedClaim is a claim the reaper requeued, and its late outcome once
// sent.
type reapedClaim struct {
	c    store.Claimed
	sent *store.Outcome
}

type heldClaim struct {
	c       store.Claimed
	relayer string
}

var fuzzParticipants = []string{"pa", "pb", "pc"}

// FuzzTransitions drives the store through sequences of every transition
// an instruction can take (enqueue, claim, claim with a lease that runs
// out, an outcome with or without a hand-off, the reaper, a late outcome
// (sent twice, sometimes, as after a lost reply), an outcome sent again
// after it was recorded, a rail's or every rail's pause and resume, an operator's replay, cancel and acknowledgement)
// over three participants, with ordering on, and runs audit verify after
// each move: whatever the order, every invariant must hold, no move may
// fail but with the typed refusals it documents, and at the end every
// instruction drains. `go test` runs the seeds (and testdata's inputs);
// each input needs a database of its own, so it is not in `make fuzz`:
// look for more with OUTBOX_TEST_DATABASE_URL set (else each fuzzing
// process starts a cluster) and
//
//	go test -run '^$' -fuzz FuzzTransitions -fuzzminimizetime 0 -parallel 1 ./internal/store
//
// (about two inputs a second on a 2-core machine; minimizing each new
// input takes a minute by default).
func FuzzTransitions(f *testing.F) {
	for _, seed := range []string{
		// enqueue three of one participant, claim, fail with retry, hand off.
		"\x00\x00\x00\x00\x00\x00\x01\x00\x03\x10\x03\x01\x03\x00",
		// a claim whose lease runs out, reaped, its late outcome sent twice.
		"\x00\x01\x00\x01\x02\x00\x04\x00\x05\x04\x05\x04\x01\x00\x03\x00",
		// a terminal failure, its dead letter replayed, then acknowledged after another.
		"\x00\x02\x00\x02\x01\x00\x03\x20\x06\x00\x01\x00\x03\x20\x08\x00\x01\x00\x03\x00",
		// cancels around claims and hand-offs.
		"\x00\x00\x00\x01\x00\x00\x07\x01\x01\x02\x03\x01\x07\x00\x03\x11",
		// everything, interleaved.
		"\x00\x00\x00\x01\x00\x02\x02\x00\x01\x01\x03\x21\x04\x00\x05\x20\x06\x00\x07\x02\x01\x00\x03\x10\x08\x00\x03\x01",
		// a paused rail: claims and hand-offs leave it alone, then resumed.
		"\x00\x00\x00\x00\x01\x00\x0a\x00\x03\x01\x01\x00\x0b\x00\x01\x00\x0a\x01\x03\x01\x0b\x01\x01\x00",
		// outcomes sent again after they were recorded, one with a hand-off since.
		"\x00\x00\x00\x00\x01\x00\x03\x01\x09\x00\x03\x00\x09\x01\x00\x01\x01\x00\x03\x20\x09\x02",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 48 {
			ops = ops[:48]
		}
		m := &transitions{b: setupRecord(t)}
		for i := 0; i+1 < len(ops); i += 2 {
			m.step(t, ops[i], ops[i+1])
			m.verify(t)
		}
		m.drain(t)
		m.verify(t)
	})
}

func (m *transitions) fail(t *testing.T, format string, args ...any) {
	t.Helper()
	t.Fatalf("%s\nafter: %s", fmt.Sprintf(format, args...), strings.Join(m.log, "; "))
}

// step makes move op with argument arg.
func (m *transitions) step(t *testing.T, op, arg byte) {
	t.Helper()
	b := m.b
	name := transitionOps[int(op)%len(transitionOps)]
	m.log = append(m.log, fmt.Sprintf("%s(%d)", name, arg))
	switch name {
	case "enqueue":
		m.n++
		b.enqueue(t, fuzzParticipants[int(arg)%len(fuzzParticipants)], fmt.Sprintf("k%d", m.n))
	case "claim", "claim-short":
		relayer, lease, limit := "r1", longLease, 1+int(arg)%3
		if name == "claim-short" {
			relayer, lease, limit = "r2", 30*time.Millisecond, 1
		}
		p := store.ClaimParams{RelayerID: relayer, Limit: limit, Leases: map[string]time.Duration{"sandbox": lease}}
		claimed, err := b.st.Claim(b.ctx, b.pool, p)
		if err == nil && len(claimed) == 0 {
			p.Suspects, p.Limit = true, 1
			claimed, err = b.st.Claim(b.ctx, b.pool, p)
		}
		if err != nil {
			m.fail(t, "claim: %v", err)
		}
		for _, c := range claimed {
			m.held = append(m.held, heldClaim{c: c, relayer: relayer})
		}
	case "outcome":
		if len(m.held) == 0 {
			return
		}
		i := int(arg) % len(m.held)
		h := m.held[i]
		m.held = append(m.held[:i], m.held[i+1:]...)
		o := recordOutcome(t, h.c, h.relayer, []store.State{store.Dispatched, store.Retryable, store.Failed}[int(arg>>4)%3])
		var hp store.HandoffParams
		if arg&1 == 1 {
			hp = store.HandoffParams{RelayerID: "r1", Limit: 2, Leases: map[string]time.Duration{"sandbox": longLease}}
		}
		rec, handed, err := b.st.Record(b.ctx, b.pool, []store.Outcome{o}, hp)
		if err != nil {
			m.fail(t, "outcome %s of %s: %v", o.State, h.c.OutboxID, err)
		}
		if len(rec) != 1 {
			m.fail(t, "outcome of %s: recorded %d", h.c.OutboxID, len(rec))
		}
		for _, c := range handed {
			m.held = append(m.held, heldClaim{c: c, relayer: "r1"})
		}
		m.recorded = append(m.recorded, o)
	case "pause", "resume":
		act := b.st.PauseRail
		if name == "resume" {
			act = b.st.ResumeRail
		}
		rail := []string{"sandbox", "*"}[int(arg)%2]
		if _, err := act(b.ctx, b.pool, rail, "fuzz-operator", "fuzzing"); err != nil {
			m.fail(t, "%s %s: %v", name, rail, err)
		}
	case "resend":
		if len(m.recorded) == 0 {
			return
		}
		o := m.recorded[int(arg)%len(m.recorded)]
		if _, _, err := b.st.Record(b.ctx, b.pool, []store.Outcome{o}, store.HandoffParams{}); err != nil {
			m.fail(t, "outcome %s of %s sent again: %v", o.State, o.OutboxID, err)
		}
	case "reap":
		var short []store.Claimed
		for _, h := range m.held {
			if h.relayer == "r2" {
				short = append(short, h.c)
			}
		}
		b.waitExpired(t, short...)
		requeued, err := b.st.Reap(b.ctx, b.pool, 100, "fuzz-reaper", 3)
		if err != nil {
			m.fail(t, "reap: %v", err)
		}
		for _, q := range requeued {
			kept := m.held[:0]
			for _, h := range m.held {
				if h.c.OutboxID == q.OutboxID && h.c.AttemptNo == q.AttemptNo {
					m.reaped = append(m.reaped, reapedClaim{c: h.c})
					continue
				}
				kept = append(kept, h)
			}
			m.held = kept
		}
	case "late-outcome":
		if len(m.reaped) == 0 {
			return
		}
		i := int(arg) % len(m.reaped)
		r := &m.reaped[i]
		if r.sent == nil {
			o := recordOutcome(t, r.c, "r2", []store.State{store.Dispatched, store.Failed}[int(arg>>4)%2])
			r.sent = &o
		}
		o := *r.sent
		if arg&4 == 0 { // else the same outcome may be sent again (a write whose reply was lost)
			m.reaped = append(m.reaped[:i], m.reaped[i+1:]...)
		}
		if _, _, err := b.st.Record(b.ctx, b.pool, []store.Outcome{o}, store.HandoffParams{}); err != nil {
			m.fail(t, "late outcome %s of %s: %v", o.State, o.OutboxID, err)
		}
	case "replay", "acknowledge":
		dls, err := b.st.DeadLetters(b.ctx, b.pool, false, 100)
		if err != nil {
			m.fail(t, "dead letters: %v", err)
		}
		if len(dls) == 0 {
			return
		}
		id := dls[int(arg)%len(dls)].OutboxID
		act := b.st.Replay
		if name == "acknowledge" {
			act = b.st.Acknowledge
		}
		if done, err := act(b.ctx, b.pool, id, "fuzz-operator", "fuzzing"); err != nil || !done {
			m.fail(t, "%s %s: %v, done %v", name, id, err, done)
		}
	case "cancel":
		rows, err := b.st.ListPending(b.ctx, b.pool, store.PendingFilter{})
		if err != nil {
			m.fail(t, "list pending: %v", err)
		}
		if len(rows) == 0 {
			return
		}
		id := rows[int(arg)%len(rows)].OutboxID
		if done, err := b.st.Cancel(b.ctx, b.pool, id, "fuzz-operator", "fuzzing"); err != nil || !done {
			m.fail(t, "cancel %s: %v, done %v", id, err, done)
		}
	}
}

// verify runs audit verify with ordering and fails on any violation.
func (m *transitions) verify(t *testing.T) {
	t.Helper()
	r, err := m.b.st.Verify(m.b.ctx, m.b.pool, store.VerifyOptions{Ordered: true})
	if err != nil {
		m.fail(t, "verify: %v", err)
	}
	if len(r.Violations) > 0 {
		m.fail(t, "verify: %+v", r.Violations)
	}
}

// drain records the claims held, reaps what is left, then claims and
// dispatches until nothing is pending or in flight.
func (m *transitions) drain(t *testing.T) {
	t.Helper()
	b := m.b
	m.log = append(m.log, "drain")
	for _, rail := range []string{"sandbox", "*"} {
		if _, err := b.st.ResumeRail(b.ctx, b.pool, rail, "fuzz-operator", "draining"); err != nil {
			m.fail(t, "resume %s: %v", rail, err)
		}
	}
	for round := 0; ; round++ {
		if round > 200 {
			m.fail(t, "not drained after 200 rounds")
		}
		for _, h := range m.held {
			if _, _, err := b.st.Record(b.ctx, b.pool, []store.Outcome{recordOutcome(t, h.c, h.relayer, store.Dispatched)}, store.HandoffParams{}); err != nil {
				m.fail(t, "drain: outcome of %s: %v", h.c.OutboxID, err)
			}
		}
		m.held = nil
		var pending, inflight int
		if err := b.pool.QueryRow(b.ctx, `SELECT (SELECT count(*) FROM outbox.pending), (SELECT count(*) FROM outbox.inflight)`).Scan(&pending, &inflight); err != nil {
			t.Fatal(err)
		}
		if pending == 0 && inflight == 0 {
			return
		}
		if inflight > 0 { // claims of ours already reaped, or never held: the reaper's
			m.step(t, 4, 0)
		}
		// Retries wait out their backoff: make them due.
		if _, err := b.pool.Exec(b.ctx, `UPDATE outbox.pending SET next_attempt_at = now() WHERE next_attempt_at > now() AND next_attempt_at < 'infinity'`); err != nil {
			t.Fatal(err)
		}
		m.step(t, 1, 2)
	}
}
