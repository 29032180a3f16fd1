package engine_test

import (
	"testing"

	"github.com/ledgerline/outbox/attempts"
	"github.com/ledgerline/outbox/engine"
)

// TestRecordedIsNameable: a program can build and read an
// engine.Recorded with names of the public API only (an OnRecorded
// observer's test, say). Recorded embedded an internal type: its fields
// could be read but the types not named, so no such value could be made
// outside the module.
func TestRecordedIsNameable(t *testing.T) {
	t.Parallel()
	rec := engine.Recorded{Outcome: engine.Outcome{
		Identity: engine.Identity{InstructionID: "i-1", RailType: "sandbox"},
		State:    attempts.Dispatched,
	}}
	if rec.Result() != engine.ResultDispatched || rec.InstructionID != "i-1" {
		t.Errorf("Recorded %+v: result %s", rec, rec.Result())
	}
}
