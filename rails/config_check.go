package rails

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/ledgerline/outbox/payment"
)

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
		CrashKeys:     s.CrashKeys,
		Remember:      s.Remember,
	}
	for _, err := range o.problems(jsonName) {
		errs = append(errs, at(where, fmt.Errorf("sandbox: %w", err)))
	}
	return o, errs
}

// jsonName names a field as a rails file does: by its JSON name.
func jsonName(field string) string { return field }

// Check reports every problem for which a rails file's sandbox section
// with these values is refused: a rate outside [0, 1], a negative
// latency, LatencyMax below LatencyMin, SlowRate without SlowLatency. It
// lets other front ends (`outbox sandbox serve`'s flags) refuse exactly
// what the file refuses. name turns a field's JSON name (slow_rate) into
// the caller's name for it (--slow-rate); nil keeps the JSON name. The
// problems are joined with [errors.Join], one per line.
func (o SandboxOptions) Check(name func(field string) string) error {
	if name == nil {
		name = jsonName
	}
	return errors.Join(o.problems(name)...)
}

func (o SandboxOptions) problems(name func(string) string) []error {
	var errs []error
	for _, r := range []struct {
		field string
		v     float64
	}{
		{"slow_rate", o.SlowRate}, {"retryable_rate", o.RetryableRate}, {"terminal_rate", o.TerminalRate},
		{"timeout_rate", o.TimeoutRate}, {"hang_rate", o.HangRate},
	} {
		if !(r.v >= 0 && r.v <= 1) { // also catches NaN
			errs = append(errs, fmt.Errorf("%s %v: a rate must be between 0 and 1", name(r.field), r.v))
		}
	}
	// A file's durations were parsed by parseDuration, which refuses
	// negatives itself (and leaves zero): these fire for other callers.
	for _, d := range []struct {
		field string
		v     time.Duration
	}{{"latency_min", o.LatencyMin}, {"latency_max", o.LatencyMax}, {"slow_latency", o.SlowLatency}} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("%s %s: must not be negative", name(d.field), d.v))
		}
	}
	if o.LatencyMax > 0 && o.LatencyMax < o.LatencyMin {
		errs = append(errs, fmt.Errorf("%s %s is below %s %s", name("latency_max"), o.LatencyMax, name("latency_min"), o.LatencyMin))
	}
	if o.SlowRate > 0 && o.SlowLatency <= 0 {
		errs = append(errs, fmt.Errorf("%s needs %s", name("slow_rate"), name("slow_latency")))
	}
	if o.Remember < 0 {
		errs = append(errs, fmt.Errorf("%s %d: must not be negative (0: every payment)", name("remember"), o.Remember))
	}
	return errs
}

// Check reports what a rails file's webhook section is refused for about
// its secret, reading nothing: neither or both of File and Env (Load would
// silently prefer the file), AllowWorldReadable without File, an Env that
// cannot name a variable. name is as for [SandboxOptions.Check], with the
// JSON names secret_file, secret_env and allow_world_readable_secret.
func (s SecretSource) Check(name func(field string) string) error {
	if name == nil {
		name = jsonName
	}
	switch {
	case s.File == "" && s.Env == "":
		return fmt.Errorf("needs %s or %s", name("secret_file"), name("secret_env"))
	case s.File != "" && s.Env != "":
		return fmt.Errorf("takes %s or %s, not both", name("secret_file"), name("secret_env"))
	case s.AllowWorldReadable && s.File == "":
		return fmt.Errorf("%s applies to %s only", name("allow_world_readable_secret"), name("secret_file"))
	case s.Env != "" && strings.ContainsAny(s.Env, "=\x00"):
		return fmt.Errorf("%s %q is not an environment variable name", name("secret_env"), s.Env)
	}
	return nil
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
	src := SecretSource{File: w.SecretFile, Env: w.SecretEnv, AllowWorldReadable: w.AllowWorldReadableSecret}
	if err := src.Check(jsonName); err != nil {
		errs = append(errs, at(where, fmt.Errorf("webhook %w", err)))
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
	kind := transports[rc.Transport].Kind
	for _, code := range slices.Sorted(maps.Keys(rc.Codes)) {
		if err := checkCodeRule(code, rc.Codes[code]); err != nil {
			errs = append(errs, at(where, fmt.Errorf("codes.%s: %w", code, err)))
		} else if err := checkAnswerable(kind, code); err != nil {
			errs = append(errs, at(where, fmt.Errorf("codes.%s: %w", code, err)))
		}
	}
	return rp, errs
}

// checkAnswerable refuses a codes key that a transport of kind never
// answers with: its rule would never apply, and the answer it was meant for
// (HTTP 418 for a key "418") would stay a retryable UNKNOWN_RAIL_CODE. A go
// transport's codes are its own, so any is accepted; an unknown kind is
// reported by checkTransport.
func checkAnswerable(kind, code string) error {
	switch kind {
	case TransportKindWebhook:
		if !isWebhookCode(code) {
			return fmt.Errorf("a webhook transport answers only HTTP_<status>, with a three-digit HTTP status (such as HTTP_418), never %q", code)
		}
	case TransportKindSandbox:
		if _, ok := SandboxCodes[code]; !ok {
			return fmt.Errorf("a sandbox transport answers only %s, never %q", strings.Join(slices.Sorted(maps.Keys(SandboxCodes)), ", "), code)
		}
	}
	return nil
}

// railAnswerErrors are the error codes a rail's answer may map to. The
// others belong to the relayer (RELEASED, CIRCUIT_OPEN, RAIL_NOT_CONFIGURED
// and CUT_OFF_AT_STOP do not use up the retry budget, so a rail code
// mapped to one would be retried forever) or to validation before the
// call.
var railAnswerErrors = []ErrorCode{CodeRailRejected, CodeRailUnavailable, CodeRailTimeout, CodeRailTransport, CodeRailUpstreamError, CodeRateLimited}

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
