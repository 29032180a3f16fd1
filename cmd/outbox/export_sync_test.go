package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
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
	// Follow the directory's descriptors (opened by name, until closed)
	// and the renames onto out, in the order the calls took effect.
	dirFDs := map[string]bool{}
	lastRename, syncedAfter := -1, false
	for i, c := range straceCalls(string(data)) {
		switch {
		case c.name == "openat" && strings.Contains(c.args, `"`+dir+`"`) && !strings.HasPrefix(c.result, "-"):
			dirFDs[c.result] = true
		case c.name == "close":
			delete(dirFDs, c.args)
		case strings.HasPrefix(c.name, "rename") && strings.Contains(c.args, `"`+out) && c.result == "0":
			lastRename, syncedAfter = i, false
		case (c.name == "fsync" || c.name == "fdatasync") && dirFDs[c.args] && lastRename >= 0 && c.result == "0":
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

// straceCall is one system call of an strace -f trace.
type straceCall struct {
	name, args, result string
	// at orders the calls: where the call's effect counts, its line, or
	// for a call strace split in two (another thread's call in between:
	// "<unfinished ...>", then "<... name resumed>"), the half that
	// matters. A descriptor is opened and a file renamed when the call
	// returns; a close and a sync act from when they begin (a sync that
	// began before a rename returned does not cover it).
	at int
}

// straceCalls parses an strace -f trace (lines "PID name(args) =
// result") into its calls in the order they took effect. A loaded
// machine splits calls of concurrent threads in two; a trace parsed line
// by line lost those, and with them the directory's sync.
func straceCalls(trace string) []straceCall {
	whole := regexp.MustCompile(`^(\d+)\s+(\w+)\((.*)\)\s+=\s+(-?\d+)`)
	unfinished := regexp.MustCompile(`^(\d+)\s+(\w+)\((.*?)\s*<unfinished \.\.\.>$`)
	resumed := regexp.MustCompile(`^(\d+)\s+<\.\.\. (\w+) resumed>\s*(.*)\)\s+=\s+(-?\d+)`)
	type begun struct {
		args string
		line int
	}
	open := map[string]begun{} // by pid and name
	var calls []straceCall
	add := func(name, args, result string, began, returned int) {
		at := returned
		if name == "close" || name == "fsync" || name == "fdatasync" {
			at = began
		}
		calls = append(calls, straceCall{name: name, args: args, result: result, at: at})
	}
	for i, line := range strings.Split(trace, "\n") {
		if m := unfinished.FindStringSubmatch(line); m != nil {
			open[m[1]+" "+m[2]] = begun{args: m[3], line: i}
		} else if m := resumed.FindStringSubmatch(line); m != nil {
			b, ok := open[m[1]+" "+m[2]]
			if !ok {
				continue
			}
			delete(open, m[1]+" "+m[2])
			add(m[2], b.args+m[3], m[4], b.line, i)
		} else if m := whole.FindStringSubmatch(line); m != nil {
			add(m[2], m[3], m[4], i, i)
		}
	}
	slices.SortStableFunc(calls, func(a, b straceCall) int { return a.at - b.at })
	return calls
}

// TestStraceCallsJoinsSplitCalls: a call strace split in two because
// another thread's call came in between is one call, ordered by the half
// where it takes effect. Read line by line, the directory's sync below
// was lost (make test failed TestArchiveExportSyncsItsDirectory on a
// loaded machine with a trace like it).
func TestStraceCallsJoinsSplitCalls(t *testing.T) {
	t.Parallel()
	trace := `100 openat(AT_FDCWD, "/d/out.tmp", O_RDWR|O_CREAT, 0600) = 5
100 renameat(AT_FDCWD, "/d/out.tmp", AT_FDCWD, "/d/out" <unfinished ...>
101 openat(AT_FDCWD, "/d", O_RDONLY|O_CLOEXEC <unfinished ...>
100 <... renameat resumed>) = 0
101 <... openat resumed>) = 7
101 fsync(7 <unfinished ...>
100 close(5) = 0
101 <... fsync resumed>) = 0
101 close(7) = 0`
	var got []string
	for _, c := range straceCalls(trace) {
		got = append(got, c.name+"("+c.args+")="+c.result)
	}
	want := []string{
		`openat(AT_FDCWD, "/d/out.tmp", O_RDWR|O_CREAT, 0600)=5`,
		`renameat(AT_FDCWD, "/d/out.tmp", AT_FDCWD, "/d/out")=0`,
		`openat(AT_FDCWD, "/d", O_RDONLY|O_CLOEXEC)=7`,
		`fsync(7)=0`,
		`close(5)=0`,
		`close(7)=0`,
	}
	if !slices.Equal(got, want) {
		t.Fatalf("calls:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
