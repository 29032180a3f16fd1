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
	role secretRole
	last map[string]string // source → last error logged ("" none)
}

// secretRole is what a process does with the secret it reloads, which
// its log lines say: a relayer signs its requests to webhook rails, the
// sandbox server checks the requests it gets.
type secretRole struct {
	name string // what the secret is
	use  string // what the secret in force does, after "requests are"
}

var (
	signingSecret  = secretRole{name: "webhook secret", use: "signed with"}
	checkingSecret = secretRole{name: "sandbox rail's secret", use: "checked against"}
)

func newSecretReporter(log *slog.Logger, role secretRole) *secretReporter {
	return &secretReporter{log: log, role: role, last: make(map[string]string)}
}

// report logs one reload's result.
func (r *secretReporter) report(res rails.SecretReload) {
	msg := ""
	if res.Err != nil {
		msg = res.Err.Error()
	}
	attrs := []any{"secret_file", res.Source}
	if len(res.Rails) > 0 {
		attrs = append(attrs, "rails", res.Rails)
	}
	name, use := r.role.name, r.role.use
	switch {
	case res.Changed:
		r.log.Info(name+" rotated: requests are "+use+" the secret its file holds now", attrs...)
	case msg == r.last[res.Source]:
	case res.Err == nil:
		r.log.Info(name+" file is usable again (it holds the secret in force)", attrs...)
	case errors.Is(res.Err, rails.ErrSecretChanging):
		r.log.Info(name+" file is still being written; read again at the next check", attrs...)
	default:
		r.log.Error(name+" file refused: requests are still "+use+" the secret in force", append(attrs, "err", res.Err)...)
	}
	r.last[res.Source] = msg
}
