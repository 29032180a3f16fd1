package main

import (
	"strings"
	"testing"
)

// TestActionInputRefusedBeforeLookup: `dlq replay`, `dlq ack`, `cancel`
// and `rails pause`/`resume` with a name or a reason the archive refuses
// (a control or format character) exit 2 naming what is wrong, before any
// id is looked up, and write nothing. `dlq` looked each id up first and
// checked the reason only on acting, so an unknown id printed "done":
// false, "not an open dead letter" and exited 1 for input never
// acceptable; `cancel` and `rails` stopped with exit status 1.
func TestActionInputRefusedBeforeLookup(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	unknown := uuidV7(t).String()
	for _, args := range [][]string{
		{"dlq", "--reason", "a\u202ereversed", "replay", unknown},
		{"dlq", "--reason", "bell\x07", "ack", unknown},
		{"dlq", "--operator", "al\nice", "--reason", "why", "replay", unknown},
		{"cancel", "--reason", "two\nlines", unknown},
		{"rails", "--reason", "a\u202ereversed", "pause", "sandbox"},
		{"rails", "--reason", "a\u202ereversed", "resume", "sandbox"},
	} {
		r := b.cli(t, "", args[0], args[1:]...)
		if r.code != 2 || !strings.Contains(r.stderr, "control or format character") || r.stdout != "" {
			t.Errorf("%q: %s\nwant exit 2 naming the control character, nothing on stdout", args, r)
		}
	}
	if n := b.count(t, "attempts"); n != 0 {
		t.Errorf("%d archive rows written", n)
	}
}
