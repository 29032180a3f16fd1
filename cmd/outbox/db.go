package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/internal/pglocal"
	"github.com/ledgerline/outbox/migrations"
	"github.com/ledgerline/outbox/poolconfig"
)

// dbFlags select the database (a URL, or else the embedded local cluster)
// and the session settings of this command's connections.
type dbFlags struct {
	url      string
	schema   string
	dataDir  string
	pooler   string
	settings poolconfig.Settings // the command's defaults, overridden by flags
}

// register adds the database flags, with defaults for a command whose
// process role is described by defaults (see package poolconfig).
func (d *dbFlags) register(fs *flag.FlagSet, defaults poolconfig.Settings) {
	d.settings = defaults
	fs.StringVar(&d.url, "database-url", "", "PostgreSQL URL; empty starts (or reuses) the embedded local cluster in --data-dir")
	fs.StringVar(&d.schema, "schema", migrations.DefaultSchema, "schema holding the outbox tables")
	fs.StringVar(&d.dataDir, "data-dir", ".data/pg", "data directory of the embedded local cluster (used when --database-url is empty)")
	fs.StringVar(&d.pooler, "pooler", string(poolconfig.PoolerNone), "what stands between us and PostgreSQL: none, or transaction (PgBouncer pool_mode=transaction: no LISTEN, no migrations, timeouts from the role)")
	fs.StringVar(&d.settings.ApplicationName, "application-name", defaults.ApplicationName, "application_name of the connections (pg_stat_activity); a URL's application_name wins")
	fs.DurationVar(&d.settings.StatementTimeout, "statement-timeout", defaults.StatementTimeout, "statement_timeout of the connections (0: the server's or role's; rounded up to whole milliseconds)")
	fs.DurationVar(&d.settings.LockTimeout, "lock-timeout", defaults.LockTimeout, "lock_timeout of the connections (0: the server's or role's; rounded up to whole milliseconds)")
	fs.DurationVar(&d.settings.IdleInTransactionTimeout, "idle-in-transaction-timeout", defaults.IdleInTransactionTimeout, "idle_in_transaction_session_timeout of the connections (0: the server's or role's; rounded up to whole milliseconds)")
}

// checkTimeouts refuses a timeout flag the server cannot take as given:
// negative (dropped, it left the sessions with no timeout at all) or
// beyond PostgreSQL's int of milliseconds (refused by the server on every
// connection, so a relayer retried its connections for as long as it ran).
func (d *dbFlags) checkTimeouts() error {
	for _, f := range []struct {
		flag string
		v    time.Duration
	}{
		{"--statement-timeout", d.settings.StatementTimeout},
		{"--lock-timeout", d.settings.LockTimeout},
		{"--idle-in-transaction-timeout", d.settings.IdleInTransactionTimeout},
	} {
		if err := poolconfig.CheckTimeout(f.v); err != nil {
			return fmt.Errorf("%w: %s: %w", errUsage, f.flag, err)
		}
	}
	return nil
}

// behindTransactionPooler reports whether --pooler is transaction.
func (d *dbFlags) behindTransactionPooler() bool {
	return d.pooler == string(poolconfig.PoolerTransaction)
}

// connectTo opens a second pool with these settings, to url and named
// application (the admin address's own connections).
func (d dbFlags) connectTo(ctx context.Context, log *slog.Logger, url, application string, maxConns int32) (*pgxpool.Pool, func(), error) {
	d.url, d.settings.ApplicationName = url, application
	return d.connect(ctx, log, maxConns)
}

// connect opens a pool. Without a URL it starts the embedded cluster, or
// attaches to it if it already runs; the returned cleanup closes the pool
// and stops a cluster this call started.
func (d *dbFlags) connect(ctx context.Context, log *slog.Logger, maxConns int32) (*pgxpool.Pool, func(), error) {
	if err := migrations.ValidateSchema(d.schema); err != nil {
		return nil, nil, fmt.Errorf("%w: %v", errUsage, err)
	}
	if err := d.checkTimeouts(); err != nil {
		return nil, nil, err
	}
	pooler, err := poolconfig.ParsePooler(d.pooler)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: --pooler: %v", errUsage, err)
	}
	settings := d.settings
	settings.Pooler = pooler
	url := d.url
	stop := func() {}
	if url == "" {
		dir, err := filepath.Abs(d.dataDir)
		if err != nil {
			return nil, nil, err
		}
		cluster, err := pglocal.Start(ctx, pglocal.Options{DataDir: dir, Fsync: true, Log: log,
			Settings: map[string]string{"max_connections": "200"}})
		if err != nil {
			return nil, nil, fmt.Errorf("embedded PostgreSQL: %w", err)
		}
		url = cluster.ConnString("postgres")
		log.Info("using embedded PostgreSQL", "data_dir", dir, "url", url)
		if cluster.Started() {
			stop = func() {
				sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				if err := cluster.Stop(sctx); err != nil {
					log.Warn("stopping embedded PostgreSQL", "err", err)
				}
			}
		}
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		stop()
		return nil, nil, fmt.Errorf("%w: --database-url: %v", errUsage, err)
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	if skipped := settings.ApplyPool(cfg); len(skipped) > 0 {
		log.Warn("behind a transaction pooler these settings cannot be sent at connect; set them on the database role (ALTER ROLE ... SET ...)",
			"not_applied", skipped)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		stop()
		return nil, nil, fmt.Errorf("connect: %w", err)
	}
	return pool, func() { pool.Close(); stop() }, nil
}
