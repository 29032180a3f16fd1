package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ledgerline/outbox/admin"
	"github.com/ledgerline/outbox/attempts"
	"github.com/ledgerline/outbox/engine"
	"github.com/ledgerline/outbox/internal/lifecycle"
	"github.com/ledgerline/outbox/poolconfig"
	"github.com/ledgerline/outbox/rails"
	"github.com/ledgerline/outbox/reaper"
	"github.com/ledgerline/outbox/relay"
)

// relayFlags are the knobs of `outbox relay` (and of the demo's relayers).
type relayFlags struct {
	railsConfig        string
	relayerID          string
	batchSize          int
	maxConcurrency     int
	pollInterval       time.Duration
	debounce           time.Duration
	pollOnly           bool
	idleRefresh        time.Duration
	leaseGrace         time.Duration
	backoffBase        time.Duration
	backoffCap         time.Duration
	minRetryDelay      time.Duration
	maxAttempts        int
	maxErrorLength     int
	flushSize          int
	outcomeWriters     int
	stopTimeout        time.Duration
	railTimeout        time.Duration
	railMaxConcurrency int
	reaper             bool
	reaperInterval     time.Duration
	reaperBatch        int
	checkpointInterval time.Duration
	zombieLimit        int
	adminAddr          string
	adminTokensFile    string
	adminTokensEnv     string
	adminDatabaseURL   string
	degradedAfter      time.Duration
	adminAuditURL      string
	horizonAfter       time.Duration
	adminCookieSecure  bool
	// adminTokensReadable accepts an --admin-tokens-file others can read.
	adminTokensReadable bool
	adminPrimary        string
	secretCheck         time.Duration
	// adminMaxRequests is admin.Config.MaxConcurrentRequests (0: its
	// default).
	adminMaxRequests int
	// adminTrusted is --admin-trusted-proxies as given (trustedProxies
	// reads it).
	adminTrusted string
}

// register registers every flag of `outbox relay`.
func (f *relayFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.railsConfig, "rails-config", "", "rail configuration file (JSON, see docs/relay-config.md); empty: the sandbox and event rails on the sandbox transport")
	fs.StringVar(&f.relayerID, "relayer-id", "", "relayer id in attempt rows and logs, one per running relayer: two processes under one id are reported (an ERROR line, outbox_relayer_id_conflicts_total, /readyz degraded) (default host-pid-random)")
	fs.DurationVar(&f.secretCheck, "secret-check-interval", DefaultSecretCheckInterval, "how often webhook secret files are read again, a changed secret taking effect without a restart (SIGHUP: at once; docs/relay-config.md)")
	f.registerShared(fs)
	fs.StringVar(&f.adminAuditURL, "admin-audit-database-url", "", "where the console's and the API's audit verify runs: a hot standby (empty: the admin address's connection; on the primary its snapshot holds back vacuum while it runs)")
	fs.BoolVar(&f.adminCookieSecure, "admin-cookie-secure", false, "always mark the console's session cookie Secure: set it when a TLS-terminating proxy serves the admin address (default: Secure only over TLS to this process, which serves plain HTTP)")
	fs.StringVar(&f.adminPrimary, "admin-primary-console", "", "the console of an admin address on the primary (an absolute http or https URL): a console on a standby links to it where it says actions are taken there")
	fs.StringVar(&f.adminDatabaseURL, "admin-database-url", "", "the admin address's own connection (e.g. as outbox_operator with options=-c outbox.tenant=*); empty: the relayer's (which, as outbox_relayer, can neither replay nor read keys)")
}

// registerShared registers the flags that `outbox demo` honours too. The
// demo builds its own rails and names its relayers, so it must not accept
// --rails-config or --relayer-id only to ignore them.
func (f *relayFlags) registerShared(fs *flag.FlagSet) {
	fs.IntVar(&f.batchSize, "batch-size", engine.DefaultBatchSize, "most instructions per claim")
	fs.IntVar(&f.maxConcurrency, "max-concurrency", engine.DefaultMaxConcurrency, "dispatches in progress across all rails")
	fs.DurationVar(&f.pollInterval, "poll-interval", engine.DefaultPollInterval, "fallback poll interval (jittered ±20%; at most 1h)")
	fs.DurationVar(&f.debounce, "debounce", engine.DefaultDebounce, "shortest time between claims prompted by notifications, and the first hot poll after a claim that found work (at most --poll-interval)")
	fs.BoolVar(&f.pollOnly, "poll-only", false, "do not LISTEN (e.g. behind a transaction-pooling proxy); poll only")
	fs.DurationVar(&f.idleRefresh, "idle-refresh", engine.DefaultIdleRefresh, "refresh interval of the idle registration")
	fs.DurationVar(&f.leaseGrace, "lease-grace", engine.DefaultLeaseGrace, "added to a rail's timeout to form the in-flight lease (at least 1s: half of it is for recording the outcome)")
	fs.DurationVar(&f.backoffBase, "backoff-base", engine.DefaultBackoffBase, "first retry delay bound (full-jitter exponential)")
	fs.DurationVar(&f.backoffCap, "backoff-cap", engine.DefaultBackoffCap, "largest retry delay")
	fs.DurationVar(&f.minRetryDelay, "min-retry-delay", 0, "least retry delay, whatever the backoff drew or the rail asked for (0: none; at most 1h)")
	fs.IntVar(&f.maxAttempts, "max-attempts", engine.DefaultMaxAttempts, "attempts before an instruction is dead-lettered")
	fs.IntVar(&f.maxErrorLength, "max-error-length", engine.DefaultMaxErrorLength, "stored error text is truncated to this many bytes")
	fs.IntVar(&f.flushSize, "flush-size", engine.DefaultFlushSize, "outcome batch size")
	fs.IntVar(&f.outcomeWriters, "outcome-writers", engine.DefaultOutcomeWriters, "outcome writes in progress at once (a full write does not wait for the one before it)")
	fs.DurationVar(&f.stopTimeout, "stop-timeout", engine.DefaultStopTimeout, "on SIGTERM, how long in-flight dispatches may finish")
	fs.DurationVar(&f.railTimeout, "rail-timeout", 0, "timeout of every rail without its own (0: 30s; bounds a go transport only if it honours its context)")
	fs.IntVar(&f.railMaxConcurrency, "rail-max-concurrency", 0, "concurrency cap of every rail without its own (0: 32)")
	fs.BoolVar(&f.reaper, "reaper", true, "also run the zombie reaper in the background")
	fs.DurationVar(&f.reaperInterval, "reaper-interval", reaper.DefaultInterval, "reaper pass interval (1s to 1h)")
	fs.IntVar(&f.reaperBatch, "reaper-batch", reaper.DefaultBatchSize, "instructions the reaper requeues per transaction")
	fs.IntVar(&f.zombieLimit, "zombie-limit", reaper.DefaultZombieLimit,
		"requeues of an instruction whose relayer died before the reaper dead-letters it (outcome unknown) as a poison instruction (negative: no limit)")
	fs.DurationVar(&f.checkpointInterval, "checkpoint-interval", reaper.DefaultCheckpointInterval,
		"least time between two archive checkpoints, taken by the reaper's passes (negative: off; docs/audit.md)")
	fs.StringVar(&f.adminAddr, "admin-addr", "", "serve the admin address here (e.g. :9464): /metrics, /healthz, /readyz, and the API with --admin-tokens-*; empty: off")
	formerName(fs, "metrics-addr", "admin-addr")
	fs.StringVar(&f.adminTokensFile, "admin-tokens-file", "", "file of API credentials, one per line: ROLE NAME SECRET (role auditor or operator); without tokens the API is off")
	fs.BoolVar(&f.adminTokensReadable, "admin-tokens-allow-world-readable", false, "accept an --admin-tokens-file that other users of the machine can read (or its group write)")
	fs.StringVar(&f.adminTokensEnv, "admin-tokens-env", "", "name of an environment variable holding API credentials in the same format (lines or ';'-separated)")
	fs.StringVar(&f.adminTrusted, "admin-trusted-proxies", "", "comma-separated addresses or prefixes of proxies in front of the admin address whose X-Forwarded-For names the client wrong secrets are counted against (docs/operations.md, \"Guesses are throttled\"); empty: none, every request counts against the address it came from")
	fs.IntVar(&f.adminMaxRequests, "admin-max-requests", 0, fmt.Sprintf("API and console requests the admin address serves at once, each holding one of its database connections; more wait up to %s, then get 503 BUSY (0: %d; outbox relay's admin pool gets one connection more than this, at least %d)", admin.BusyWait, admin.DefaultMaxConcurrentRequests, adminConns))
	fs.DurationVar(&f.degradedAfter, "degraded-after", admin.DefaultDegradedAfter, "/readyz says degraded once the oldest due instruction has waited this long")
	fs.DurationVar(&f.horizonAfter, "horizon-degraded-after", admin.DefaultHorizonDegradedAfter, "/readyz says degraded once a transaction has held back vacuum this long (docs/operations.md)")
}

// errNegativeRailDefault marks a negative --rail-timeout or
// --rail-max-concurrency.
var errNegativeRailDefault = errors.New("must not be negative")

// checkRailDefaults refuses negative rail defaults, as the rails file
// refuses a negative timeout or max_concurrency: taking the default
// instead would hide the mistake.
func (f *relayFlags) checkRailDefaults() error {
	if f.railTimeout < 0 {
		return fmt.Errorf("--rail-timeout %s %w (0: the default, %s)", f.railTimeout, errNegativeRailDefault, rails.DefaultTimeout)
	}
	if f.railMaxConcurrency < 0 {
		return fmt.Errorf("--rail-max-concurrency %d %w (0: the default, %d)", f.railMaxConcurrency, errNegativeRailDefault, rails.DefaultMaxConcurrency)
	}
	return nil
}

// loadRails builds the rail set from --rails-config (or the default).
func (f *relayFlags) loadRails(log *slog.Logger) (*rails.Built, error) {
	if err := f.checkRailDefaults(); err != nil {
		return nil, err
	}
	cfg := rails.DefaultConfig()
	if f.railsConfig == "" {
		// The default suits a trial run; in production it would claim
		// every instruction of these types and record it delivered to
		// this process's memory.
		types := make([]string, len(cfg.Rails))
		for i, r := range cfg.Rails {
			types[i] = r.Type
		}
		log.Warn("no --rails-config: these rail types are dispatched to the built-in sandbox rail, in this process's memory; nothing is sent anywhere",
			"rail_types", strings.Join(types, ","))
	} else {
		var err error
		if cfg, err = rails.LoadConfig(f.railsConfig); err != nil {
			return nil, err
		}
	}
	for i := range cfg.Rails {
		if cfg.Rails[i].Timeout == "" && f.railTimeout > 0 {
			cfg.Rails[i].Timeout = f.railTimeout.String()
		}
		if cfg.Rails[i].MaxConcurrency == 0 && f.railMaxConcurrency > 0 {
			cfg.Rails[i].MaxConcurrency = f.railMaxConcurrency
		}
	}
	return cfg.Build(rails.BuildOptions{OnBreakerChange: func(railType string, from, to rails.BreakerState) {
		log.Warn("circuit breaker changed state", "rail", railType, "from", from.String(), "to", to.String())
	}})
}

func (f *relayFlags) engineConfig(schema string, set *rails.Set, log *slog.Logger) engine.Config {
	return engine.Config{
		Schema: schema, RelayerID: f.relayerID, Rails: set, BatchSize: f.batchSize,
		MaxConcurrency: f.maxConcurrency, PollInterval: f.pollInterval,
		Debounce: f.debounce, PollOnly: f.pollOnly, IdleRefresh: f.idleRefresh, LeaseGrace: f.leaseGrace,
		BackoffBase: f.backoffBase, BackoffCap: f.backoffCap, MinRetryDelay: f.minRetryDelay, MaxAttempts: f.maxAttempts,
		MaxErrorLength: f.maxErrorLength, FlushSize: f.flushSize, OutcomeWriters: f.outcomeWriters,
		StopTimeout: f.stopTimeout, Logger: log,
	}
}

// adminConns is the size of the admin address's pool: probes, pages and
// API requests, a verify without --admin-audit-database-url.
const adminConns = 4

// errNegativeAdminRequests marks a negative --admin-max-requests.
var errNegativeAdminRequests = errors.New("must not be negative")

// checkAdmin refuses a negative --admin-max-requests as a usage error (0
// is the default, and taking it for a flipped sign would hide the
// mistake; admin.New refuses it too, less plainly), one whose pool would
// not fit a pool's int32, and an --admin-trusted-proxies it cannot read.
func (f *relayFlags) checkAdmin() error {
	if f.adminMaxRequests < 0 {
		return fmt.Errorf("%w: --admin-max-requests %d %w (0: the default, %d)", errUsage, f.adminMaxRequests, errNegativeAdminRequests, admin.DefaultMaxConcurrentRequests)
	}
	if f.adminMaxRequests > math.MaxInt32-1 {
		// The admin pool has one connection more, and a pool's size is
		// an int32: past it the size wrapped (to 4, or negative).
		return fmt.Errorf("%w: --admin-max-requests %d is out of range: 0 (the default, %d) to %d", errUsage, f.adminMaxRequests, admin.DefaultMaxConcurrentRequests, math.MaxInt32-1)
	}
	_, err := f.trustedProxies()
	return err
}

// readinessFlags are the flags only the admin address's /readyz reads.
var readinessFlags = [...]string{"degraded-after", "horizon-degraded-after"}

// checkReadinessFlags refuses a readiness threshold given on the command
// line without --admin-addr: nothing would read it, and a deployment that
// meant to tune its probes would have none without a word. Set through
// its variable, it is warned of instead (warning): an environment shared
// by several processes may set it for the one relayer that serves the
// admin address, and an upgrade must not stop the others from starting.
func (f *relayFlags) checkReadinessFlags(fs *flag.FlagSet, onCommandLine map[string]bool) (warning string, err error) {
	if f.adminAddr != "" {
		return "", nil
	}
	// Visit sees the flags parseFlags set from their variables too.
	fs.Visit(func(fl *flag.Flag) {
		if err != nil || !slices.Contains(readinessFlags[:], fl.Name) {
			return
		}
		if !onCommandLine[fl.Name] {
			if warning == "" {
				warning = envName(fl.Name) + " (--" + fl.Name + ") is a threshold of /readyz, which only the admin address serves: without --admin-addr nothing reads it"
			}
			return
		}
		err = fmt.Errorf("%w: --%s is a threshold of /readyz, which only the admin address serves: it needs --admin-addr", errUsage, fl.Name)
	})
	return warning, err
}

// errTrustedProxies marks an --admin-trusted-proxies entry that is
// neither an address nor a prefix.
var errTrustedProxies = errors.New("is neither an IP address nor a prefix (e.g. 10.0.0.0/8)")

// trustedProxies reads --admin-trusted-proxies: comma-separated prefixes
// or single addresses (nil: none). An entry it cannot read is a usage
// error naming it: a host name would trust nothing, and the proxy's
// clients would be throttled together without a word.
func (f *relayFlags) trustedProxies() ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, e := range strings.Split(f.adminTrusted, ",") {
		if e = strings.TrimSpace(e); e == "" {
			continue
		}
		p, err := netip.ParsePrefix(e)
		if err != nil {
			a, aerr := netip.ParseAddr(e)
			if aerr != nil {
				return nil, fmt.Errorf("%w: --admin-trusted-proxies: %q %w", errUsage, e, errTrustedProxies)
			}
			p = netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// adminPoolConns is the size of the admin address's pool: adminConns, or
// one connection per request --admin-max-requests lets it serve at once
// and one for the probes and scrapes.
func (f *relayFlags) adminPoolConns() int32 {
	return int32(max(adminConns, f.adminMaxRequests+1))
}

// relayerIDPlaceholder stands for the relayer id in the default
// application name of `outbox relay`, until the id is known.
const relayerIDPlaceholder = "<relayer-id>"

// serviceConfig is the relay service's configuration from the flags.
func (f *relayFlags) serviceConfig(schema string, set *rails.Set, log *slog.Logger) relay.Config {
	return relay.Config{
		Relayer: f.engineConfig(schema, set, log),
		Reaper: reaper.Config{Interval: f.reaperInterval, BatchSize: f.reaperBatch, CheckpointInterval: f.checkpointInterval,
			ZombieLimit: f.zombieLimit},
		NoReaper: !f.reaper,
	}
}

func runRelay(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet(env, "relay", "relay [flags]")
	var db dbFlags
	var rf relayFlags
	db.register(fs, poolconfig.Relayer(relayerIDPlaceholder))
	rf.register(fs)
	maxConns := fs.Int("max-conns", 0, "database pool size (0: max-concurrency/4 + 8; at most 2147483647)")
	logFormat := fs.String("log-format", "json", "log format: json or text")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn, error")
	onCommandLine, err := parseFlags(fs, env, args)
	if err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected arguments %q", errUsage, fs.Args())
	}
	unread, err := rf.checkReadinessFlags(fs, onCommandLine)
	if err != nil {
		return err
	}
	log, err := newLogger(env.stderr, *logFormat, *logLevel)
	if err != nil {
		return err
	}
	if unread != "" {
		log.Warn(unread)
	}
	if rf.secretCheck <= 0 {
		return fmt.Errorf("%w: --secret-check-interval must be positive", errUsage)
	}
	if err := rf.checkAdmin(); err != nil {
		return err
	}
	built, err := rf.loadRails(log)
	if err != nil {
		return fmt.Errorf("%w: rails configuration: %w", errUsage, err)
	}
	// Secret files are read again while the relayer runs: a rotated
	// secret must not need a restart of every relayer.
	secrets := newSecretReporter(log, signingSecret)
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	secretWatch(watchCtx, rf.secretCheck, func() {
		for _, res := range built.Set.ReloadSecrets() {
			secrets.report(res)
		}
	})
	if *maxConns < 0 || *maxConns > math.MaxInt32 {
		// Negative is a flipped sign, not the default; past a pool's
		// int32 it wrapped (4294967297 to one connection).
		return fmt.Errorf("%w: --max-conns %d is out of range: 0 (max-concurrency/4 + 8) to %d", errUsage, *maxConns, math.MaxInt32)
	}
	conns := int32(*maxConns)
	if conns == 0 {
		conns = int32(rf.maxConcurrency/4 + 8)
	}
	// The relayer id names the connections too, so it is settled first.
	if rf.relayerID == "" {
		rf.relayerID = lifecycle.ProcessID()
	}
	db.settings.ApplicationName = strings.ReplaceAll(db.settings.ApplicationName, relayerIDPlaceholder, rf.relayerID)
	if db.behindTransactionPooler() && !rf.pollOnly {
		log.Info("behind a transaction pooler LISTEN cannot work (notifications go to whichever server session the pooler picked): polling only",
			"poll_interval", rf.pollInterval)
		rf.pollOnly = true
	}
	pool, cleanup, err := db.connect(ctx, log, conns)
	if err != nil {
		return err
	}
	defer cleanup()

	cfg := rf.serviceConfig(db.schema, built.Set, log)
	var registry *prometheus.Registry
	if rf.adminAddr != "" {
		registry = prometheus.NewRegistry()
		cfg.Metrics = registry
	}
	svc, err := relay.New(pool, cfg)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if rf.adminAddr != "" {
		tokens, err := rf.adminTokens(env)
		if err != nil {
			return fmt.Errorf("%w: %v", errUsage, err)
		}
		// The admin address has a pool of its own, on the relayer's
		// database without --admin-database-url: its requests (a
		// verify reading the archive, pages waiting for a lock) must not
		// hold the connections the relayer claims and records with,
		// whose outcomes would wait for them past their leases.
		adminURL := rf.adminDatabaseURL
		if adminURL == "" {
			// The relayer pool's URL: the embedded cluster's too, which
			// an empty --database-url would attach to a second time.
			adminURL = pool.Config().ConnString()
		}
		admPool, closeAdmin, err := db.connectTo(ctx, log, adminURL, "outbox-admin "+rf.relayerID, rf.adminPoolConns())
		if err != nil {
			return err
		}
		defer closeAdmin()
		auditPool := (*pgxpool.Pool)(nil)
		if rf.adminAuditURL != "" {
			p, closeAudit, err := db.connectTo(ctx, log, rf.adminAuditURL, "outbox-admin-audit "+rf.relayerID, attempts.DefaultVerifyWorkers)
			if err != nil {
				return err
			}
			defer closeAudit()
			auditPool = p
		}
		trusted, err := rf.trustedProxies()
		if err != nil {
			return err
		}
		adm, err := admin.New(admin.Config{Pool: admPool, AuditPool: auditPool, Schema: db.schema, Tokens: tokens, Rails: built.Set,
			Relayer: svc.Relayer(), DegradedAfter: rf.degradedAfter, HorizonDegradedAfter: rf.horizonAfter,
			SecureCookie: rf.adminCookieSecure, PrimaryConsole: rf.adminPrimary, MaxConcurrentRequests: rf.adminMaxRequests, TrustedProxies: trusted, Logger: log})
		if err != nil {
			return fmt.Errorf("%w: %v", errUsage, err)
		}
		shutdown, _, err := serveAdmin(rf.adminAddr, adm, registry, log)
		if err != nil {
			return err
		}
		defer shutdown()
		// Not ready from the moment a stop begins, while in-flight work
		// finishes.
		stopped := make(chan struct{})
		defer close(stopped)
		go func() {
			select {
			case <-ctx.Done():
				adm.SetStopping()
			case <-stopped:
			}
		}()
	}
	// Start checks the database first and refuses errors no retry can fix
	// (credentials, privileges, schema version): nothing runs then.
	return svc.Run(ctx)
}

// adminTokens reads the API credentials named by --admin-tokens-file and
// --admin-tokens-env (none: the API is off). A name or a secret used twice,
// within one source or across the two, is refused.
func (f *relayFlags) adminTokens(env *environment) ([]admin.Token, error) {
	var all []admin.Token
	if f.adminTokensFile != "" {
		file, err := os.Open(f.adminTokensFile)
		if err != nil {
			return nil, err
		}
		defer file.Close()
		// Whoever reads an operator's secret replays, cancels and pauses
		// payments: the file is held to the rule of a webhook secret file.
		fi, err := file.Stat()
		if err != nil {
			return nil, err
		}
		if perm := fi.Mode().Perm(); perm&0o026 != 0 && !f.adminTokensReadable {
			return nil, fmt.Errorf("%w: %s has mode %04o, so other users of the machine can read its secrets (or its group write them); make it readable by its owner only (chmod 600; 640 for a group) or allow it with --admin-tokens-allow-world-readable",
				admin.ErrTokens, f.adminTokensFile, perm)
		}
		if all, err = admin.ParseTokens(file); err != nil {
			return nil, fmt.Errorf("%s: %w", f.adminTokensFile, err)
		}
	}
	if f.adminTokensEnv != "" {
		v := env.getenv(f.adminTokensEnv)
		if v == "" {
			return nil, fmt.Errorf("--admin-tokens-env: $%s is empty", f.adminTokensEnv)
		}
		more, err := admin.ParseTokens(strings.NewReader(strings.ReplaceAll(v, ";", "\n")))
		if err != nil {
			return nil, fmt.Errorf("$%s: %w", f.adminTokensEnv, err)
		}
		all = append(all, more...)
		// Each source is checked on its own above; a name or a secret in
		// both would make the archive's "who" or a request's role depend
		// on which token matched.
		if f.adminTokensFile != "" {
			if err := admin.CheckTokens(all); err != nil {
				return nil, fmt.Errorf("%s and $%s together: %w", f.adminTokensFile, f.adminTokensEnv, err)
			}
		}
	}
	return all, nil
}

// serveAdmin serves the admin address (/metrics, the probes, the API and
// the console) until the returned shutdown is called; bound is the address
// it listens on.
func serveAdmin(addr string, adm *admin.Server, registry *prometheus.Registry, log *slog.Logger) (shutdown func(), bound string, err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, "", err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
	mux.Handle("/", adm.Handler())
	srv := adminHTTPServer(mux, defaultAdminLimits)
	log.Info("serving the admin address", "addr", ln.Addr().String())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("admin server", "err", err)
		}
	}()
	return func() {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		<-done
	}, ln.Addr().String(), nil
}

// adminLimits bounds what one client of the admin address can hold: the
// address is reachable by probes and browsers, and each open connection
// costs a goroutine and a file descriptor.
type adminLimits struct {
	// header bounds the request line and headers, read bounds the whole
	// request with its body (a client trickling a body holds the handler
	// otherwise), idle a kept-alive connection between requests.
	header, read, idle time.Duration
}

// defaultAdminLimits: a form or an API body is a few hundred bytes, so 30 s
// is generous for a slow link. There is no write timeout: a verify from the
// console or the API reads the whole archive within its request, and a
// client that goes away cancels it through the request's context.
var defaultAdminLimits = adminLimits{header: 5 * time.Second, read: 30 * time.Second, idle: 2 * time.Minute}

// adminHTTPServer is the admin address's server with lim applied.
func adminHTTPServer(h http.Handler, lim adminLimits) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: lim.header,
		ReadTimeout:       lim.read,
		IdleTimeout:       lim.idle,
		MaxHeaderBytes:    64 << 10,
	}
}

func runReap(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet(env, "reap", "reap [flags]   (one pass; prints each requeued instruction as a JSON line)")
	var db dbFlags
	db.register(fs, poolconfig.Operator("reap"))
	batch := fs.Int("batch", reaper.DefaultBatchSize, "instructions requeued per transaction")
	// The fleet's limit, or a manual pass dead-letters at the default what
	// the relayers' reapers would have requeued (or the other way round).
	zombieLimit := fs.Int("zombie-limit", reaper.DefaultZombieLimit,
		"requeues of an instruction whose relayer died before it is dead-lettered (outcome unknown) as a poison instruction (negative: no limit); use the relayers' --zombie-limit")
	logFormat := fs.String("log-format", "text", "log format: text or json")
	if _, err := parseFlags(fs, env, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: reap takes no arguments (one pass is all it does), not %q", errUsage, fs.Args())
	}
	log, err := newLogger(env.stderr, *logFormat, "warn")
	if err != nil {
		return err
	}
	pool, cleanup, err := db.connect(ctx, log, 2)
	if err != nil {
		return err
	}
	defer cleanup()
	rp, err := reaper.New(pool, reaper.Config{Schema: db.schema, BatchSize: *batch, ZombieLimit: *zombieLimit, Logger: log})
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	requeued, err := rp.RunOnce(ctx)
	out := json.NewEncoder(env.stdout)
	for _, q := range requeued {
		_ = out.Encode(struct {
			OutboxID      string    `json:"outbox_id"`
			InstructionID string    `json:"instruction_id"`
			ParticipantID string    `json:"participant_id"`
			SequenceID    int64     `json:"sequence_id"`
			AttemptNo     int       `json:"attempt_no"`
			RelayerID     string    `json:"relayer_id"`
			LeaseUntil    time.Time `json:"lease_until"`
			RequeuedAt    time.Time `json:"requeued_at"`
		}{q.OutboxID.String(), q.InstructionID, q.ParticipantID, q.SequenceID, q.AttemptNo, q.RelayerID, q.LeaseUntil, q.RequeuedAt})
	}
	if err != nil {
		// Printed above: what was requeued before the failure, if anything.
		return err
	}
	fmt.Fprintf(env.stderr, "requeued %d zombie instruction(s)\n", len(requeued))
	return nil
}
