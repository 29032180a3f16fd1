package main

import (
	"strings"
	"testing"
)

// TestCancelCommand: cancel prints a line per outbox id and needs a
// reason; an id that is not pending says "done": false and makes the exit
// status 1 without undoing the others; the participant's next instruction
// becomes due, and audit verify counts the cancelled one.
func TestCancelCommand(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	r := b.cli(t, inputJSON("p1", "k1", "100")+"\n"+inputJSON("p1", "k2", "200"), "enqueue")
	requireExit(t, r, 0)
	lines := stdoutLines(t, r.stdout)
	first, second := decodeEnqueueLine(t, lines[0]).outboxID, decodeEnqueueLine(t, lines[1]).outboxID
	unknown := uuidV7(t).String()

	requireExit(t, b.cli(t, "", "cancel", first), 2) // no reason
	requireExit(t, b.cli(t, "", "cancel", "--reason", "x", "not-an-id"), 2)
	r = b.cli(t, "", "cancel", "--operator", "alice", "--reason", "customer recalled it", first, unknown)
	requireExit(t, r, 1)
	if lines := stdoutLines(t, r.stdout); len(lines) != 2 || !strings.Contains(lines[0], `"done":true`) ||
		!strings.Contains(lines[1], `"done":false`) || !strings.Contains(lines[1], "not pending") {
		t.Fatalf("cancel of a pending and an unknown id:\n%s", r)
	}
	var due bool
	if err := b.pool.QueryRow(b.ctx, `SELECT next_attempt_at <= now() FROM outbox.pending WHERE outbox_id = $1`, second).Scan(&due); err != nil || !due {
		t.Fatalf("the participant's next instruction is due: %v, %v", due, err)
	}
	r = b.cli(t, "", "audit", "verify")
	requireExit(t, r, 0)
	if !strings.Contains(r.stdout, `"cancelled":1`) {
		t.Fatalf("audit verify:\n%s", r)
	}
	r = b.cli(t, "", "audit", "trail", first)
	if requireExit(t, r, 0); !strings.Contains(r.stdout, `"state":"CANCELLED"`) || !strings.Contains(r.stdout, "cancelled by alice: customer recalled it") {
		t.Fatalf("trail:\n%s", r)
	}
}
