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

// exportCancelled enqueues an instruction, cancels it, and exports this
// month's partition to out: it returns the month's partition, the export
// (which has the CANCELLED row) and its checksum.
func (b *cliBundle) exportCancelled(t *testing.T, out string) (month, data, sum string) {
	t.Helper()
	r := b.cli(t, inputJSON("p1", "k1", "100"), "enqueue")
	requireExit(t, r, 0)
	requireExit(t, b.cli(t, "", "cancel", "--operator", "alice", "--reason", "recalled",
		decodeEnqueueLine(t, stdoutLines(t, r.stdout)[0]).outboxID), 0)
	month = "attempts_" + time.Now().UTC().Format("2006_01")
	requireExit(t, b.cli(t, "", "archive", "--partition", month, "--out", out, "export"), 0)
	data, sum = readExport(t, out)
	if !strings.Contains(data, "CANCELLED") {
		t.Fatalf("the export has no CANCELLED row:\n%s", data)
	}
	return month, data, sum
}

// TestArchiveExportFailureKeepsTheEarlierCopy: an export that fails (here
// a partition name mistyped) leaves the export already at --out and its
// checksum file as they were, and no half-written file beside them. It
// used to create (truncate) the file before asking the database anything
// and then remove it, so a mistyped re-run deleted the month's only copy.
func TestArchiveExportFailureKeepsTheEarlierCopy(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	dir := t.TempDir()
	out := filepath.Join(dir, "month.csv")
	month, data, sum := b.exportCancelled(t, out)

	r := b.cli(t, "", "archive", "--partition", month+"_typo", "--out", out, "export")
	requireExit(t, r, 1)
	if !strings.Contains(r.stderr, "not a partition") {
		t.Fatalf("export of an unknown partition:\n%s", r)
	}
	if d, s := readExport(t, out); d != data || s != sum {
		t.Fatalf("a failed export changed the earlier copy:\nbefore %q %q\nafter %q %q", data, sum, d, s)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 2 {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Fatalf("a failed export left files beside the export: %v", names)
	}
}

// TestArchiveExportIsTheSameUnderAnyTimeZone: two exports of one month
// are the same bytes (and checksum) whatever the database's or the
// session's TimeZone, DateStyle and bytea_output: an auditor compares a
// re-export with the copy and checksum kept. The CSV's times used to be
// written in the session's time zone and date style.
func TestArchiveExportIsTheSameUnderAnyTimeZone(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	dir := t.TempDir()
	month, want, _ := b.exportCancelled(t, filepath.Join(dir, "utc.csv"))
	// The database's own settings, as a platform outside UTC has them.
	if _, err := b.pool.Exec(b.ctx, `DO $$ BEGIN
		EXECUTE format('ALTER DATABASE %I SET TimeZone = %L', current_database(), 'Pacific/Chatham');
		EXECUTE format('ALTER DATABASE %I SET DateStyle = %L', current_database(), 'SQL, DMY');
		EXECUTE format('ALTER DATABASE %I SET bytea_output = %L', current_database(), 'escape');
	END $$`); err != nil {
		t.Fatal(err)
	}
	local := filepath.Join(dir, "local.csv")
	requireExit(t, b.cli(t, "", "archive", "--partition", month, "--out", local, "export"), 0)
	if got, _ := readExport(t, local); got != want {
		t.Fatalf("the export depends on the session's settings:\nUTC:\n%s\nPacific/Chatham, SQL dates, escaped bytea:\n%s", want, got)
	}
}

// readExport returns an export and its checksum file, checking that the
// checksum is the export's.
func readExport(t *testing.T, out string) (data, sum string) {
	t.Helper()
	d, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	s, err := os.ReadFile(out + ".sha256")
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256(d)
	if want := hex.EncodeToString(h[:]) + "  " + filepath.Base(out) + "\n"; string(s) != want {
		t.Fatalf("checksum file %q, want %q", s, want)
	}
	return string(d), string(s)
}

// TestArchiveMoveDefault: this month's rows, written while it had no
// partition, are in the default partition, where partition upkeep cannot
// create the month; `archive move-default` moves them into a partition of
// their own, which then exports like any month.
func TestArchiveMoveDefault(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	month := "attempts_" + time.Now().UTC().Format("2006_01")
	if _, err := b.pool.Exec(b.ctx, "DROP TABLE outbox."+month); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "month.csv")
	r := b.cli(t, "", "archive", "--partition", month, "--out", out, "export")
	requireExit(t, r, 1) // no such partition: the rows below go to the default one
	r = b.cli(t, inputJSON("p1", "k1", "100"), "enqueue")
	requireExit(t, r, 0)
	requireExit(t, b.cli(t, "", "cancel", "--operator", "alice", "--reason", "recalled",
		decodeEnqueueLine(t, stdoutLines(t, r.stdout)[0]).outboxID), 0)

	r = b.cli(t, "", "archive", "move-default")
	requireExit(t, r, 0)
	var got struct {
		Moved []struct {
			Partition string `json:"partition"`
			Rows      int64  `json:"rows"`
		} `json:"moved"`
		OK bool `json:"ok"`
	}
	if err := json.Unmarshal([]byte(stdoutLines(t, r.stdout)[0]), &got); err != nil {
		t.Fatal(err)
	}
	if !got.OK || len(got.Moved) != 1 || got.Moved[0].Partition != month || got.Moved[0].Rows != 1 {
		t.Fatalf("move-default: %+v, want %s's one row (the cancel's)\n%s", got, month, r)
	}
	requireExit(t, b.cli(t, "", "archive", "--partition", month, "--out", out, "export"), 0)
	if data, _ := readExport(t, out); !strings.Contains(data, "CANCELLED") {
		t.Fatalf("the moved month's export has no CANCELLED row:\n%s", data)
	}
}

// TestArchiveDurationFlagsOutOfRange: `archive --detach-lock-timeout`
// negative (it became a 1 ms lock wait) or beyond PostgreSQL's lock_timeout
// (refused by the server once the detach had begun), and `audit
// checkpoint --settle` negative (it became the default 5 s and took the
// checkpoint), are usage errors, exit 2, and nothing is written.
func TestArchiveDurationFlagsOutOfRange(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	for _, args := range [][]string{
		{"archive", "--detach-lock-timeout", "-1s", "--before", "2020-01", "detach"},
		{"archive", "--detach-lock-timeout", "720h", "--before", "2020-01", "detach"},
		{"archive", "--detach-lock-timeout", "-1s", "move-default"},
		{"audit", "--settle", "-5s", "checkpoint"},
	} {
		r := b.cli(t, "", args[0], args[1:]...)
		if r.code != 2 || r.stdout != "" || !strings.Contains(r.stderr, args[1]) {
			t.Errorf("%q: want exit 2 naming %s, got %s", args, args[1], r)
		}
	}
	var n int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox.checkpoints`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("refused commands took %d checkpoints", n)
	}
}
