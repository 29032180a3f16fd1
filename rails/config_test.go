package rails_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"

	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/rails"
)

// cfgSecret is a webhook secret the tests write to files or serve from a
// fake environment; it must never appear in an error or printed config.
const cfgSecret = "whsec-config-test-5e1f0c2b9a8d7e6f4c3b"

// cfgPayment is a valid payment instruction for a rail.
func cfgPayment(rail, key, currency, dest string) payment.Instruction {
	return payment.Instruction{
		OutboxID:       uuid.NewV5(uuid.NamespaceOID, rail+"/"+key),
		InstructionID:  "ins-" + key,
		ParticipantID:  "acme",
		IdempotencyKey: key,
		RailType:       rail,
		AttemptNo:      1,
		Payment:        &payment.Payment{AmountMinor: 1000, Currency: currency, Destination: dest},
	}
}

// cfgEvent is a valid event instruction for a rail.
func cfgEvent(rail, key string) payment.Instruction {
	return payment.Instruction{
		OutboxID:       uuid.NewV5(uuid.NamespaceOID, rail+"/"+key),
		InstructionID:  "ins-" + key,
		ParticipantID:  "acme",
		IdempotencyKey: key,
		RailType:       rail,
		AttemptNo:      1,
		Metadata:       json.RawMessage(`{"usage":1}`),
	}
}

// codeTransport answers every instruction with its CorrelationID as the
// rail code, and counts calls.
type codeTransport struct {
	mu    sync.Mutex
	calls int
}

func (c *codeTransport) Send(_ context.Context, ins payment.Instruction) (rails.Result, error) {
	c.mu.Lock()
	c.calls++
	c.mu.Unlock()
	return rails.Result{Code: ins.CorrelationID, Reference: "ref-" + ins.IdempotencyKey}, nil
}

func (c *codeTransport) Calls() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls
}

// codedTransport is a codeTransport with its own code table.
type codedTransport struct {
	codeTransport
	codes rails.CodeTable
}

func (c *codedTransport) Codes() rails.CodeTable { return c.codes }

func newCoded() *codedTransport {
	return &codedTransport{codes: rails.CodeTable{
		"OK": {Outcome: rails.Dispatched},
		"NO": {Outcome: rails.Failed, Error: rails.CodeRailRejected},
	}}
}

// downTransport never reaches its rail.
type downTransport struct{}

func (downTransport) Send(context.Context, payment.Instruction) (rails.Result, error) {
	return rails.Result{}, fmt.Errorf("core: %w", rails.ErrUnavailable)
}
func (downTransport) Codes() rails.CodeTable {
	return rails.CodeTable{"OK": {Outcome: rails.Dispatched}}
}

func loadCfg(t *testing.T, name string) *rails.Config {
	t.Helper()
	cfg, err := rails.LoadConfig(filepath.Join("testdata", "config", name))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func writeSecret(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "psp.key")
	if err := os.WriteFile(path, []byte(cfgSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func assertNoCfgSecret(t *testing.T, what, s string) {
	t.Helper()
	if strings.Contains(s, cfgSecret) {
		t.Fatalf("%s reveals the secret: %s", what, s)
	}
}

func mustBuild(t *testing.T, cfg *rails.Config, opts rails.BuildOptions) *rails.Built {
	t.Helper()
	b, err := cfg.Build(opts)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestConfigRefusesExposedSecretFile: a world-readable secret_file fails
// Build with ErrSecretExposed unless allow_world_readable_secret is set.
func TestConfigRefusesExposedSecretFile(t *testing.T) {
	t.Parallel()
	path := writeSecret(t)
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := loadCfg(t, "example.json")
	cfg.Transports["psp"].Webhook.SecretFile = path
	_, err := cfg.Build(rails.BuildOptions{GoTransports: map[string]rails.Transport{"core": downTransport{}}})
	if !errors.Is(err, rails.ErrSecretExposed) {
		t.Fatalf("Build with a 0644 secret file: %v, want ErrSecretExposed", err)
	}
	assertNoCfgSecret(t, "exposed secret error", err.Error())
	cfg.Transports["psp"].Webhook.AllowWorldReadableSecret = true
	mustBuild(t, cfg, rails.BuildOptions{GoTransports: map[string]rails.Transport{"core": downTransport{}}})
}

func TestConfigExampleParsesAndBuilds(t *testing.T) {
	t.Parallel()
	cfg := loadCfg(t, "example.json")
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	cfg.Transports["psp"].Webhook.SecretFile = writeSecret(t)
	core := newCoded()
	built := mustBuild(t, cfg, rails.BuildOptions{GoTransports: map[string]rails.Transport{"core": core}})

	wantTypes := []string{"ach", "event", "internal", "sandbox", "sepa"}
	if got := built.Set.Types(); !slices.Equal(got, wantTypes) {
		t.Fatalf("set types %v, want %v", got, wantTypes)
	}
	if got := slices.Sorted(maps.Keys(built.Catalog)); !slices.Equal(got, wantTypes) {
		t.Fatalf("catalog types %v, want %v", got, wantTypes)
	}
	if got := slices.Sorted(maps.Keys(built.Sandboxes)); !slices.Equal(got, []string{"sim"}) {
		t.Fatalf("sandboxes %v, want [sim]", got)
	}
	if got := built.Set.Timeout("ach"); got != 20*time.Second {
		t.Errorf("ach timeout %s, want 20s", got)
	}
	if got := built.Set.Timeout("sepa"); got != rails.DefaultTimeout {
		t.Errorf("sepa timeout %s, want the default %s", got, rails.DefaultTimeout)
	}

	// The profiles carry the configured limits and options.
	want := payment.Catalog{
		"ach":  payment.ACH{Limits: payment.Limits{Currencies: []string{"USD"}, MaxAmountMinor: 2500000000}},
		"sepa": payment.SEPA{RequireBIC: true},
	}
	for typ, p := range want {
		if !reflect.DeepEqual(built.Catalog[typ], p) {
			t.Errorf("catalog[%s] = %#v, want %#v", typ, built.Catalog[typ], p)
		}
	}
	for _, c := range []struct {
		ins   payment.Instruction
		field string // empty: valid
	}{
		{cfgPayment("ach", "a1", "USD", "021000021:123456789"), ""},
		{func() payment.Instruction {
			ins := cfgPayment("ach", "a2", "USD", "021000021:123456789")
			ins.Payment.AmountMinor = 2500000001
			return ins
		}(), payment.FieldAmount},
		{cfgPayment("sepa", "s1", "EUR", "DE89370400440532013000"), payment.FieldDestination}, // BIC required
		{cfgPayment("sepa", "s2", "EUR", "DE89370400440532013000:DEUTDEFF"), ""},
		{cfgPayment("internal", "i1", "USD", "AB123456"), ""},
		{cfgPayment("internal", "i2", "USD", "AB12345"), payment.FieldDestination},
		{cfgEvent("event", "e1"), ""},
	} {
		err := built.Catalog.Validate(c.ins)
		if c.field == "" && err != nil {
			t.Errorf("%s %s: %v", c.ins.RailType, c.ins.IdempotencyKey, err)
		}
		if c.field != "" {
			var verr *payment.ValidationError
			if !errors.As(err, &verr) || verr.Field != c.field {
				t.Errorf("%s %s: got %v, want an invalid %s", c.ins.RailType, c.ins.IdempotencyKey, err, c.field)
			}
		}
	}

	// The "go" transport is the program's implementation, with its table.
	ins := cfgPayment("internal", "i3", "USD", "AB123456")
	ins.CorrelationID = "OK"
	if d := built.Set.Execute(context.Background(), ins); d.Outcome != rails.Dispatched || d.Reference != "ref-i3" {
		t.Fatalf("internal rail: %+v", d)
	}
	if core.Calls() != 1 {
		t.Fatalf("core transport called %d times, want 1", core.Calls())
	}

	// Nothing the config prints holds the secret (it only names the file).
	js, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for what, s := range map[string]string{"json": string(js), "%+v": fmt.Sprintf("%+v", cfg), "%#v": fmt.Sprintf("%#v", cfg),
		"%+v webhook": fmt.Sprintf("%+v", *cfg.Transports["psp"].Webhook), "built": fmt.Sprintf("%+v", *built)} {
		assertNoCfgSecret(t, what, s)
	}
}

// The example in docs/relay-config.md is the example fixture, and the
// JSON form of a parsed config parses back to the same config.
func TestConfigDocsExampleAndRoundTrip(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile(filepath.Join("..", "docs", "relay-config.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "```json\n")
	block, _, ok2 := strings.Cut(rest, "```")
	if !ok || !ok2 {
		t.Fatal("docs/relay-config.md has no ```json block")
	}
	fromDoc, err := rails.ParseConfig(strings.NewReader(block))
	if err != nil {
		t.Fatalf("the documented example does not parse: %v", err)
	}
	example := loadCfg(t, "example.json")
	if !reflect.DeepEqual(fromDoc, example) {
		t.Fatalf("docs example and testdata/config/example.json differ:\n%+v\n%+v", fromDoc, example)
	}

	for _, c := range []*rails.Config{example, rails.DefaultConfig()} {
		js, err := json.MarshalIndent(c, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		back, err := rails.ParseConfig(bytes.NewReader(js))
		if err != nil {
			t.Fatalf("marshalled config does not parse: %v\n%s", err, js)
		}
		if !reflect.DeepEqual(back, c) {
			t.Fatalf("round trip changed the config:\n%s\n%+v", js, back)
		}
	}
}

func TestConfigDefault(t *testing.T) {
	t.Parallel()
	if err := rails.DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	if got := loadCfg(t, "default.json"); !reflect.DeepEqual(got, rails.DefaultConfig()) {
		t.Fatalf("testdata/config/default.json is not DefaultConfig(): %+v", got)
	}
	built := mustBuild(t, rails.DefaultConfig(), rails.BuildOptions{})
	if !reflect.DeepEqual(built.Catalog, payment.DefaultCatalog()) {
		t.Fatalf("default catalog %#v, want DefaultCatalog() %#v", built.Catalog, payment.DefaultCatalog())
	}
	if got := slices.Sorted(maps.Keys(built.Catalog)); !slices.Equal(got, []string{"event", "sandbox"}) {
		t.Fatalf("default rail types %v", got)
	}
	cat, err := rails.DefaultConfig().Catalog()
	if err != nil || !reflect.DeepEqual(cat, built.Catalog) {
		t.Fatalf("Config.Catalog() = %v, %v; want the built catalog", cat, err)
	}
	sbx := built.Sandboxes["sandbox"]
	if sbx == nil || len(built.Sandboxes) != 1 {
		t.Fatalf("sandboxes %v", built.Sandboxes)
	}
	ctx := context.Background()
	for _, ins := range []payment.Instruction{cfgPayment("sandbox", "k1", "USD", "acct-1"), cfgEvent("event", "k2")} {
		if d := built.Set.Execute(ctx, ins); d.Outcome != rails.Dispatched {
			t.Fatalf("%s: %+v", ins.RailType, d)
		}
	}
	if st := sbx.Stats(); st.Calls != 2 || st.Payments != 2 {
		t.Fatalf("sandbox stats %+v: the default injects no failures", st)
	}
	for _, typ := range []string{"sandbox", "event"} {
		if got := built.Set.Timeout(typ); got != rails.DefaultTimeout {
			t.Errorf("%s timeout %s, want the default", typ, got)
		}
	}
}

// What `outbox relay` does with its --rail-timeout/--rail-max-concurrency
// flags: fill in the limits of a loaded config before Build.
func TestConfigLimitsFromCode(t *testing.T) {
	t.Parallel()
	cfg := rails.DefaultConfig()
	cfg.Rails[0].Timeout = (5 * time.Second).String()
	cfg.Rails[0].MaxConcurrency = 4
	built := mustBuild(t, cfg, rails.BuildOptions{})
	if got := built.Set.Timeout("sandbox"); got != 5*time.Second {
		t.Fatalf("timeout %s, want 5s", got)
	}
	if got := built.Set.Timeout("event"); got != rails.DefaultTimeout {
		t.Fatalf("event timeout %s, want the default", got)
	}
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	cases := map[string][]string{
		"bad_unknown_field_top.json":     {`top level: unknown field "relayers"`},
		"bad_unknown_field_breaker.json": {`rails[1] (type "ach"): breaker: unknown field "open"`},
		"bad_unknown_field_sandbox.json": {`transports.sim: sandbox: unknown field "latency"`},
		"bad_unknown_field_rail.json":    {`rails[0] (type "ach"): unknown field "max_amount"`},
		"bad_unknown_field_code.json":    {`rails[0] (type "ach"): codes.REJECTED: unknown field "outcom"`},
		"bad_kind.json":                  {`transports.psp: unknown kind "grpc"`},
		"bad_missing_section.json":       {`transports.psp: kind "webhook" needs a webhook section`},
		"bad_both_sections.json":         {`transports.sim: kind "sandbox" takes no webhook section`},
		"bad_go_with_section.json":       {`transports.core: kind "go" takes no sandbox section`},
		"bad_dangling_transport.json":    {`rails[1] (type "ach"): transport "psp" is not declared in transports`},
		"bad_duplicate_type.json":        {`rails[1] (type "ach"): rail type "ach" is already configured by rails[0]`},
		"bad_profile.json":               {`rails[0] (type "swift"): unknown profile "swift"`},
		"bad_profile_option.json":        {`rails[0] (type "ach"): profile "ach" takes no require_bic option`},
		"bad_event_limits.json":          {`rails[0] (type "usage-events"): profile "event" moves no money`},
		"bad_duration.json":              {`rails[2] (type "ach"): timeout "20": time: missing unit in duration "20"`},
		"bad_breaker_duration.json":      {`rails[0] (type "ach"): breaker: open_for "-5s": must not be negative`},
		"bad_sandbox_duration.json":      {`transports.sim: sandbox: latency_max "20 ms": time: unknown unit`},
		"bad_sandbox_rate.json":          {`transports.sim: sandbox: retryable_rate 2: a rate must be between 0 and 1`},
		"bad_code_outcome.json":          {`rails[0] (type "ach"): codes.REJECTED: unknown outcome "OK"`},
		"bad_code_no_error.json":         {`rails[0] (type "ach"): codes.REJECTED: outcome FAILED needs an error code`},
		"bad_code_relayer_error.json":    {`rails[0] (type "ach"): codes.RATE_LIMITED: error "CIRCUIT_OPEN" is not a rail answer's error code`},
		// Codes the transport never answers: the rule would never apply.
		"bad_code_webhook_status.json": {`rails[0] (type "ach"): codes.418: a webhook transport answers only HTTP_<status>`, `never "418"`},
		"bad_code_sandbox.json":        {`rails[0] (type "ach"): codes.GONE: a sandbox transport answers only ACCEPTED, DUPLICATE, RATE_LIMITED, REJECTED, TEMPORARILY_UNAVAILABLE`},
		"bad_concurrency.json":         {`rails[0] (type "ach"): max_concurrency -1 must not be negative`},
		"bad_wrong_type.json":          {`rails[0] (type "ach"): max_concurrency: want an integer, got a JSON string`},
		"bad_webhook_no_url.json":      {`transports.psp: webhook needs url`},
		"bad_webhook_http.json":        {`transports.psp: webhook URL must be https://`, `not "psp.example"`},
		"bad_webhook_no_secret.json":   {`transports.psp: webhook needs secret_file or secret_env`},
		"bad_webhook_two_secrets.json": {`transports.psp: webhook takes secret_file or secret_env, not both`},
		"bad_duplicate_key.json":       {`transports: key "psp" appears twice`},
		"bad_syntax.json":              {`invalid JSON at line 3`},
		"bad_trailing.json":            {`after top-level value`},
		"bad_no_rails.json":            {`rails: at least one rail is required`},
	}
	// Every bad fixture has a case, so none is silently untested.
	files, err := filepath.Glob(filepath.Join("testdata", "config", "bad_*.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if _, ok := cases[filepath.Base(f)]; !ok {
			t.Errorf("fixture %s has no test case", f)
		}
	}
	for name, wants := range cases {
		t.Run(strings.TrimSuffix(name, ".json"), func(t *testing.T) {
			t.Parallel()
			path := filepath.Join("testdata", "config", name)
			_, err := rails.LoadConfig(path)
			if err == nil {
				t.Fatal("LoadConfig accepted a broken configuration")
			}
			msg := err.Error()
			t.Log(msg)
			if !strings.HasPrefix(msg, "rails config "+path+": ") {
				t.Errorf("error does not start with the path: %s", msg)
			}
			for _, w := range wants {
				if !strings.Contains(msg, w) {
					t.Errorf("error\n  %s\ndoes not contain\n  %s", msg, w)
				}
			}
		})
	}
}

// TestConfigNamesAreCaseSensitive: a key whose case differs from the
// documented name is an unknown field (encoding/json would have matched it
// case-insensitively, after or instead of the real one), and a key repeated
// in another case inside a section is refused too.
func TestConfigNamesAreCaseSensitive(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ doc, want string }{
		{`{"Transports": {}, "rails": []}`, `top level: unknown field "Transports"`},
		{`{"transports": {"s": {"kind": "sandbox", "sandbox": {}}},
		   "rails": [{"type": "sandbox", "profile": "generic", "transport": "s", "max_concurrency": 1, "MAX_CONCURRENCY": 500}]}`,
			`rails[0] (type "sandbox"): unknown field "MAX_CONCURRENCY"`},
		{`{"transports": {"s": {"kind": "sandbox", "sandbox": {"seed": 1, "seed": 2}}}, "rails": []}`,
			`transports.s.sandbox: key "seed" appears twice`},
		{"{\"transports\": {\"s\xff\": {}}, \"rails\": []}", `invalid JSON`},
	} {
		_, err := rails.ParseConfig(strings.NewReader(tt.doc))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: got %v, want an error containing %q", tt.doc, err, tt.want)
		}
	}
}

// Validate reports every problem at once, one per line, each located.
func TestConfigValidateReportsAll(t *testing.T) {
	t.Parallel()
	err := (&rails.Config{}).Validate()
	if err == nil || !strings.Contains(err.Error(), "transports: at least one transport is required") ||
		!strings.Contains(err.Error(), "rails: at least one rail is required") {
		t.Fatalf("empty config: %v", err)
	}

	cfg := &rails.Config{
		Transports: map[string]rails.TransportConfig{
			"sim": {Kind: "sandbox", Sandbox: &rails.SandboxConfig{LatencyMin: "20ms", LatencyMax: "2ms"}},
			"":    {Kind: "go"},
		},
		Rails: []rails.RailConfig{
			{Profile: "generic", Transport: "sim"},
			{Type: "ach", Profile: "ach", Transport: "sim", Breaker: &rails.BreakerConfig{Disabled: true, OpenFor: "1s"}},
			{Type: "x", Profile: "generic", Transport: "sim", Codes: rails.CodeTable{"OK": {Outcome: rails.Dispatched, Error: rails.CodeRailRejected}}},
		},
	}
	err = cfg.Validate()
	if err == nil {
		t.Fatal("expected errors")
	}
	for _, w := range []string{
		`transports.sim: sandbox: latency_max 2ms is below latency_min 20ms`,
		`transports[""]: a transport name must be non-empty`,
		`rails[0]: type is required`,
		`rails[1] (type "ach"): breaker: a disabled breaker takes no other settings`,
		`rails[2] (type "x"): codes.OK: outcome DISPATCHED takes no error code`,
	} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error\n%s\ndoes not contain\n  %s", err, w)
		}
	}
	if n := strings.Count(err.Error(), "\n") + 1; n != 5 {
		t.Errorf("%d lines, want 5:\n%s", n, err)
	}
}

func TestConfigBuildErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		cfg   func(t *testing.T) *rails.Config
		opts  rails.BuildOptions
		wants []string
	}{
		{
			name:  "go transport without an implementation",
			cfg:   func(t *testing.T) *rails.Config { return loadCfg(t, "go_unregistered.json") },
			opts:  rails.BuildOptions{GoTransports: map[string]rails.Transport{"other": newCoded()}},
			wants: []string{`transports.core: kind "go" needs an implementation`, `GoTransports["core"]`},
		},
		{
			name:  "go transport without a code table",
			cfg:   func(t *testing.T) *rails.Config { return loadCfg(t, "go_unregistered.json") },
			opts:  rails.BuildOptions{GoTransports: map[string]rails.Transport{"core": &codeTransport{}}},
			wants: []string{`rails[0] (type "internal"): transport "core" has no code table of its own`},
		},
		{
			name:  "missing secret file",
			cfg:   func(t *testing.T) *rails.Config { return loadCfg(t, "missing_secret_file.json") },
			wants: []string{`transports.psp: reading webhook secret`, `no-such.key`},
		},
		{
			name: "missing CA file",
			cfg: func(t *testing.T) *rails.Config {
				cfg := loadCfg(t, "example.json")
				cfg.Transports["psp"].Webhook.SecretFile = writeSecret(t)
				cfg.Transports["psp"].Webhook.CAFile = filepath.Join(t.TempDir(), "ca.pem")
				return cfg
			},
			opts:  rails.BuildOptions{GoTransports: map[string]rails.Transport{"core": newCoded()}},
			wants: []string{`transports.psp: webhook CA file`, `ca.pem`},
		},
		{
			name: "invalid config",
			cfg: func(t *testing.T) *rails.Config {
				cfg := rails.DefaultConfig()
				cfg.Rails[1].Transport = "nope"
				return cfg
			},
			wants: []string{`rails[1] (type "event"): transport "nope" is not declared`},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			_, err := c.cfg(t).Build(c.opts)
			if err == nil {
				t.Fatal("Build succeeded")
			}
			for _, w := range c.wants {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error\n  %s\ndoes not contain\n  %s", err, w)
				}
			}
			assertNoCfgSecret(t, "error", err.Error())
		})
	}
}

func TestConfigSecretEnv(t *testing.T) {
	t.Parallel()
	cfg := loadCfg(t, "secret_env.json")
	// Another variable holds a value: the error must not pick it up.
	env := map[string]string{"OTHER_SECRET": cfgSecret}
	_, err := cfg.Build(rails.BuildOptions{Getenv: func(k string) string { return env[k] }})
	if err == nil {
		t.Fatal("Build succeeded without the secret variable")
	}
	if msg := err.Error(); !strings.Contains(msg, "transports.psp: ") || !strings.Contains(msg, "OUTBOX_TEST_PSP_SECRET") {
		t.Fatalf("error does not name the transport and the variable: %s", msg)
	}
	assertNoCfgSecret(t, "error", err.Error())

	env["OUTBOX_TEST_PSP_SECRET"] = cfgSecret
	built := mustBuild(t, cfg, rails.BuildOptions{Getenv: func(k string) string { return env[k] }})
	if got := built.Set.Types(); !slices.Equal(got, []string{"ach"}) {
		t.Fatalf("types %v", got)
	}
	js, _ := json.Marshal(cfg)
	assertNoCfgSecret(t, "config json", string(js))
	assertNoCfgSecret(t, "config", fmt.Sprintf("%+v %#v", cfg, *cfg.Transports["psp"].Webhook))
}

// TestConfigCodesMustBeAnswerable guards a rail's codes against keys its
// transport can never answer with: a webhook's "418" for HTTP_418 would be
// accepted and never apply, leaving HTTP 418 a retryable UNKNOWN_RAIL_CODE
// instead of the rule the operator wrote. A go transport's codes are its
// own, so any key is accepted there.
func TestConfigCodesMustBeAnswerable(t *testing.T) {
	t.Parallel()
	webhook := rails.TransportConfig{Kind: "webhook", Webhook: &rails.WebhookConfig{URL: "https://psp.example/outbox", SecretEnv: "PSP_SECRET"}}
	sandbox := rails.TransportConfig{Kind: "sandbox", Sandbox: &rails.SandboxConfig{}}
	for _, tc := range []struct {
		transport rails.TransportConfig
		code      string
		ok        bool
	}{
		{webhook, "HTTP_418", true},
		{webhook, "HTTP_599", true},
		{webhook, "418", false},
		{webhook, "http_418", false},
		{webhook, "HTTP_4180", false},
		{webhook, "HTTP_41", false},
		{webhook, "HTTP_099", false}, // the transport writes 99 as HTTP_99
		{webhook, "HTTP_+18", false},
		{webhook, "REJECTED", false},
		{sandbox, "REJECTED", true},
		{sandbox, "TEMPORARILY_UNAVAILABLE", true},
		{sandbox, "GONE", false},
		{sandbox, "HTTP_418", false},
		{rails.TransportConfig{Kind: "go"}, "ANY_CODE", true},
	} {
		cfg := &rails.Config{
			Transports: map[string]rails.TransportConfig{"t": tc.transport},
			Rails: []rails.RailConfig{{Type: "r", Profile: "generic", Transport: "t",
				Codes: rails.CodeTable{tc.code: {Outcome: rails.Failed, Error: rails.CodeRailRejected}}}},
		}
		err := cfg.Validate()
		if tc.ok != (err == nil) {
			t.Errorf("%s transport, codes key %q: Validate() = %v, want accepted %t", tc.transport.Kind, tc.code, err, tc.ok)
		}
		if err != nil && !strings.Contains(err.Error(), fmt.Sprintf("codes.%s: a %s transport answers only", tc.code, tc.transport.Kind)) {
			t.Errorf("error does not name the key and what is expected: %v", err)
		}
	}
}

// A rail's codes are merged over its transport's table: the rail's entries
// win, the transport's others stay, and neither table is modified.
func TestConfigCodesMerge(t *testing.T) {
	t.Parallel()
	core := newCoded()
	cfg := &rails.Config{
		Transports: map[string]rails.TransportConfig{"core": {Kind: "go"}},
		Rails: []rails.RailConfig{
			{Type: "strict", Profile: "generic", Transport: "core"},
			{Type: "custom", Profile: "generic", Transport: "core", Codes: rails.CodeTable{
				"NO":     {Outcome: rails.Retryable, Error: rails.CodeRailUnavailable},
				"TEAPOT": {Outcome: rails.Failed, Error: rails.CodeRailRejected},
			}},
		},
	}
	built := mustBuild(t, cfg, rails.BuildOptions{GoTransports: map[string]rails.Transport{"core": core}})
	// Changing the config afterwards does not change the built set.
	cfg.Rails[1].Codes["OK"] = rails.CodeRule{Outcome: rails.Failed, Error: rails.CodeRailRejected}

	for i, c := range []struct {
		rail, code string
		outcome    rails.Outcome
		errCode    rails.ErrorCode
	}{
		{"custom", "OK", rails.Dispatched, ""},                           // the transport's entry stays
		{"custom", "NO", rails.Retryable, rails.CodeRailUnavailable},     // the rail's entry wins
		{"custom", "TEAPOT", rails.Failed, rails.CodeRailRejected},       // the rail's own addition
		{"custom", "WHAT", rails.Retryable, rails.CodeUnknownRailCode},   // neither knows it
		{"strict", "NO", rails.Failed, rails.CodeRailRejected},           // the other rail is unaffected
		{"strict", "TEAPOT", rails.Retryable, rails.CodeUnknownRailCode}, // ...and does not see the addition
	} {
		ins := cfgPayment(c.rail, fmt.Sprintf("k%d", i), "USD", "acct-1")
		ins.CorrelationID = c.code
		d := built.Set.Execute(context.Background(), ins)
		if d.Outcome != c.outcome || d.ErrorCode != c.errCode || d.RailCode != c.code {
			t.Errorf("%s answering %s: got %s/%s, want %s/%s", c.rail, c.code, d.Outcome, d.ErrorCode, c.outcome, c.errCode)
		}
	}
	if len(core.codes) != 2 || core.codes["NO"].Outcome != rails.Failed {
		t.Fatalf("the transport's own table was modified: %v", core.codes)
	}
}

// The example's ach rail adds HTTP_418 to the webhook's table; the
// webhook's own entries stay. A loopback http:// endpoint is allowed.
func TestConfigCodesMergeWebhook(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(rails.HeaderSignature) == "" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		if strings.HasSuffix(r.Header.Get(rails.HeaderIdempotencyKey), "teapot") {
			w.WriteHeader(http.StatusTeapot)
			return
		}
		w.WriteHeader(http.StatusAccepted)
	}))
	t.Cleanup(srv.Close)

	cfg := loadCfg(t, "example.json")
	cfg.Transports["psp"].Webhook.URL = srv.URL + "/outbox"
	cfg.Transports["psp"].Webhook.SecretFile = writeSecret(t)
	built := mustBuild(t, cfg, rails.BuildOptions{GoTransports: map[string]rails.Transport{"core": newCoded()}})
	ctx := context.Background()

	if d := built.Set.Execute(ctx, cfgPayment("ach", "a-ok", "USD", "021000021:123456789")); d.Outcome != rails.Dispatched || d.RailCode != "HTTP_202" {
		t.Fatalf("ach 202: %+v", d)
	}
	if d := built.Set.Execute(ctx, cfgPayment("ach", "a-teapot", "USD", "021000021:123456789")); d.Outcome != rails.Failed || d.ErrorCode != rails.CodeRailRejected {
		t.Fatalf("ach 418: %+v", d)
	}
	// sepa shares the transport but not the ach rail's codes.
	if d := built.Set.Execute(ctx, cfgPayment("sepa", "s-teapot", "EUR", "DE89370400440532013000:DEUTDEFF")); d.Outcome != rails.Retryable || d.ErrorCode != rails.CodeUnknownRailCode {
		t.Fatalf("sepa 418: %+v", d)
	}
}

// One sandbox transport serves two rails: the same instance, which both
// rails dispatch through.
func TestConfigSharedSandbox(t *testing.T) {
	t.Parallel()
	built := mustBuild(t, loadCfg(t, "shared_sandbox.json"), rails.BuildOptions{})
	if len(built.Sandboxes) != 1 || built.Sandboxes["sim"] == nil {
		t.Fatalf("sandboxes %v", built.Sandboxes)
	}
	sbx := built.Sandboxes["sim"]
	ctx := context.Background()
	// terminal_rate 1: the sandbox rejects every new payment. The plain
	// rail fails it; the lenient rail's codes make the rejection retryable.
	if d := built.Set.Execute(ctx, cfgPayment("sandbox", "k1", "USD", "acct-1")); d.Outcome != rails.Failed || d.ErrorCode != rails.CodeRailRejected {
		t.Fatalf("sandbox rail: %+v", d)
	}
	if d := built.Set.Execute(ctx, cfgPayment("lenient", "k2", "USD", "acct-2")); d.Outcome != rails.Retryable || d.ErrorCode != rails.CodeRailUnavailable {
		t.Fatalf("lenient rail: %+v", d)
	}
	if st := sbx.Stats(); st.Calls != 2 || st.Rejected != 2 {
		t.Fatalf("shared sandbox stats %+v, want 2 calls and 2 rejections", st)
	}
	// Each Build makes its own instances.
	again := mustBuild(t, loadCfg(t, "shared_sandbox.json"), rails.BuildOptions{})
	if again.Sandboxes["sim"] == sbx {
		t.Fatal("two builds share a sandbox")
	}
}

// Build wires OnBreakerChange and the breaker settings into every rail.
func TestConfigBreaker(t *testing.T) {
	t.Parallel()
	cfg := &rails.Config{
		Transports: map[string]rails.TransportConfig{"core": {Kind: "go"}},
		Rails: []rails.RailConfig{
			{Type: "fragile", Profile: "generic", Transport: "core", Breaker: &rails.BreakerConfig{ConsecutiveFailures: 1, OpenFor: "1h"}},
			{Type: "sturdy", Profile: "generic", Transport: "core", Breaker: &rails.BreakerConfig{Disabled: true}},
		},
	}
	var mu sync.Mutex
	var changes []string
	built := mustBuild(t, cfg, rails.BuildOptions{
		GoTransports: map[string]rails.Transport{"core": downTransport{}},
		OnBreakerChange: func(rail string, from, to rails.BreakerState) {
			mu.Lock()
			changes = append(changes, fmt.Sprintf("%s %s->%s", rail, from, to))
			mu.Unlock()
		},
	})
	ctx := context.Background()
	for i := range 3 {
		built.Set.Execute(ctx, cfgPayment("fragile", fmt.Sprintf("f%d", i), "USD", "acct-1"))
		built.Set.Execute(ctx, cfgPayment("sturdy", fmt.Sprintf("s%d", i), "USD", "acct-1"))
	}
	if built.Set.State("fragile") != rails.BreakerOpen || built.Set.State("sturdy") != rails.BreakerClosed {
		t.Fatalf("states: fragile %s, sturdy %s", built.Set.State("fragile"), built.Set.State("sturdy"))
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(changes, []string{"fragile closed->open"}) {
		t.Fatalf("breaker changes %v", changes)
	}
}

func TestConfigParseLimits(t *testing.T) {
	t.Parallel()
	for name, in := range map[string]string{
		"empty":        "",
		"spaces":       "  \n",
		"not object":   "[]",
		"null rails":   `{"transports": {"sim": {"kind": "sandbox", "sandbox": {}}}, "rails": null}`,
		"truncated":    `{"transports": {`,
		"huge":         `{"transports": {}, "rails": [], "x": "` + strings.Repeat("a", 2<<20) + `"}`,
		"rails object": `{"transports": {"sim": {"kind": "sandbox", "sandbox": {}}}, "rails": {}}`,
	} {
		if _, err := rails.ParseConfig(strings.NewReader(in)); err == nil {
			t.Errorf("%s: ParseConfig accepted it", name)
		}
	}
	// A null section is an absent one.
	cfg, err := rails.ParseConfig(strings.NewReader(`{"transports": {"core": {"kind": "go", "sandbox": null}},
		"rails": [{"type": "x", "profile": "generic", "transport": "core", "breaker": null, "codes": null}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Transports["core"].Sandbox != nil || cfg.Rails[0].Breaker != nil || cfg.Rails[0].Codes != nil {
		t.Fatalf("null sections: %+v", cfg)
	}
}
