package rails

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ledgerline/outbox/internal/strictjson"
	"github.com/ledgerline/outbox/payment"
)

// Transport kinds of a [TransportConfig].
const (
	// TransportKindSandbox is the in-memory [Sandbox].
	TransportKindSandbox = "sandbox"
	// TransportKindWebhook is the signed HTTPS [Webhook].
	TransportKindWebhook = "webhook"
	// TransportKindGo is a [Transport] implemented by the embedding program
	// and handed to [Config.Build] in [BuildOptions.GoTransports].
	TransportKindGo = "go"
)

// maxConfigBytes bounds a configuration document; real ones are a few KiB.
const maxConfigBytes = 1 << 20

// Config is the relay configuration: the transports, declared once by name,
// and the rails that use them. It is read from JSON (see
// docs/relay-config.md) with [ParseConfig] or [LoadConfig], or built in code
// (see [DefaultConfig]). It never holds a secret: webhook secrets are read
// from the file or environment variable it names, at [Config.Build] time, so
// printing or marshalling a Config cannot reveal one.
type Config struct {
	// Transports by name. A transport can serve many rail types.
	Transports map[string]TransportConfig `json:"transports"`
	// Rails in the order of the file; rail types are unique.
	Rails []RailConfig `json:"rails"`
}

// TransportConfig declares one transport. Kind is "sandbox", "webhook" or
// "go"; a sandbox transport needs its Sandbox section and a webhook its
// Webhook section (and neither the other); a "go" transport has no section:
// its implementation comes from [BuildOptions.GoTransports].
type TransportConfig struct {
	Kind    string         `json:"kind"`
	Sandbox *SandboxConfig `json:"sandbox,omitempty"`
	Webhook *WebhookConfig `json:"webhook,omitempty"`
}

// SandboxConfig is [SandboxOptions] with durations as strings
// (time.ParseDuration: "20ms", "1.5s"). Rates are fractions in [0, 1].
type SandboxConfig struct {
	Seed          int64   `json:"seed,omitempty"`
	LatencyMin    string  `json:"latency_min,omitempty"`
	LatencyMax    string  `json:"latency_max,omitempty"`
	SlowRate      float64 `json:"slow_rate,omitempty"`
	SlowLatency   string  `json:"slow_latency,omitempty"`
	RetryableRate float64 `json:"retryable_rate,omitempty"`
	TerminalRate  float64 `json:"terminal_rate,omitempty"`
	TimeoutRate   float64 `json:"timeout_rate,omitempty"`
	HangRate      float64 `json:"hang_rate,omitempty"`
}

// WebhookConfig configures a [Webhook] transport. The secret itself is
// never part of the configuration: exactly one of SecretFile (a file holding
// it) or SecretEnv (the NAME of an environment variable holding it) says
// where [Config.Build] reads it with [LoadSecret]'s rules.
type WebhookConfig struct {
	// URL must be https:// (http:// only for loopback hosts) and carry no
	// credentials.
	URL        string `json:"url"`
	SecretFile string `json:"secret_file,omitempty"`
	SecretEnv  string `json:"secret_env,omitempty"`
	// AllowWorldReadableSecret accepts a SecretFile that other users of the
	// machine can read (see [SecretSource]); refused by default.
	AllowWorldReadableSecret bool `json:"allow_world_readable_secret,omitempty"`
	// CAFile is an optional PEM file of extra root CAs.
	CAFile string `json:"ca_file,omitempty"`
}

// RailConfig configures one rail: the rail type instructions carry, its
// validator profile (see [payment.ProfileByName]) with limits and options, the name
// of its transport, and its dispatch limits. Zero limits mean the defaults
// ([DefaultMaxConcurrency], [DefaultTimeout], the breaker defaults of
// [BreakerOptions]). Codes are merged over the transport's own code table;
// the rail's entries win.
type RailConfig struct {
	Type               string         `json:"type"`
	Profile            string         `json:"profile"`
	Transport          string         `json:"transport"`
	Currencies         []string       `json:"currencies,omitempty"`
	MinAmountMinor     int64          `json:"min_amount_minor,omitempty"`
	MaxAmountMinor     int64          `json:"max_amount_minor,omitempty"`
	DestinationPattern string         `json:"destination_pattern,omitempty"`
	RequireBIC         bool           `json:"require_bic,omitempty"`
	MaxConcurrency     int            `json:"max_concurrency,omitempty"`
	Timeout            string         `json:"timeout,omitempty"`
	Breaker            *BreakerConfig `json:"breaker,omitempty"`
	Codes              CodeTable      `json:"codes,omitempty"`
}

// BreakerConfig is [BreakerOptions] with OpenFor as a duration string.
type BreakerConfig struct {
	Disabled            bool   `json:"disabled,omitempty"`
	ConsecutiveFailures uint32 `json:"consecutive_failures,omitempty"`
	OpenFor             string `json:"open_for,omitempty"`
	HalfOpenProbes      uint32 `json:"half_open_probes,omitempty"`
}

// BuildOptions are what [Config.Build] needs from the program.
type BuildOptions struct {
	// GoTransports are the implementations of the transports of kind "go",
	// by transport name. Entries no "go" transport names are ignored.
	GoTransports map[string]Transport
	// Getenv reads webhook secret_env variables; nil means os.Getenv.
	Getenv func(string) string
	// OnBreakerChange, if set, is called on every breaker state change of
	// every rail.
	OnBreakerChange func(railType string, from, to BreakerState)
}

// Built is a built configuration.
type Built struct {
	// Set is what the relayer dispatches through.
	Set *Set
	// Catalog holds the rails' validation profiles, for producers.
	Catalog payment.Catalog
	// Sandboxes are the sandbox transports by transport name (never nil),
	// so demos and tests can read their Stats.
	Sandboxes map[string]*Sandbox
}

// DefaultConfig is the configuration `outbox relay` uses without a file:
// one sandbox transport named "sandbox" that injects no failures, serving
// the rail types of [payment.DefaultCatalog]: "sandbox" (generic profile) and
// "event" (event profile).
func DefaultConfig() *Config {
	return &Config{
		Transports: map[string]TransportConfig{
			"sandbox": {Kind: TransportKindSandbox, Sandbox: &SandboxConfig{}},
		},
		Rails: []RailConfig{
			{Type: "sandbox", Profile: "generic", Transport: "sandbox"},
			{Type: "event", Profile: "event", Transport: "sandbox"},
		},
	}
}

// LoadConfig reads and checks a configuration file (see [ParseConfig]).
// Errors start with the path.
func LoadConfig(path string) (*Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("rails config: %w", err)
	}
	defer f.Close()
	c, err := ParseConfig(f)
	if err != nil {
		return nil, fmt.Errorf("rails config %s: %w", path, err)
	}
	return c, nil
}

// ParseConfig decodes a JSON configuration and checks it with
// [Config.Validate]. Decoding is strict: unknown fields (at any depth, and
// names are case-sensitive), repeated keys, invalid UTF-8, trailing data
// and values of the wrong JSON type are errors. Every error names where it is, e.g.
// `rails[2] (type "ach"): breaker: unknown field "open"`; when several
// things are wrong, all of them are reported (one per line).
func ParseConfig(r io.Reader) (*Config, error) {
	data, err := io.ReadAll(io.LimitReader(r, maxConfigBytes+1))
	if err != nil {
		return nil, fmt.Errorf("reading: %w", err)
	}
	if len(data) > maxConfigBytes {
		return nil, fmt.Errorf("the configuration is larger than %d bytes", maxConfigBytes)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, errors.New("the configuration is empty")
	}
	var top struct {
		Transports map[string]json.RawMessage `json:"transports"`
		Rails      []json.RawMessage          `json:"rails"`
	}
	if err := strictjson.Unmarshal(data, &top); err != nil {
		return nil, documentError(data, err)
	}

	c := &Config{}
	var errs []error
	if top.Transports != nil {
		c.Transports = make(map[string]TransportConfig, len(top.Transports))
	}
	for _, name := range slices.Sorted(maps.Keys(top.Transports)) {
		t, err := decodeTransport(top.Transports[name])
		if err != nil {
			errs = append(errs, at(transportWhere(name), err))
			continue
		}
		c.Transports[name] = t
	}
	for i, raw := range top.Rails {
		rc, err := decodeRail(raw)
		if err != nil {
			errs = append(errs, at(railWhere(i, rc.Type), err))
			continue
		}
		c.Rails = append(c.Rails, rc)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

func decodeTransport(raw json.RawMessage) (TransportConfig, error) {
	var t struct {
		Kind    string          `json:"kind"`
		Sandbox json.RawMessage `json:"sandbox"`
		Webhook json.RawMessage `json:"webhook"`
	}
	if err := strictjson.Unmarshal(raw, &t); err != nil {
		return TransportConfig{}, jsonError(err)
	}
	tc := TransportConfig{Kind: t.Kind}
	if present(t.Sandbox) {
		tc.Sandbox = new(SandboxConfig)
		if err := strictjson.Unmarshal(t.Sandbox, tc.Sandbox); err != nil {
			return tc, fmt.Errorf("sandbox: %w", jsonError(err))
		}
	}
	if present(t.Webhook) {
		tc.Webhook = new(WebhookConfig)
		if err := strictjson.Unmarshal(t.Webhook, tc.Webhook); err != nil {
			return tc, fmt.Errorf("webhook: %w", jsonError(err))
		}
	}
	return tc, nil
}

// decodeRail decodes one rail, its breaker and code table as separate
// layers so an error can say which of them is wrong. On error the returned
// RailConfig still carries the type when it could be read, for the message.
func decodeRail(raw json.RawMessage) (RailConfig, error) {
	type plain RailConfig
	var r struct {
		plain
		Breaker json.RawMessage `json:"breaker"` // shadows plain.Breaker
		Codes   json.RawMessage `json:"codes"`   // shadows plain.Codes
	}
	if err := strictjson.Unmarshal(raw, &r); err != nil {
		var typ struct {
			Type string `json:"type"`
		}
		_ = json.Unmarshal(raw, &typ) // best effort, only to label the error (raw passed the strict top-level decode)
		return RailConfig{Type: typ.Type}, jsonError(err)
	}
	rc := RailConfig(r.plain)
	if present(r.Breaker) {
		rc.Breaker = new(BreakerConfig)
		if err := strictjson.Unmarshal(r.Breaker, rc.Breaker); err != nil {
			return rc, fmt.Errorf("breaker: %w", jsonError(err))
		}
	}
	if present(r.Codes) {
		var codes map[string]json.RawMessage
		if err := strictjson.Unmarshal(r.Codes, &codes); err != nil {
			return rc, fmt.Errorf("codes: %w", jsonError(err))
		}
		rc.Codes = make(CodeTable, len(codes))
		for _, code := range slices.Sorted(maps.Keys(codes)) {
			var rule CodeRule
			if err := strictjson.Unmarshal(codes[code], &rule); err != nil {
				return rc, fmt.Errorf("codes.%s: %w", code, jsonError(err))
			}
			rc.Codes[code] = rule
		}
	}
	return rc, nil
}

// present reports whether an optional section was given (absent and null
// mean the same).
func present(raw json.RawMessage) bool {
	return len(raw) > 0 && !bytes.Equal(bytes.TrimSpace(raw), []byte("null"))
}

// documentError describes an error of the top-level decoding: a syntax
// error with its line and column, a repeated key with where it is.
func documentError(data []byte, err error) error {
	var e *strictjson.Error
	if !errors.As(err, &e) {
		return err
	}
	switch e.Reason {
	case strictjson.ReasonSyntax, strictjson.ReasonInvalidUTF8:
		if e.Offset >= 0 {
			line, col := lineCol(data, e.Offset)
			return fmt.Errorf("invalid JSON at line %d, column %d: %s", line, col, e.Error())
		}
		return fmt.Errorf("invalid JSON: %s", e.Error())
	case strictjson.ReasonDuplicate:
		return at(pointerWhere(e.Parent()), fmt.Errorf("key %q appears twice", e.Name))
	}
	return fmt.Errorf("top level: %w", jsonError(err))
}

// pointerWhere renders a JSON pointer the way configuration errors name
// places: /rails/2/breaker is rails[2].breaker, "" is the top level.
func pointerWhere(pointer string) string {
	if pointer == "" {
		return "top level"
	}
	var b strings.Builder
	for _, tok := range strings.Split(strings.TrimPrefix(pointer, "/"), "/") {
		tok = strings.NewReplacer("~1", "/", "~0", "~").Replace(tok)
		if _, err := strconv.Atoi(tok); err == nil {
			fmt.Fprintf(&b, "[%s]", tok)
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(tok)
	}
	return b.String()
}

func lineCol(data []byte, offset int64) (line, col int) {
	offset = min(max(offset, 0), int64(len(data)))
	before := data[:offset]
	line = bytes.Count(before, []byte("\n")) + 1
	col = int(offset) - (bytes.LastIndexByte(before, '\n') + 1)
	return line, max(col, 1)
}

// jsonError rewords a decoding error for a configuration reader: the
// location prefix is added by the caller (layers are decoded separately, so
// the member's own name is the one to show).
func jsonError(err error) error {
	var e *strictjson.Error
	if errors.As(err, &e) && e.Reason == strictjson.ReasonUnknown {
		return fmt.Errorf("unknown field %q", e.Name)
	}
	return err
}

// configError is an error at a place in the configuration.
type configError struct {
	where string
	err   error
}

func (e *configError) Error() string {
	// Errors of this package's and payment's constructors start with the
	// package name; inside a located configuration error that prefix is
	// noise.
	msg := e.err.Error()
	for _, prefix := range []string{"rails: ", "payment: "} {
		msg = strings.TrimPrefix(msg, prefix)
	}
	return e.where + ": " + msg
}

func (e *configError) Unwrap() error { return e.err }

func at(where string, err error) error { return &configError{where: where, err: err} }

func atf(where, format string, args ...any) error {
	return at(where, fmt.Errorf(format, args...))
}

// transportWhere names a transport: transports.psp, or transports["odd name"].
func transportWhere(name string) string {
	simple := name != "" && strings.IndexFunc(name, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-')
	}) < 0
	if simple {
		return "transports." + name
	}
	return fmt.Sprintf("transports[%q]", name)
}

// railWhere names a rail: rails[2] (type "ach"), or rails[2] without a type.
func railWhere(i int, typ string) string {
	if typ == "" {
		return fmt.Sprintf("rails[%d]", i)
	}
	return fmt.Sprintf("rails[%d] (type %q)", i, typ)
}

// plan is a checked configuration with its values parsed.
type plan struct {
	transports []transportPlan // sorted by name
	rails      []railPlan
}

type transportPlan struct {
	name, where string
	kind        string
	sandbox     SandboxOptions
	webhook     WebhookConfig
}

type railPlan struct {
	where   string
	cfg     RailConfig
	profile payment.Profile
	timeout time.Duration
	breaker BreakerOptions
}

// Validate checks everything [Config.Build] checks that needs no secret,
// file or Go implementation: transport kinds and sections, webhook URLs,
// sandbox rates and durations, that every rail names a declared transport
// and a valid profile with valid limits, unique rail types, durations,
// limits and code tables. All problems are reported, each naming its place.
func (c *Config) Validate() error {
	_, err := c.check()
	return err
}

// Catalog returns the validation profiles of the configured rails: what a
// producer needs to validate exactly like the relayer, without the
// secrets or Go transports that [Config.Build] needs.
func (c *Config) Catalog() (payment.Catalog, error) {
	p, err := c.check()
	if err != nil {
		return nil, err
	}
	return p.catalog(), nil
}

func (p *plan) catalog() payment.Catalog {
	cat := make(payment.Catalog, len(p.rails))
	for _, r := range p.rails {
		cat[r.cfg.Type] = r.profile
	}
	return cat
}

func (c *Config) check() (*plan, error) {
	p := &plan{}
	var errs []error
	if len(c.Transports) == 0 {
		errs = append(errs, errors.New("transports: at least one transport is required"))
	}
	for _, name := range slices.Sorted(maps.Keys(c.Transports)) {
		tp, terrs := checkTransport(name, c.Transports[name])
		errs = append(errs, terrs...)
		p.transports = append(p.transports, tp)
	}
	if len(c.Rails) == 0 {
		errs = append(errs, errors.New("rails: at least one rail is required"))
	}
	firstOfType := make(map[string]int)
	for i, rc := range c.Rails {
		where := railWhere(i, rc.Type)
		if prev, dup := firstOfType[rc.Type]; dup && rc.Type != "" {
			errs = append(errs, atf(where, "rail type %q is already configured by rails[%d]", rc.Type, prev))
		} else {
			firstOfType[rc.Type] = i
		}
		rp, rerrs := checkRail(where, rc, c.Transports)
		errs = append(errs, rerrs...)
		p.rails = append(p.rails, rp)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return p, nil
}

func checkTransport(name string, t TransportConfig) (transportPlan, []error) {
	where := transportWhere(name)
	tp := transportPlan{name: name, where: where, kind: t.Kind}
	var errs []error
	if name == "" || strings.TrimSpace(name) != name || strings.IndexFunc(name, payment.ControlRune) >= 0 {
		errs = append(errs, atf(where, "a transport name must be non-empty, without surrounding spaces or control characters"))
	}
	sections := func(want string) {
		if want != TransportKindSandbox && t.Sandbox != nil {
			errs = append(errs, atf(where, "kind %q takes no sandbox section", t.Kind))
		}
		if want != TransportKindWebhook && t.Webhook != nil {
			errs = append(errs, atf(where, "kind %q takes no webhook section", t.Kind))
		}
	}
	switch t.Kind {
	case TransportKindSandbox:
		sections(TransportKindSandbox)
		if t.Sandbox == nil {
			errs = append(errs, atf(where, `kind "sandbox" needs a sandbox section (it may be empty: {})`))
			break
		}
		opts, serrs := checkSandbox(where, *t.Sandbox)
		tp.sandbox = opts
		errs = append(errs, serrs...)
	case TransportKindWebhook:
		sections(TransportKindWebhook)
		if t.Webhook == nil {
			errs = append(errs, atf(where, `kind "webhook" needs a webhook section with url and secret_file or secret_env`))
			break
		}
		tp.webhook = *t.Webhook
		errs = append(errs, checkWebhook(where, *t.Webhook)...)
	case TransportKindGo:
		sections(TransportKindGo)
	case "":
		errs = append(errs, atf(where, "kind is required (sandbox, webhook or go)"))
	default:
		errs = append(errs, atf(where, "unknown kind %q (want sandbox, webhook or go)", t.Kind))
	}
	return tp, errs
}

func checkSandbox(where string, s SandboxConfig) (SandboxOptions, []error) {
	var errs []error
	dur := func(field, v string) time.Duration {
		d, err := parseDuration(v)
		if err != nil {
			errs = append(errs, atf(where, "sandbox: %s %q: %w", field, v, err))
		}
		return d
	}
	o := SandboxOptions{
		Seed:          s.Seed,
		LatencyMin:    dur("latency_min", s.LatencyMin),
		LatencyMax:    dur("latency_max", s.LatencyMax),
		SlowRate:      s.SlowRate,
		SlowLatency:   dur("slow_latency", s.SlowLatency),
		RetryableRate: s.RetryableRate,
		TerminalRate:  s.TerminalRate,
		TimeoutRate:   s.TimeoutRate,
		HangRate:      s.HangRate,
	}
	for _, r := range []struct {
		field string
		v     float64
	}{
		{"slow_rate", s.SlowRate}, {"retryable_rate", s.RetryableRate}, {"terminal_rate", s.TerminalRate},
		{"timeout_rate", s.TimeoutRate}, {"hang_rate", s.HangRate},
	} {
		if !(r.v >= 0 && r.v <= 1) { // also catches NaN
			errs = append(errs, atf(where, "sandbox: %s %v: a rate must be between 0 and 1", r.field, r.v))
		}
	}
	if o.LatencyMax > 0 && o.LatencyMax < o.LatencyMin {
		errs = append(errs, atf(where, "sandbox: latency_max %s is below latency_min %s", o.LatencyMax, o.LatencyMin))
	}
	if s.SlowRate > 0 && o.SlowLatency == 0 {
		errs = append(errs, atf(where, "sandbox: slow_rate needs slow_latency"))
	}
	return o, errs
}

func checkWebhook(where string, w WebhookConfig) []error {
	var errs []error
	if w.URL == "" {
		errs = append(errs, atf(where, "webhook needs url"))
	} else if _, err := NewWebhook(WebhookOptions{URL: w.URL, Secret: []byte("validate-only")}); err != nil {
		// The same URL rules as Build, with a stand-in secret and no CA
		// file: neither is read here.
		errs = append(errs, at(where, err))
	}
	switch {
	case w.SecretFile == "" && w.SecretEnv == "":
		errs = append(errs, atf(where, "webhook needs secret_file or secret_env"))
	case w.SecretFile != "" && w.SecretEnv != "":
		errs = append(errs, atf(where, "webhook takes secret_file or secret_env, not both"))
	case w.AllowWorldReadableSecret && w.SecretFile == "":
		errs = append(errs, atf(where, "webhook allow_world_readable_secret applies to secret_file only"))
	case w.SecretEnv != "" && strings.ContainsAny(w.SecretEnv, "=\x00"):
		errs = append(errs, atf(where, "webhook secret_env %q is not an environment variable name", w.SecretEnv))
	}
	return errs
}

// checkRailType checks a rail type the way an instruction's rail field is
// checked, and refuses surrounding spaces: no instruction could match them.
func checkRailType(t string) error {
	if t == "" {
		return errors.New("type is required")
	}
	if err := payment.ValidateText(payment.FieldRail, t, 200); err != nil {
		var verr *payment.ValidationError
		if errors.As(err, &verr) {
			return fmt.Errorf("type: %s", verr.Message)
		}
		return err
	}
	if strings.TrimSpace(t) != t {
		return fmt.Errorf("type %q has surrounding spaces", t)
	}
	return nil
}

func checkRail(where string, rc RailConfig, transports map[string]TransportConfig) (railPlan, []error) {
	rp := railPlan{where: where, cfg: rc}
	var errs []error
	if err := checkRailType(rc.Type); err != nil {
		errs = append(errs, at(where, err))
	}
	if rc.Profile == "" {
		errs = append(errs, atf(where, "profile is required (ach, sepa, wire, generic or event)"))
	} else {
		limits := payment.Limits{Currencies: slices.Clone(rc.Currencies), MinAmountMinor: rc.MinAmountMinor, MaxAmountMinor: rc.MaxAmountMinor}
		prof, err := payment.ProfileByName(rc.Profile, limits, payment.ProfileOptions{DestinationPattern: rc.DestinationPattern, RequireBIC: rc.RequireBIC})
		if err != nil {
			errs = append(errs, at(where, err))
		}
		rp.profile = prof
	}
	switch _, ok := transports[rc.Transport]; {
	case rc.Transport == "":
		errs = append(errs, atf(where, "transport is required"))
	case !ok:
		errs = append(errs, atf(where, "transport %q is not declared in transports", rc.Transport))
	}
	if rc.MaxConcurrency < 0 {
		errs = append(errs, atf(where, "max_concurrency %d must not be negative (0 means the default, %d)", rc.MaxConcurrency, DefaultMaxConcurrency))
	}
	if d, err := parseDuration(rc.Timeout); err != nil {
		errs = append(errs, atf(where, "timeout %q: %w", rc.Timeout, err))
	} else {
		rp.timeout = d
	}
	if b := rc.Breaker; b != nil {
		rp.breaker = BreakerOptions{Disabled: b.Disabled, ConsecutiveFailures: b.ConsecutiveFailures, HalfOpenProbes: b.HalfOpenProbes}
		if d, err := parseDuration(b.OpenFor); err != nil {
			errs = append(errs, atf(where, "breaker: open_for %q: %w", b.OpenFor, err))
		} else {
			rp.breaker.OpenFor = d
		}
		if b.Disabled && (b.ConsecutiveFailures != 0 || b.OpenFor != "" || b.HalfOpenProbes != 0) {
			errs = append(errs, atf(where, "breaker: a disabled breaker takes no other settings"))
		}
	}
	for _, code := range slices.Sorted(maps.Keys(rc.Codes)) {
		if err := checkCodeRule(code, rc.Codes[code]); err != nil {
			errs = append(errs, at(where, fmt.Errorf("codes.%s: %w", code, err)))
		}
	}
	return rp, errs
}

// railAnswerErrors are the error codes a rail's answer may map to. The
// others belong to the relayer (RELEASED, CIRCUIT_OPEN and
// RAIL_NOT_CONFIGURED do not use up the retry budget, so a rail code mapped
// to one would be retried forever) or to validation before the call.
var railAnswerErrors = []ErrorCode{CodeRailRejected, CodeRailUnavailable, CodeRailTimeout, CodeRailTransport, CodeRateLimited}

func checkCodeRule(code string, rule CodeRule) error {
	if code == "" || strings.IndexFunc(code, payment.ControlRune) >= 0 {
		return errors.New("a rail code must be non-empty and printable")
	}
	switch rule.Outcome {
	case Dispatched:
		if rule.Error != "" {
			return fmt.Errorf("outcome DISPATCHED takes no error code (got %q)", rule.Error)
		}
	case Retryable, Failed:
		if rule.Error == "" {
			return fmt.Errorf("outcome %s needs an error code (one of %s)", rule.Outcome, joinCodes(railAnswerErrors))
		}
		if !slices.Contains(railAnswerErrors, rule.Error) {
			return fmt.Errorf("error %q is not a rail answer's error code (want one of %s)", rule.Error, joinCodes(railAnswerErrors))
		}
	case "":
		return errors.New("outcome is required (DISPATCHED, RETRYABLE or FAILED)")
	default:
		return fmt.Errorf("unknown outcome %q (want DISPATCHED, RETRYABLE or FAILED)", rule.Outcome)
	}
	return nil
}

func joinCodes(codes []ErrorCode) string {
	s := make([]string, len(codes))
	for i, c := range codes {
		s[i] = string(c)
	}
	return strings.Join(s, ", ")
}

// parseDuration parses an optional, non-negative duration ("" is zero).
func parseDuration(s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, err
	}
	if d < 0 {
		return 0, errors.New("must not be negative")
	}
	return d, nil
}

// Build checks the configuration ([Config.Validate]), builds every declared
// transport (reading webhook secrets and CA files; nothing is dialled) and
// the rail [Set]. A sandbox transport is one [Sandbox] shared by every rail
// that names it. The Config is not modified and the result shares no
// mutable state with it.
func (c *Config) Build(opts BuildOptions) (*Built, error) {
	p, err := c.check()
	if err != nil {
		return nil, err
	}
	getenv := opts.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	built := &Built{Sandboxes: make(map[string]*Sandbox), Catalog: p.catalog()}
	transports := make(map[string]Transport, len(p.transports))
	var errs []error
	for _, tp := range p.transports {
		switch tp.kind {
		case TransportKindSandbox:
			s := NewSandbox(tp.sandbox)
			built.Sandboxes[tp.name], transports[tp.name] = s, s
		case TransportKindWebhook:
			w, err := buildWebhook(tp.webhook, getenv)
			if err != nil {
				errs = append(errs, at(tp.where, err))
				continue
			}
			transports[tp.name] = w
		case TransportKindGo:
			impl := opts.GoTransports[tp.name]
			if impl == nil {
				errs = append(errs, atf(tp.where, `kind "go" needs an implementation from the program (BuildOptions.GoTransports[%q]); none is registered`, tp.name))
				continue
			}
			transports[tp.name] = impl
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}

	options := make([]Options, 0, len(p.rails))
	for _, r := range p.rails {
		tr := transports[r.cfg.Transport]
		var own CodeTable
		if cp, ok := tr.(CodeProvider); ok {
			own = cp.Codes()
		}
		var codes CodeTable // nil: NewSet takes the transport's own table
		if len(r.cfg.Codes) > 0 {
			codes = maps.Clone(own)
			if codes == nil {
				codes = make(CodeTable, len(r.cfg.Codes))
			}
			maps.Copy(codes, r.cfg.Codes)
		} else if own == nil {
			errs = append(errs, atf(r.where, "transport %q has no code table of its own: give the rail codes", r.cfg.Transport))
			continue
		}
		options = append(options, Options{
			Type:            r.cfg.Type,
			Profile:         r.profile,
			Transport:       tr,
			Codes:           codes,
			MaxConcurrency:  r.cfg.MaxConcurrency,
			Timeout:         r.timeout,
			Breaker:         r.breaker,
			OnBreakerChange: opts.OnBreakerChange,
		})
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	set, err := NewSet(options...)
	if err != nil {
		return nil, err
	}
	built.Set = set
	return built, nil
}

// buildWebhook reads the secret and builds the transport. Errors name the
// secret's file or variable, never its value.
func buildWebhook(w WebhookConfig, getenv func(string) string) (*Webhook, error) {
	secret, err := SecretSource{File: w.SecretFile, Env: w.SecretEnv, AllowWorldReadable: w.AllowWorldReadableSecret, Getenv: getenv}.Load()
	if err != nil {
		return nil, err
	}
	defer clear(secret) // NewWebhook keeps its own copy
	return NewWebhook(WebhookOptions{URL: w.URL, Secret: secret, CAFile: w.CAFile})
}
