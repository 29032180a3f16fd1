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
)

// dbFlags select the database: a URL, or else the embedded local cluster.
type dbFlags struct {
	url     string
	schema  string
	dataDir string
}

func (d *dbFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&d.url, "database-url", "", "PostgreSQL URL; empty starts (or reuses) the embedded local cluster in --data-dir")
	fs.StringVar(&d.schema, "schema", migrations.DefaultSchema, "schema holding the outbox tables")
	fs.StringVar(&d.dataDir, "data-dir", ".data/pg", "data directory of the embedded local cluster (used when --database-url is empty)")
}

// connect opens a pool. Without a URL it starts the embedded cluster, or
// attaches to it if it already runs; the returned cleanup closes the pool
// and stops a cluster this call started.
func (d *dbFlags) connect(ctx context.Context, log *slog.Logger, maxConns int32) (*pgxpool.Pool, func(), error) {
	if err := migrations.ValidateSchema(d.schema); err != nil {
		return nil, nil, fmt.Errorf("%w: %v", errUsage, err)
	}
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
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		stop()
		return nil, nil, fmt.Errorf("connect: %w", err)
	}
	return pool, func() { pool.Close(); stop() }, nil
}
