// Package deploy holds what runs beside the outbox: Prometheus alert rules
// (prometheus/outbox-rules.yml, with promtool unit tests) and a Grafana
// dashboard (grafana/outbox-dashboard.json). Its tests check both with
// promtool and against the metrics a relay service really exports.
package deploy

import (
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ledgerline/outbox/engine"
	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/rails"
	"github.com/ledgerline/outbox/relay"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// promtool returns the promtool binary, or skips the test when it is
// missing, unless OUTBOX_REQUIRE_PROMTOOL is set (make test sets it, and
// installs the prometheus package).
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("OUTBOX_REQUIRE_PROMTOOL") != "" {
			t.Fatal("promtool not found (apt-get install prometheus, or make test)")
		}
		t.Skip("promtool not found; make test installs it")
	}
	return p
}

// TestAlertRules runs `promtool check rules` and `promtool test rules`.
func TestAlertRules(t *testing.T) {
	t.Parallel()
	bin := promtool(t)
	for _, args := range [][]string{
		{"check", "rules", "outbox-rules.yml"},
		{"test", "rules", "outbox-rules.test.yml"},
	} {
		cmd := exec.CommandContext(t.Context(), bin, args...)
		cmd.Dir = "prometheus"
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		t.Logf("promtool %s:\n%s", strings.Join(args, " "), out)
	}
}

// fqName reads a descriptor's metric name from its String form.
var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

// metricName finds the outbox metric names an expression uses.
var metricName = regexp.MustCompile(`\boutbox_[a-z_]+`)

// TestRulesAndDashboardUseRealMetrics: every outbox metric the rules and
// the dashboard query is one a relay service exports (a histogram's
// _bucket, _sum and _count included), so neither silently watches nothing
// after a rename. The dashboard is valid JSON with a query on every panel.
func TestRulesAndDashboardUseRealMetrics(t *testing.T) {
	t.Parallel()
	set, err := rails.NewSet(rails.Options{Type: "sandbox", Profile: payment.Generic{}, Transport: rails.NewSandbox(rails.SandboxOptions{})})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := relay.New(testdb.New(t), relay.Config{Relayer: engine.Config{Rails: set, PollInterval: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	// Every collector's descriptors: vectors with no labels observed yet
	// gather nothing, but describe themselves.
	known := map[string]bool{}
	descs := make(chan *prometheus.Desc, 1000)
	for _, c := range svc.Collectors() {
		c.Describe(descs)
	}
	close(descs)
	for d := range descs {
		m := fqName.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("cannot read the name of %s", d)
		}
		for _, suffix := range []string{"", "_bucket", "_sum", "_count"} {
			known[m[1]+suffix] = true
		}
	}
	rules, err := os.ReadFile("prometheus/outbox-rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	dash, err := os.ReadFile("grafana/outbox-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(dash, &d); err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	if len(d.Panels) == 0 {
		t.Fatal("the dashboard has no panels")
	}
	for _, p := range d.Panels {
		if len(p.Targets) == 0 || p.Targets[0].Expr == "" {
			t.Errorf("dashboard panel %q has no query", p.Title)
		}
	}
	for name, text := range map[string][]byte{"rules": rules, "dashboard": dash} {
		used := metricName.FindAllString(string(text), -1)
		if len(used) == 0 {
			t.Errorf("the %s use no outbox metric", name)
		}
		for _, m := range used {
			if !known[m] {
				t.Errorf("the %s use %s, which no relay service exports", name, m)
			}
		}
	}
}
