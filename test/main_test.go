// Package test holds the tests that cross packages and processes: the fault
// suite kills real relayer processes, restarts PostgreSQL, fails it over to
// its standby (directly and behind PgBouncer), kills PgBouncer, cuts and
// black-holes database connections and hangs the rail, then proves that nothing was lost, nothing was paid twice and every
// attempt the rail received is in the archive. It also kills the
// operator's and the producer's commands in the middle of their work
// (opcrash_test.go).
//
// Knobs (environment): OUTBOX_FAULT_ROUNDS (kill -9 drains, default 3;
// each run draws new seeds, so rounds add up over runs),
// OUTBOX_FAULT_INSTRUCTIONS (instructions per kill -9 drain and of the
// PostgreSQL restart drain, default 20000; the restart drain takes at least
// 5000; the other scenarios have fixed sizes),
// OUTBOX_FAULT_SEED (base seed, default: the clock; logged so a run can be
// repeated), OUTBOX_FAULT_LOGS=1 (print the relayers' and the sandbox's log
// tails even when the tests pass). `go test -short` skips the suite.
//
// When the tests run with the race detector, the outbox binary is built
// with it too, and a race reported by a relayer fails the suite.
package test

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/ledgerline/outbox/internal/testdb"
)

// outboxBin is the `outbox` binary built by TestMain ("" with -short).
var outboxBin string

// buildDirPrefix names the per-process build directories under
// os.TempDir(); a directory whose process is gone is removed by the next run.
const buildDirPrefix = "outbox-faults-"

func TestMain(m *testing.M) {
	flag.Parse()
	if !testing.Short() {
		bin, err := buildOutbox()
		if err != nil {
			fmt.Fprintln(os.Stderr, "fault suite:", err)
			os.Exit(1)
		}
		outboxBin = bin
	}
	testdb.Main(m)
}

// buildOutbox builds ./cmd/outbox into a directory named after this
// process and returns the binary's path. testdb.Main ends with os.Exit, so
// the directory cannot be removed after the tests; instead every run removes
// the directories of processes that no longer exist.
func buildOutbox() (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	removeStaleBuildDirs()
	dir := filepath.Join(os.TempDir(), buildDirPrefix+strconv.Itoa(os.Getpid()))
	if err := os.RemoveAll(dir); err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	// go test puts its own go first on PATH.
	goTool, err := exec.LookPath("go")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "outbox")
	args := []string{"build", "-o", bin}
	if raceBuild {
		args = append(args, "-race")
	}
	cmd := exec.Command(goTool, append(args, "./cmd/outbox")...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/outbox: %v\n%s", err, out)
	}
	return bin, nil
}

// moduleRoot is the parent of the test's working directory (test/ is one
// level below the module root), checked by its go.mod.
func moduleRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	root := filepath.Dir(wd)
	mod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		return "", fmt.Errorf("module root not found above %s: %w", wd, err)
	}
	if !bytes.Contains(mod, []byte("module github.com/ledgerline/outbox\n")) {
		return "", fmt.Errorf("%s/go.mod is not the outbox module", root)
	}
	return root, nil
}

// removeStaleBuildDirs removes build directories of earlier test processes
// that have exited.
func removeStaleBuildDirs() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), buildDirPrefix+"*")) // the pattern is valid
	for _, dir := range dirs {
		pid, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(dir), buildDirPrefix))
		if err != nil || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			os.RemoveAll(dir)
		}
	}
}
