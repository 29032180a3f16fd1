package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestEnqueueUnstorableNumberDoesNotSinkItsBatch guards --batch against a
// metadata number jsonb cannot store (0e-20000: a display scale above
// numeric's 16383): it is refused up front as a validation error of its
// line, and the 9 good lines of the same batch are enqueued (PostgreSQL
// used to refuse the whole batch with SQLSTATE 22003).
func TestEnqueueUnstorableNumberDoesNotSinkItsBatch(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	var lines []string
	for i, key := range []string{"k1", "k2", "k3", "k4", "k5", "k-num", "k6", "k7", "k8", "k9"} {
		if key == "k-num" {
			lines = append(lines, inputJSON("p1", key, "100", "metadata", map[string]any{"n": json.Number("0e-20000")}))
			continue
		}
		lines = append(lines, inputJSON("p"+string(rune('a'+i)), key, "100"))
	}
	r := b.cli(t, strings.Join(lines, "\n"), "enqueue", "--batch", "10")
	requireExit(t, r, 1)
	want := make([]wantLine, 10)
	for i := range want {
		want[i] = wantReceipt(1)
	}
	want[5] = wantValidation("metadata")
	checkEnqueueOutput(t, r.stdout, want)
	if n := b.count(t, "idempotency_keys"); n != 9 {
		t.Fatalf("%d instructions enqueued, want the 9 good ones", n)
	}
}
