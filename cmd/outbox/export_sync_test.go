package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// exportChildArgs, set in a child's environment, makes
// TestArchiveExportSyncsItsDirectory the child: it runs the command line
// it holds (JSON) and exits with its status.
const exportChildArgs = "OUTBOX_TEST_EXPORT_CHILD_ARGS"

// TestArchiveExportSyncsItsDirectory: `archive export` renames the
// export and its checksum over --out, and the renames are only on disk
// once the directory is synced. Without it, a machine that loses power
// after the command printed its checksum (and the operator, trusting it,
// has dropped the detached month the runbook says to keep only as long as
// the export) can come back with the earlier export at --out, or none.
// The command runs as a real process under strace, which shows each
// rename and each fsync; the directory must be fsync'd after the last
// rename. Before the fix only the two files were. Needs strace
// (OUTBOX_REQUIRE_STRACE=1 makes its absence a failure).
func TestArchiveExportSyncsItsDirectory(t *testing.T) {
	if args := os.Getenv(exportChildArgs); args != "" {
		var argv []string
		if err := json.Unmarshal([]byte(args), &argv); err != nil {
			t.Fatal(err)
		}
		env := &environment{stdin: strings.NewReader(""), stdout: os.Stdout, stderr: os.Stderr, getenv: func(string) string { return "" }}
		os.Exit(exitCode(env, run(t.Context(), env, argv)))
	}
	t.Parallel()
	strace, err := exec.LookPath("strace")
	if err != nil {
		if os.Getenv("OUTBOX_REQUIRE_STRACE") != "" {
			t.Fatal("strace is required (OUTBOX_REQUIRE_STRACE) but not found")
		}
		t.Skip("strace not found")
	}
	b := setupCLI(t)
	requireExit(t, b.cli(t, "", "enqueue", "--participant-id", "p1", "--instruction-id", "i1", "--idempotency-key", "k1",
		"--rail", "sandbox", "--amount-minor", "100", "--currency", "USD", "--destination", "acct-1"), 0)
	dir := t.TempDir()
	out := filepath.Join(dir, "month.csv")
	trace := filepath.Join(t.TempDir(), "strace.txt")
	argv, err := json.Marshal([]string{"archive", "--database-url", b.url, "--partition", "attempts_" + time.Now().UTC().Format("2006_01"), "--out", out, "export"})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), strace, "-f", "-qq", "-o", trace, "-e", "trace=openat,fsync,fdatasync,rename,renameat,renameat2,close",
		os.Args[0], "-test.run=^TestArchiveExportSyncsItsDirectory$", "-test.count=1")
	cmd.Env = append(os.Environ(), exportChildArgs+"="+string(argv))
	if output, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the export under strace: %v\n%s", err, output)
	}
	if _, err := os.Stat(out + ".sha256"); err != nil {
		t.Fatalf("the export did not finish: %v", err)
	}
	data, err := os.ReadFile(trace)
	if err != nil {
		t.Fatal(err)
	}
	// Each line: PID syscall(args) = result. Follow the directory's
	// descriptors (opened by name, until closed) and the renames onto out.
	call := regexp.MustCompile(`^\d+\s+(\w+)\((.*)\)\s+=\s+(-?\d+)`)
	dirFDs := map[string]bool{}
	lastRename, syncedAfter := -1, false
	for i, line := range strings.Split(string(data), "\n") {
		m := call.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		name, args, result := m[1], m[2], m[3]
		switch {
		case name == "openat" && strings.Contains(args, `"`+dir+`"`) && !strings.HasPrefix(result, "-"):
			dirFDs[result] = true
		case name == "close":
			delete(dirFDs, args)
		case strings.HasPrefix(name, "rename") && strings.Contains(args, `"`+out) && result == "0":
			lastRename, syncedAfter = i, false
		case (name == "fsync" || name == "fdatasync") && dirFDs[args] && lastRename >= 0 && result == "0":
			syncedAfter = true
		}
	}
	if lastRename < 0 {
		t.Fatalf("no rename onto %s in the trace:\n%s", out, data)
	}
	if !syncedAfter {
		t.Fatalf("the directory %s was not fsync'd after the export's last rename: a power loss may undo it", dir)
	}
}
