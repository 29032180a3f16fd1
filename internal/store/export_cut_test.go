package store_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ledgerline/outbox/internal/store"
)

// TestCheckpointsExportCutShortIsRefused: an export cut short at any
// line's end, or mid-line, or with a checkpoint line removed or a line
// added after its end, is refused with ErrCheckpointsExport; before the
// export had its first and end lines, a cut at a line's end was a valid
// shorter export, and verify compared fewer checkpoints than the auditor
// kept without saying so. An export of an earlier build (checkpoint lines
// alone) is still read.
func TestCheckpointsExportCutShortIsRefused(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	var cps []store.Checkpoint
	var prev []byte
	for i := range 3 {
		h := bytes.Repeat([]byte{byte(i + 1)}, 32)
		cps = append(cps, store.Checkpoint{PeriodStart: start.Add(time.Duration(i) * time.Minute), PeriodEnd: start.Add(time.Duration(i+1) * time.Minute),
			Rows: int64(10 * i), Digest: bytes.Repeat([]byte{0xd0 + byte(i)}, 32), PrevHash: prev, Hash: h})
		prev = h
	}
	var buf bytes.Buffer
	if err := store.WriteCheckpoints(&buf, cps); err != nil {
		t.Fatal(err)
	}
	whole := buf.String()
	lines := strings.SplitAfter(strings.TrimSuffix(whole, "\n"), "\n")
	if len(lines) != 5 {
		t.Fatalf("the export has %d lines, want a first line, 3 checkpoints and an end line:\n%s", len(lines), whole)
	}
	read := func(s string) ([]store.Checkpoint, error) { return store.ReadCheckpoints(strings.NewReader(s)) }
	if got, err := read(whole); err != nil || len(got) != 3 || !bytes.Equal(got[2].Hash, cps[2].Hash) {
		t.Fatalf("the whole export: %d checkpoints, %v", len(got), err)
	}
	refused := map[string]string{
		"cut mid-line":                whole[:len(whole)-10],
		"a checkpoint line removed":   lines[0] + lines[1] + lines[3] + lines[4],
		"a line after the end line":   whole + lines[1],
		"the first line not first":    lines[1] + lines[0] + lines[2] + lines[3] + lines[4],
		"two first lines":             lines[0] + whole,
		"a line that is not a record": lines[0] + lines[1] + `{"period_start": "2026-11-01T00:00:00Z", "extra": 1}` + "\n" + lines[4],
	}
	for k := 1; k < len(lines); k++ {
		refused["cut after line "+string(rune('0'+k))] = strings.Join(lines[:k], "")
	}
	for name, export := range refused {
		if got, err := read(export); !errors.Is(err, store.ErrCheckpointsExport) {
			t.Errorf("%s: %d checkpoints, %v; want ErrCheckpointsExport", name, len(got), err)
		}
	}
	legacy := strings.Join(lines[1:4], "")
	if got, err := read(legacy); err != nil || len(got) != 3 {
		t.Errorf("an earlier build's export (checkpoint lines alone): %d checkpoints, %v; want 3", len(got), err)
	}
	var empty bytes.Buffer
	if err := store.WriteCheckpoints(&empty, nil); err != nil {
		t.Fatal(err)
	}
	if got, err := read(empty.String()); err != nil || len(got) != 0 {
		t.Errorf("an export of no checkpoints: %d, %v; want none and no error", len(got), err)
	}
}
