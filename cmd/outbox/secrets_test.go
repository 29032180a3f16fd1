package main

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/ledgerline/outbox/rails"
)

// TestSecretReportsSayWhatTheSecretDoes: the sandbox server checks the
// requests it gets against its secret and serves no rails; its log lines
// said a webhook secret signs requests, with an empty list of rails.
func TestSecretReportsSayWhatTheSecretDoes(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		role     secretRole
		railList []string
		want     []string
		notWant  []string
	}{
		{checkingSecret, nil,
			[]string{"sandbox rail's secret rotated: requests are checked against the secret its file holds now",
				"sandbox rail's secret file refused: requests are still checked against the secret in force"},
			[]string{"webhook", "signed", "rails="}},
		{signingSecret, []string{"psp"},
			[]string{"webhook secret rotated: requests are signed with the secret its file holds now",
				"webhook secret file refused: requests are still signed with the secret in force", "rails=[psp]"},
			[]string{"sandbox", "checked"}},
	} {
		var buf bytes.Buffer
		r := newSecretReporter(slog.New(slog.NewTextHandler(&buf, nil)), tt.role)
		r.report(rails.SecretReload{Source: "/run/secret", Rails: tt.railList, Changed: true})
		r.report(rails.SecretReload{Source: "/run/secret", Rails: tt.railList, Err: errors.New("world-readable")})
		out := buf.String()
		for _, s := range tt.want {
			if !strings.Contains(out, s) {
				t.Errorf("%s: log lacks %q:\n%s", tt.role.name, s, out)
			}
		}
		for _, s := range tt.notWant {
			if strings.Contains(out, s) {
				t.Errorf("%s: log says %q:\n%s", tt.role.name, s, out)
			}
		}
	}
}
