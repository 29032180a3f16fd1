package rails

import (
	"errors"
	"maps"
	"os"
)

// Build checks the configuration ([Config.Validate]), builds every declared
// transport (reading webhook secrets and CA files; nothing is dialled) and
// the rail [Set]. A webhook's secret_file can be read again later, without
// a new Build, by [Set.ReloadSecrets]. A sandbox transport is one [Sandbox] shared by every rail
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

// buildWebhook reads the secret and builds the transport. A secret file
// becomes a [RotatingSecret], read again by [Set.ReloadSecrets]; a
// variable cannot change in a running process and is read once. Errors
// name the secret's file or variable, never its value.
func buildWebhook(w WebhookConfig, getenv func(string) string) (*Webhook, error) {
	src := SecretSource{File: w.SecretFile, Env: w.SecretEnv, AllowWorldReadable: w.AllowWorldReadableSecret, Getenv: getenv}
	if src.File != "" {
		rs, err := NewRotatingSecret(src, 0)
		if err != nil {
			return nil, err
		}
		return NewWebhook(WebhookOptions{URL: w.URL, RotatingSecret: rs, CAFile: w.CAFile})
	}
	secret, err := src.Load()
	if err != nil {
		return nil, err
	}
	defer clear(secret) // NewWebhook keeps its own copy
	return NewWebhook(WebhookOptions{URL: w.URL, Secret: secret, CAFile: w.CAFile})
}
