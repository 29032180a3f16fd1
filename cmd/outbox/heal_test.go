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
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	built, err := f.loadRails(log)
	if err != nil {
		t.Fatal(err)
	}
	bound := f.serviceConfig("", built.Set, log).HealBound()
	t.Logf("a zombie is requeued at most %v after its claim", bound)
	if bound == 0 {
		t.Fatal("no reaper by default")
	}
	if bound > 120*time.Second {
		t.Errorf("a zombie may wait %v before it is requeued, over the 120 s target", bound)
	}
}
