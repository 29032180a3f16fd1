package main

import (
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"
)

// TestRailsPauseHoldsARailForTheFleet runs a relayer (the default rails,
// sandbox and event) and pauses the sandbox rail with the CLI: the event
// rail goes on; sandbox instructions stay pending, and with ordering on so
// does an event instruction queued behind one of its participant's; the
// resume sends them all, in order. list shows the pause and the record.
func TestRailsPauseHoldsARailForTheFleet(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() {
		env := &environment{stdin: strings.NewReader(""), stdout: io.Discard, stderr: io.Discard, getenv: func(string) string { return "" }}
		done <- run(ctx, env, []string{"relay", "--database-url", b.url, "--relayer-id", "r-pause"})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("relay: %v", err)
		}
	}()

	requireExit(t, b.cli(t, "", "rails", "pause", "sandbox"), 2) // no reason
	requireExit(t, b.cli(t, "", "rails", "--reason", "x", "pause"), 2)
	r := b.cli(t, "", "rails", "--operator", "olga", "--reason", "bank maintenance", "--wait", "20s", "pause", "sandbox")
	requireExit(t, r, 0)
	var paused map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &paused); err != nil || paused["done"] != true || paused["quiet"] != true {
		t.Fatalf("pause: %s (%v)", r, err)
	}
	if !strings.Contains(r.stderr, "no instruction of rail type") {
		t.Errorf("pausing a rail with nothing pending does not warn: %s", r.stderr)
	}

	event := func(participant, key string) string {
		return `{"instruction_id": "ins-` + key + `", "participant_id": "` + participant + `", "idempotency_key": "` + key +
			`", "rail": "event", "metadata": {"kind": "usage"}}`
	}
	requireExit(t, b.cli(t, strings.Join([]string{
		inputJSON("p-held", "s1", "100"),
		event("p-held", "e-behind"), // behind its participant's sandbox instruction
		inputJSON("p-other", "s2", "200"),
		event("p-free", "e-free"),
	}, "\n"), "enqueue"), 0)
	dispatched := func(key string) bool {
		var n int
		if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox.attempts WHERE idempotency_key = $1 AND state = 'DISPATCHED'`, key).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting: %s", what)
			}
		}
	}
	waitFor("the free event instruction is dispatched", func() bool { return dispatched("e-free") })
	// The relayer is at work (it dispatched e-free after the others were
	// queued); give it a few more claims before looking.
	time.Sleep(300 * time.Millisecond)
	for _, key := range []string{"s1", "e-behind", "s2"} {
		if dispatched(key) {
			t.Fatalf("%s was dispatched while the sandbox rail was paused", key)
		}
	}
	r = b.cli(t, "", "rails", "list")
	requireExit(t, r, 0)
	if !strings.Contains(r.stdout, `"rail_type":"sandbox","paused_by":"olga","reason":"bank maintenance"`) {
		t.Fatalf("rails list: %s", r)
	}
	again := b.cli(t, "", "rails", "--reason", "again", "--wait", "0", "pause", "sandbox")
	requireExit(t, again, 0)
	if !strings.Contains(again.stdout, `"done":false`) {
		t.Fatalf("a second pause: %s", again)
	}

	requireExit(t, b.cli(t, "", "rails", "--operator", "olga", "--reason", "maintenance over", "resume", "sandbox"), 0)
	waitFor("the held instructions are dispatched", func() bool { return dispatched("s1") && dispatched("e-behind") && dispatched("s2") })
	var inOrder bool
	if err := b.pool.QueryRow(b.ctx, `SELECT (SELECT min(created_at) FROM outbox.attempts WHERE idempotency_key = 'e-behind' AND state = 'DISPATCHING')
		> (SELECT created_at FROM outbox.attempts WHERE idempotency_key = 's1' AND state = 'DISPATCHED')`).Scan(&inOrder); err != nil || !inOrder {
		t.Fatalf("e-behind was claimed before s1 was recorded (%v)", err)
	}
	r = b.cli(t, "", "rails", "resume", "sandbx", "--reason", "typo")
	requireExit(t, r, 1)
	if !strings.Contains(r.stderr, "was not paused") {
		t.Fatalf("resume of a rail that was not paused: %s", r)
	}
	r = b.cli(t, "", "rails", "--history", "5", "list")
	requireExit(t, r, 0)
	var list struct {
		Paused  []map[string]any `json:"paused"`
		History []struct {
			Action, Operator, Reason string
		} `json:"history"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil || len(list.Paused) != 0 || len(list.History) != 2 ||
		list.History[0].Action != "RESUMED" || list.History[0].Reason != "maintenance over" || list.History[1].Action != "PAUSED" {
		t.Fatalf("rails list after the resume: %s (%v)", r, err)
	}
}

// TestRailsPauseWarnsOfNothingPendingWithoutWaiting pauses with --wait 0,
// as the restore runbook does: a rail type nothing is pending for (a typo,
// a wrong case) is still warned of, and a rail that holds instructions, or
// every rail, is not.
func TestRailsPauseWarnsOfNothingPendingWithoutWaiting(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	requireExit(t, b.cli(t, inputJSON("p-1", "k-1", "100"), "enqueue"), 0)

	r := b.cli(t, "", "rails", "--reason", "bank maintenance", "--wait", "0", "pause", "Sandbox")
	requireExit(t, r, 0)
	if !strings.Contains(r.stderr, `no instruction of rail type "Sandbox" is pending`) {
		t.Errorf("a --wait 0 pause of a rail with nothing pending does not warn: %s", r)
	}
	for _, rail := range []string{"sandbox", "*"} {
		r = b.cli(t, "", "rails", "--reason", "bank maintenance", "--wait", "0", "pause", rail)
		requireExit(t, r, 0)
		if strings.Contains(r.stderr, "warning") {
			t.Errorf("a --wait 0 pause of %q, which holds an instruction, warns: %s", rail, r)
		}
	}
}
