package main

import (
	"flag"
	"io"
	"log/slog"
	"testing"
	"time"
)

// TestDefaultHealBound: with `outbox relay`'s defaults (default rails, no
// flags) a zombie is back in pending within the main plan's 120 s: its
// lease (the rail's timeout + grace) runs out, and the next background
// reaper pass, at most one interval later, requeues it.
func TestDefaultHealBound(t *testing.T) {
	t.Parallel()
	var f relayFlags
	fs := flag.NewFlagSet("relay", flag.ContinueOnError)
	f.register(fs)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	built, err := f.loadRails(slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if !f.reaper {
		t.Fatal("the reaper is off by default")
	}
	for _, rail := range built.Set.Types() {
		lease := built.Set.Timeout(rail) + f.leaseGrace
		worst := lease + f.reaperInterval
		t.Logf("rail %s: lease %v, reaper interval %v: requeued at most %v after the claim", rail, lease, f.reaperInterval, worst)
		if worst > 120*time.Second {
			t.Errorf("rail %s: a zombie may wait %v before it is requeued, over the 120 s target", rail, worst)
		}
	}
}
