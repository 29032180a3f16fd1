package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestArchiveCommands: list shows the months partition upkeep created, an
// export writes the partition as CSV with a checksum file that matches it,
// and detach refuses a month that is not over and a malformed one.
func TestArchiveCommands(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	r := b.cli(t, "", "enqueue", "--participant-id", "p1", "--instruction-id", "i1", "--idempotency-key", "k1",
		"--rail", "sandbox", "--amount-minor", "100", "--currency", "USD", "--destination", "acct-1")
	requireExit(t, r, 0)
	requireExit(t, b.cli(t, "", "reap"), 0) // nothing to reap; keeps the CLI path honest

	r = b.cli(t, "", "archive", "--exact", "list")
	requireExit(t, r, 0)
	month := "attempts_" + time.Now().UTC().Format("2006_01")
	var found bool
	for _, line := range stdoutLines(t, r.stdout) {
		var p map[string]any
		if err := json.Unmarshal([]byte(line), &p); err != nil {
			t.Fatal(err)
		}
		if p["partition"] == month {
			found = p["state"] == "attached" && p["from"] != nil && p["rows_exact"] == true
		}
	}
	if !found {
		t.Fatalf("archive list has no attached %s with its range:\n%s", month, r)
	}

	out := filepath.Join(t.TempDir(), "month.csv")
	r = b.cli(t, "", "archive", "--partition", month, "--out", out, "export")
	requireExit(t, r, 0)
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	sum, err := os.ReadFile(out + ".sha256")
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256(data)
	if want := hex.EncodeToString(h[:]) + "  month.csv\n"; string(sum) != want {
		t.Fatalf("checksum file %q, want %q", sum, want)
	}
	if !strings.HasPrefix(string(data), "attempt_id,") && !strings.Contains(strings.SplitN(string(data), "\n", 2)[0], "attempt_id") {
		t.Fatalf("no CSV header: %q", strings.SplitN(string(data), "\n", 2)[0])
	}
	requireExit(t, b.cli(t, "", "archive", "--partition", "pending", "--out", out, "export"), 1)

	next := time.Now().UTC().AddDate(0, 1, 0).Format("2006-01")
	r = b.cli(t, "", "archive", "--before", next, "detach")
	requireExit(t, r, 1)
	if !strings.Contains(r.stderr, "future") {
		t.Fatalf("detach of a month not over:\n%s", r)
	}
	requireExit(t, b.cli(t, "", "archive", "--before", "2026-13", "detach"), 2)
	requireExit(t, b.cli(t, "", "archive", "detach"), 2)
}
