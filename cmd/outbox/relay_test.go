package main

import (
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
)

// deadDatabaseURL is passed to commands expected to stop before they
// connect: without a URL db.connect would start an embedded cluster.
const deadDatabaseURL = "postgres://nobody@127.0.0.1:1/nowhere?sslmode=disable&connect_timeout=1"

// TestFormerFlagNameNeverBeatsTheCommandLine guards "flags win over the
// environment" for a flag with a former name: --admin-addr and
// --metrics-addr set one value, and OUTBOX_METRICS_ADDR (left over from an
// older deployment) overrode --admin-addr given on the command line.
func TestFormerFlagNameNeverBeatsTheCommandLine(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		vars map[string]string
		args []string
		want string
	}{
		{"current name on the command line", map[string]string{"OUTBOX_METRICS_ADDR": "0.0.0.0:9464"},
			[]string{"--admin-addr", "127.0.0.1:9500"}, "127.0.0.1:9500"},
		{"former name on the command line", map[string]string{"OUTBOX_ADMIN_ADDR": "0.0.0.0:9464"},
			[]string{"--metrics-addr", "127.0.0.1:9500"}, "127.0.0.1:9500"},
		{"both variables: the current name's wins", map[string]string{"OUTBOX_ADMIN_ADDR": "127.0.0.1:9500", "OUTBOX_METRICS_ADDR": "0.0.0.0:9464"},
			nil, "127.0.0.1:9500"},
		{"only the former name's variable", map[string]string{"OUTBOX_METRICS_ADDR": "127.0.0.1:9500"},
			nil, "127.0.0.1:9500"},
	} {
		env := &environment{stdout: io.Discard, stderr: io.Discard, getenv: func(k string) string { return tt.vars[k] }}
		fs := newFlagSet(env, "relay", "relay")
		var rf relayFlags
		rf.register(fs)
		if _, err := parseFlags(fs, env, tt.args); err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if rf.adminAddr != tt.want {
			t.Errorf("%s: admin address %q, want %q", tt.name, rf.adminAddr, tt.want)
		}
	}
}

// TestRelayRefusesNegativeRailDefaults guards against a negative
// --rail-timeout or --rail-max-concurrency being silently replaced by the
// default; the rails file refuses the same values.
func TestRelayRefusesNegativeRailDefaults(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"--rail-timeout", "-5s"}, {"--rail-max-concurrency", "-1"}} {
		env := &environment{stdout: io.Discard, stderr: io.Discard, getenv: func(string) string { return "" }}
		fs := newFlagSet(env, "relay", "relay")
		var rf relayFlags
		rf.register(fs)
		if _, err := parseFlags(fs, env, args); err != nil {
			t.Fatal(err)
		}
		if _, err := rf.loadRails(slog.New(slog.DiscardHandler)); !errors.Is(err, errNegativeRailDefault) {
			t.Errorf("%v: loadRails = %v, want errNegativeRailDefault", args, err)
		}
		r := invokeCLI(t, nil, "", append([]string{"relay", "--database-url", deadDatabaseURL}, args...)...)
		requireExit(t, r, 2)
		if !strings.Contains(r.stderr, args[0]+" "+args[1]+" must not be negative") {
			t.Errorf("%v: stderr does not name the flag: %s", args, r.stderr)
		}
	}
}

// TestDemoRefusesFlagsItWouldIgnore guards `outbox demo` against taking
// relay flags it does not honour: it builds its own sandbox rails and names
// its relayers, so --rails-config, --relayer-id and the admin database URLs
// are unknown flags (a usage error), not silently ignored; and a negative
// rail default is refused as by relay.
func TestDemoRefusesFlagsItWouldIgnore(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--rails-config", "/nonexistent/rails.json"}, "flag provided but not defined: -rails-config"},
		{[]string{"--relayer-id", "r1"}, "flag provided but not defined: -relayer-id"},
		{[]string{"--admin-database-url", deadDatabaseURL}, "flag provided but not defined: -admin-database-url"},
		{[]string{"--admin-audit-database-url", deadDatabaseURL}, "flag provided but not defined: -admin-audit-database-url"},
		{[]string{"--rail-timeout", "-1s"}, "--rail-timeout -1s must not be negative"},
		{[]string{"--rail-max-concurrency", "-1"}, "--rail-max-concurrency -1 must not be negative"},
	} {
		r := invokeCLI(t, nil, "", append([]string{"demo", "--database-url", deadDatabaseURL}, tt.args...)...)
		requireExit(t, r, 2)
		if !strings.Contains(r.stderr, tt.want) {
			t.Errorf("%v: stderr lacks %q: %s", tt.args, tt.want, r.stderr)
		}
	}
}
