package rails

import "github.com/ledgerline/outbox/payment"

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
	// CrashKeys: see [SandboxOptions].
	CrashKeys []string `json:"crash_keys,omitempty"`
	// Remember: see [SandboxOptions] (0: every payment, for good).
	Remember int `json:"remember,omitempty"`
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

// DefaultSandboxRemember is how many recent payments the sandbox transport
// of [DefaultConfig] remembers: a relayer left running without a rails
// file kept every payment it ever made (about 200 bytes each).
const DefaultSandboxRemember = 100_000

// DefaultConfig is the configuration `outbox relay` uses without a file:
// one sandbox transport named "sandbox" that injects no failures, serving
// the rail types of [payment.DefaultCatalog]: "sandbox" (generic profile) and
// "event" (event profile).
func DefaultConfig() *Config {
	return &Config{
		Transports: map[string]TransportConfig{
			"sandbox": {Kind: TransportKindSandbox, Sandbox: &SandboxConfig{Remember: DefaultSandboxRemember}},
		},
		Rails: []RailConfig{
			{Type: "sandbox", Profile: "generic", Transport: "sandbox"},
			{Type: "event", Profile: "event", Transport: "sandbox"},
		},
	}
}
