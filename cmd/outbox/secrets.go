package main

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/ledgerline/outbox/rails"
)

// DefaultSecretCheckInterval is how often `outbox relay` and `outbox
// sandbox serve` look whether a secret file changed. Reading a small
// file is cheap; a Kubernetes secret volume takes about a minute to show
// a change anyway, and SIGHUP checks at once.
const DefaultSecretCheckInterval = 10 * time.Second

// secretWatch calls reload every interval and whenever the process gets
// SIGHUP, until ctx ends. Both: a secret volume changes the file without
// telling anyone (the periodic check finds it), and an operator who has
// just replaced a file wants it read now, not within the interval. SIGHUP
// is caught from the call on (its default action ends the process), so
// a signal sent once the command prints that it runs is never fatal.
func secretWatch(ctx context.Context, interval time.Duration, reload func()) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		defer signal.Stop(hup)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			case <-hup:
			}
			reload()
		}
	}()
}

// secretReporter logs the results of secret reloads: a rotation at once,
// a refused or unsettled file when its error differs from the last one
// logged for that file (a check every few seconds must not repeat it).
type secretReporter struct {
	log  *slog.Logger
	last map[string]string // source → last error logged ("" none)
}

func newSecretReporter(log *slog.Logger) *secretReporter {
	return &secretReporter{log: log, last: make(map[string]string)}
}

// report logs one reload's result.
func (r *secretReporter) report(res rails.SecretReload) {
	msg := ""
	if res.Err != nil {
		msg = res.Err.Error()
	}
	switch {
	case res.Changed:
		r.log.Info("webhook secret rotated: requests are signed with the secret its file holds now", "secret_file", res.Source, "rails", res.Rails)
	case msg == r.last[res.Source]:
	case res.Err == nil:
		r.log.Info("webhook secret file is usable again (it holds the secret in force)", "secret_file", res.Source, "rails", res.Rails)
	case errors.Is(res.Err, rails.ErrSecretChanging):
		r.log.Info("webhook secret file is still being written; read again at the next check", "secret_file", res.Source, "rails", res.Rails)
	default:
		r.log.Error("webhook secret file refused: requests are still signed with the secret in force", "secret_file", res.Source,
			"rails", res.Rails, "err", res.Err)
	}
	r.last[res.Source] = msg
}
