package main

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ledgerline/outbox/admin"
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
		rf, err := parseRelayFlags(tt.vars, tt.args)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if rf.adminAddr != tt.want {
			t.Errorf("%s: admin address %q, want %q", tt.name, rf.adminAddr, tt.want)
		}
	}
}

// parseRelayFlags parses args as `outbox relay` does, with vars as the
// environment.
func parseRelayFlags(vars map[string]string, args []string) (relayFlags, error) {
	env := &environment{stdout: io.Discard, stderr: io.Discard, getenv: func(k string) string { return vars[k] }}
	fs := newFlagSet(env, "relay", "relay")
	var rf relayFlags
	rf.register(fs)
	_, err := parseFlags(fs, env, args)
	return rf, err
}

// TestRelayRefusesNegativeRailDefaults guards against a negative
// --rail-timeout or --rail-max-concurrency being silently replaced by the
// default; the rails file refuses the same values.
func TestRelayRefusesNegativeRailDefaults(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"--rail-timeout", "-5s"}, {"--rail-max-concurrency", "-1"}} {
		rf, err := parseRelayFlags(nil, args)
		if err != nil {
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

// TestRelayRefusesIntervalsThatCannotWork: a --lease-grace below
// engine.MinLeaseGrace (the outcome's write would outlast the lease), a
// --poll-interval past engine.MaxPollInterval, a --reaper-interval past
// reaper.MaxInterval, a --min-retry-delay past engine.MaxMinRetryDelay or
// below 0, or a --max-conns below 0 or past a pool's int32 is a usage
// error, exit 2, naming the setting, before anything
// connects.
func TestRelayRefusesIntervalsThatCannotWork(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--lease-grace", "100ms"}, "LeaseGrace 100ms is below 1s"},
		{[]string{"--poll-interval", "2h"}, "PollInterval 2h0m0s is past 1h0m0s"},
		{[]string{"--reaper-interval", "2000000h"}, "interval 2000000h0m0s is past the maximum 1h0m0s"},
		// A flipped sign silently meant the default pool; past int32 the
		// size wrapped, 4294967297 to a pool of one connection.
		{[]string{"--max-conns", "-4"}, "--max-conns -4 is out of range"},
		{[]string{"--max-conns", "4294967297"}, "--max-conns 4294967297 is out of range"},
		{[]string{"--min-retry-delay", "2h"}, "MinRetryDelay 2h0m0s is past 1h0m0s"},
		{[]string{"--min-retry-delay", "-1s"}, "MinRetryDelay -1s is negative"},
	} {
		r := invokeCLI(t, nil, "", append([]string{"relay", "--database-url", deadDatabaseURL}, tt.args...)...)
		requireExit(t, r, 2)
		if !strings.Contains(r.stderr, tt.want) {
			t.Errorf("%v: stderr does not say %q: %s", tt.args, tt.want, r.stderr)
		}
	}
}

// TestRelayRefusesNoSecretCheckInterval: secret files are read again
// every --secret-check-interval, which must be positive (a ticker of
// zero would panic; there is no "never": SIGHUP alone is not a schedule).
func TestRelayRefusesNoSecretCheckInterval(t *testing.T) {
	t.Parallel()
	r := invokeCLI(t, nil, "", "relay", "--database-url", deadDatabaseURL, "--secret-check-interval", "0s")
	requireExit(t, r, 2)
	if !strings.Contains(r.stderr, "--secret-check-interval must be positive") {
		t.Errorf("stderr does not name the flag: %s", r.stderr)
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

// TestAdminTokensRefuseDuplicatesAcrossSources: --admin-tokens-file and
// --admin-tokens-env are joined, and a name or a secret in both is
// refused (naming the tokens and both sources, never the secret), as
// within one source: otherwise the archive's "who" or a request's role
// would depend on which of two tokens matched.
func TestAdminTokensRefuseDuplicatesAcrossSources(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(file, []byte("operator oscar oscar-secret-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, env, want string
	}{
		{"distinct", "auditor audra audra-secret-0123456789", ""},
		{"a name in both", "auditor oscar audra-secret-0123456789", "token oscar is defined twice"},
		{"a secret in both", "auditor audra oscar-secret-0123456789", "tokens oscar and audra share a secret"},
	} {
		env := &environment{stdout: io.Discard, stderr: io.Discard, getenv: func(k string) string {
			if k == "OPS_TOKENS" {
				return tt.env
			}
			return ""
		}}
		rf := relayFlags{adminTokensFile: file, adminTokensEnv: "OPS_TOKENS"}
		toks, err := rf.adminTokens(env)
		switch {
		case tt.want == "" && (err != nil || len(toks) != 2):
			t.Errorf("%s: %d tokens, %v", tt.name, len(toks), err)
		case tt.want != "" && (!errors.Is(err, admin.ErrTokens) || !strings.Contains(err.Error(), tt.want) ||
			!strings.Contains(err.Error(), file) || !strings.Contains(err.Error(), "$OPS_TOKENS") || strings.Contains(err.Error(), "secret-0123456789")):
			t.Errorf("%s: %v, want ErrTokens naming both sources and %q (not the secret)", tt.name, err, tt.want)
		}
	}
}

// TestAdminTokensFileReadableByOthersIsRefused: whoever reads the admin
// tokens file can sign in as an operator and replay, cancel or pause
// payments, as whoever reads a webhook secret file can sign them; that
// one is refused when others can read it, and the tokens file was read
// whatever its mode. A file others can read (or that its group can write)
// is refused, naming the fix and never a secret; one readable by its
// owner or its group is read, and --admin-tokens-allow-world-readable (or
// OUTBOX_ADMIN_TOKENS_ALLOW_WORLD_READABLE) accepts any.
func TestAdminTokensFileReadableByOthersIsRefused(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(file, []byte("operator oscar oscar-secret-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := &environment{stdout: io.Discard, stderr: io.Discard, getenv: func(string) string { return "" }}
	for _, tt := range []struct {
		mode    os.FileMode
		allow   []string
		refused bool
	}{
		{0o600, nil, false},
		{0o640, nil, false},
		{0o644, nil, true},
		{0o660, nil, true},
		{0o604, nil, true},
		{0o644, []string{"--admin-tokens-allow-world-readable"}, false},
	} {
		if err := os.Chmod(file, tt.mode); err != nil {
			t.Fatal(err)
		}
		rf, err := parseRelayFlags(map[string]string{"OUTBOX_ADMIN_TOKENS_FILE": file}, tt.allow)
		if err != nil {
			t.Fatalf("%04o %v: %v", tt.mode, tt.allow, err)
		}
		toks, err := rf.adminTokens(env)
		switch {
		case !tt.refused && (err != nil || len(toks) != 1):
			t.Errorf("%04o %v: %d tokens, %v", tt.mode, tt.allow, len(toks), err)
		case tt.refused && (!errors.Is(err, admin.ErrTokens) || !strings.Contains(err.Error(), file) || !strings.Contains(err.Error(), "chmod 600") ||
			strings.Contains(err.Error(), "secret-0123456789") || toks != nil):
			t.Errorf("%04o: %d tokens, %v; want ErrTokens naming the file and the fix (not the secret)", tt.mode, len(toks), err)
		}
	}
	rf, err := parseRelayFlags(map[string]string{"OUTBOX_ADMIN_TOKENS_FILE": file, "OUTBOX_ADMIN_TOKENS_ALLOW_WORLD_READABLE": "true"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if toks, err := rf.adminTokens(env); err != nil || len(toks) != 1 {
		t.Errorf("OUTBOX_ADMIN_TOKENS_ALLOW_WORLD_READABLE: %d tokens, %v", len(toks), err)
	}
}

// TestAdminCookieSecureFlag: --admin-cookie-secure (or
// OUTBOX_ADMIN_COOKIE_SECURE) asks for a Secure session cookie behind a
// TLS-terminating proxy; without it, the cookie is Secure only over TLS
// to this process (admin.Config.SecureCookie false).
func TestAdminCookieSecureFlag(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		vars map[string]string
		args []string
		want bool
	}{
		{"default", nil, nil, false},
		{"flag", nil, []string{"--admin-cookie-secure"}, true},
		{"environment", map[string]string{"OUTBOX_ADMIN_COOKIE_SECURE": "true"}, nil, true},
	} {
		rf, err := parseRelayFlags(tt.vars, tt.args)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if rf.adminCookieSecure != tt.want {
			t.Errorf("%s: adminCookieSecure %v, want %v", tt.name, rf.adminCookieSecure, tt.want)
		}
	}
}

// TestRelayWithoutRailsConfigWarns: without --rails-config the relayer
// claims the sandbox and event rail types and "pays" them into its own
// memory, so a relayer started so by mistake next to a real fleet would
// record real events delivered that went nowhere. It says so, loudly,
// and names the rail types; with a file it does not.
func TestRelayWithoutRailsConfigWarns(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "rails.json")
	if err := os.WriteFile(file, []byte(`{"transports": {"s": {"kind": "sandbox", "sandbox": {}}}, "rails": [{"type": "ach", "profile": "generic", "transport": "s"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		warn bool
	}{{nil, true}, {[]string{"--rails-config", file}, false}} {
		rf, err := parseRelayFlags(nil, tc.args)
		if err != nil {
			t.Fatal(err)
		}
		var logs bytes.Buffer
		if _, err := rf.loadRails(slog.New(slog.NewTextHandler(&logs, nil))); err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		warned := strings.Contains(logs.String(), "level=WARN") && strings.Contains(logs.String(), "no --rails-config") &&
			strings.Contains(logs.String(), "event")
		if warned != tc.warn {
			t.Errorf("%v: warned %v, want %v: %s", tc.args, warned, tc.warn, logs.String())
		}
	}
}
