package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/pending"
	"github.com/ledgerline/outbox/rails"
)

// flagName is the flag of a field of the rails configuration file
// (slow_rate is --slow-rate), for the checks shared with that file.
func flagName(field string) string { return "--" + strings.ReplaceAll(field, "_", "-") }

// runSandbox serves the sandbox rail over HTTP, speaking the webhook
// transport's protocol, so its memory of idempotency keys outlives the
// relayers that call it (crash tests kill relayers, not the rail).
func runSandbox(ctx context.Context, env *environment, args []string) error {
	if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
		fmt.Fprintln(env.stdout, "usage: outbox sandbox serve [flags]   (outbox sandbox serve --help for the flags)")
		return nil
	}
	if len(args) == 0 || args[0] != "serve" {
		return fmt.Errorf("%w: usage: outbox sandbox serve [flags]", errUsage)
	}
	fs := newFlagSet(env, "sandbox serve", "sandbox serve [flags]   (POST / webhook protocol, signed; GET /stats, /attempts and /healthz are unauthenticated: this is a test double, its counters are not secret)")
	addr := fs.String("addr", "127.0.0.1:0", "listen address (port 0: pick one; the address is printed on stdout)")
	secretFile := fs.String("secret-file", "", "file holding the HMAC secret that requests must be signed with")
	secretEnv := fs.String("secret-env", "", "environment variable holding the HMAC secret (name, not value)")
	secretCheck := fs.Duration("secret-check-interval", DefaultSecretCheckInterval, "how often --secret-file is read again, a changed secret taking effect without a restart (SIGHUP: at once)")
	keepPrevious := fs.Duration("previous-secret-for", 10*time.Minute, "after --secret-file changes, requests signed with the previous secret are still accepted this long: the time the relayers get to take the new one")
	allowReadable := fs.Bool("allow-world-readable-secret", false, "accept a --secret-file that other users of the machine can read")
	readTimeout := fs.Duration("read-timeout", 30*time.Second, "longest time to read a request (headers within 10s at most)")
	idleTimeout := fs.Duration("idle-timeout", 2*time.Minute, "keep-alive connections idle this long are closed")
	maxPayload := fs.Int("max-payload-bytes", payment.DefaultMaxPayloadBytes, "the producers' payload limit (outbox enqueue --max-payload-bytes): request bodies are capped to fit the largest such payload")
	var o rails.SandboxOptions
	fs.Int64Var(&o.Seed, "seed", 1, "seed of every injected behaviour")
	fs.DurationVar(&o.LatencyMin, "latency-min", 0, "fastest answer")
	fs.DurationVar(&o.LatencyMax, "latency-max", 0, "slowest answer")
	fs.Float64Var(&o.SlowRate, "slow-rate", 0, "share of calls that take --slow-latency")
	fs.DurationVar(&o.SlowLatency, "slow-latency", 0, "latency of slow calls")
	fs.Float64Var(&o.RetryableRate, "retryable-rate", 0, "share of calls answered 503 without paying")
	fs.Float64Var(&o.TerminalRate, "terminal-rate", 0, "share of payments rejected with 422")
	fs.Float64Var(&o.TimeoutRate, "timeout-rate", 0, "share of calls that pay and then never answer")
	fs.Float64Var(&o.HangRate, "hang-rate", 0, "share of calls that never answer and do not pay")
	fs.BoolVar(&o.RecordAttempts, "record-attempts", false, "keep the id of every attempt called for, served at GET /attempts (memory grows with every attempt)")
	if _, err := parseFlags(fs, env, args[1:]); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected arguments %q", errUsage, fs.Args())
	}
	// The checks a rails file's sandbox transport and webhook secret get:
	// the flags must not accept what the file refuses.
	src := rails.SecretSource{File: *secretFile, Env: *secretEnv, AllowWorldReadable: *allowReadable, Getenv: env.getenv}
	if err := errors.Join(o.Check(flagName), src.Check(flagName)); err != nil {
		return fmt.Errorf("%w: sandbox serve: %w", errUsage, err)
	}
	if *secretCheck <= 0 || *keepPrevious < 0 {
		return fmt.Errorf("%w: --secret-check-interval must be positive and --previous-secret-for not negative", errUsage)
	}
	if *secretFile == "" {
		// A variable cannot change in a running process: refused, not
		// ignored.
		var given []string
		fs.Visit(func(f *flag.Flag) {
			if f.Name == "secret-check-interval" || f.Name == "previous-secret-for" {
				given = append(given, "--"+f.Name)
			}
		})
		if len(given) > 0 {
			return fmt.Errorf("%w: sandbox serve: %s only apply to --secret-file", errUsage, strings.Join(given, " and "))
		}
	}
	secret, err := rails.NewRotatingSecret(src, *keepPrevious)
	if err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	if *readTimeout <= 0 || *idleTimeout <= 0 {
		return fmt.Errorf("%w: --read-timeout and --idle-timeout must be positive", errUsage)
	}
	if *maxPayload < 0 {
		return fmt.Errorf("%w: --max-payload-bytes must not be negative (0: the default, %d)", errUsage, payment.DefaultMaxPayloadBytes)
	}
	if *maxPayload > pending.MaxBatchPayloadBytes {
		return fmt.Errorf("%w: --max-payload-bytes %d is past what any producer may set, pending.MaxBatchPayloadBytes (%d)", errUsage, *maxPayload, pending.MaxBatchPayloadBytes)
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	// Bounded reads and idle connections: a client that opens connections
	// and sends nothing (or trickles a body) must not pin them forever.
	// There is no write timeout: injected hangs and paid-then-silent
	// timeouts last until the client gives up, as a real rail's would.
	srv := &http.Server{
		// The body cap follows the producers' payload limit: a fixed one
		// refused instructions the engine had accepted.
		Handler:           rails.NewSandboxHandlerSecret(rails.NewSandbox(o), secret, *maxPayload),
		ReadHeaderTimeout: min(10*time.Second, *readTimeout),
		ReadTimeout:       *readTimeout,
		IdleTimeout:       *idleTimeout,
		MaxHeaderBytes:    64 << 10,
	}
	if *secretFile != "" {
		log := slog.New(slog.NewTextHandler(env.stderr, nil))
		secrets := newSecretReporter(log, checkingSecret)
		watchCtx, stopWatch := context.WithCancel(ctx)
		defer stopWatch()
		secretWatch(watchCtx, *secretCheck, func() {
			changed, err := secret.Reload()
			secrets.report(rails.SecretReload{Source: *secretFile, Changed: changed, Err: err})
		})
	}
	fmt.Fprintf(env.stdout, "sandbox rail listening on http://%s\n", ln.Addr())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		return nil
	}
}
