package main

import (
	"strings"
	"testing"
)

// TestRelayRefusesReadinessFlagsWithoutAdminAddress: --degraded-after and
// --horizon-degraded-after set the thresholds of /readyz, which only the
// admin address serves; without --admin-addr they were taken and ignored,
// so a deployment that meant to tune its probes had none. Set on the
// command line, they are refused (exit 2, naming the flag) before
// anything is opened; through their variable (an environment other
// processes share), warned of; left at their defaults they are no
// trouble.
func TestRelayRefusesReadinessFlagsWithoutAdminAddress(t *testing.T) {
	t.Parallel()
	// A database nobody listens at, and --max-conns out of range, which
	// the relay refuses (exit 2) before it connects: the refusal of the
	// readiness flags must come before anything is opened, and the run
	// never reaches the database (a relay started while it is unreachable
	// waits for it).
	const nowhere = "postgres://nobody@127.0.0.1:1/none"
	for _, c := range []struct {
		vars map[string]string
		args []string
		flag string
	}{
		{nil, []string{"--degraded-after", "2m"}, "--degraded-after"},
		{nil, []string{"--horizon-degraded-after=10m"}, "--horizon-degraded-after"},
	} {
		r := invokeCLI(t, c.vars, "", append([]string{"relay", "--database-url", nowhere, "--max-conns", "-1"}, c.args...)...)
		if r.code != 2 || !strings.Contains(r.stderr, c.flag) || !strings.Contains(r.stderr, "--admin-addr") {
			t.Errorf("%v %q: %s\nwant exit 2 naming %s and --admin-addr", c.vars, c.args, r, c.flag)
		}
	}
	// Set through their variables (an environment several processes
	// share), they are warned of, not refused: the relay goes on to
	// --max-conns.
	for name, value := range map[string]string{"OUTBOX_DEGRADED_AFTER": "2m", "OUTBOX_HORIZON_DEGRADED_AFTER": "10m"} {
		r := invokeCLI(t, map[string]string{name: value}, "", "relay", "--database-url", nowhere, "--max-conns", "-1")
		if r.code != 2 || !strings.Contains(r.stderr, "--max-conns") || !strings.Contains(r.stderr, name) || !strings.Contains(r.stderr, "--admin-addr") {
			t.Errorf("%s=%s: %s\nwant a warning naming %s and --admin-addr, then the refusal of --max-conns", name, value, r, name)
		}
	}
	// Without either, or with --admin-addr, they are no trouble: the
	// relay goes on to --max-conns.
	for _, args := range [][]string{nil, {"--admin-addr", "127.0.0.1:0", "--degraded-after", "2m", "--horizon-degraded-after", "10m"}} {
		r := invokeCLI(t, nil, "", append([]string{"relay", "--database-url", nowhere, "--max-conns", "-1"}, args...)...)
		if r.code != 2 || !strings.Contains(r.stderr, "--max-conns") {
			t.Errorf("relay %q: %s\nwant the refusal of --max-conns", args, r)
		}
	}
}
