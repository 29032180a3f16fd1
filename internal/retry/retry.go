// Package retry is how the long-running loops (claim, outcome recording,
// listener, reaper) live with a database that fails: capped exponential
// backoff with jitter (a fleet's loops do not retry in lockstep), and a
// log line per change of state (first failure, a different
// kind of failure, recovery) instead of one per attempt, so an outage of an
// hour is a handful of lines, not thousands.
//
// It also says which errors no retry can fix (Permanent): a process should
// refuse to start on those instead of logging "started" and retrying
// forever.
package retry

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Loop tracks the failures of one loop. The zero value is not usable; set
// Log, What, Min and Max. Not safe for concurrent use: one per loop.
type Loop struct {
	// Log receives the state changes.
	Log *slog.Logger
	// What names the loop in log lines ("claim", "record outcomes").
	What string
	// Min is the first delay, Max the cap.
	Min, Max time.Duration

	failures int
	since    time.Time
	kind     string
	delay    time.Duration
}

// Failed records a failed attempt and returns how long to wait before the
// next one: between half the backoff and the backoff (Min, doubling with
// each repeat, up to Max), drawn at random, so that the loops of a fleet
// that lost the database in the same instant do not retry in lockstep
// while it is away, nor all arrive together when it is back. It logs (at
// Warn) only when the loop starts failing or the kind of failure changes;
// repeats are logged at Debug.
func (l *Loop) Failed(err error) time.Duration {
	kind := Kind(err)
	switch {
	case l.failures == 0:
		l.since, l.delay = time.Now(), l.Min
		l.Log.Warn(l.What+" failing; retrying with backoff, logged again when this changes",
			"err", err, "kind", kind, "backoff_cap", l.Max)
	case kind != l.kind:
		l.Log.Warn(l.What+" still failing, differently now", "err", err, "kind", kind, "was", l.kind,
			"failures", l.failures, "failing_for", time.Since(l.since).Round(time.Millisecond))
	default:
		l.Log.Debug(l.What+" failed again", "err", err, "failures", l.failures+1)
		// Saturating: past half of Duration's range 2*delay wraps to a
		// negative wait, which retried at once.
		if l.delay > l.Max/2 {
			l.delay = l.Max
		} else {
			l.delay = min(2*l.delay, l.Max)
		}
	}
	l.failures++
	l.kind = kind
	return jitter(l.delay)
}

// jitter draws a wait in [d/2, d].
func jitter(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	return d - rand.N(d/2+1)
}

// Succeeded records a successful attempt, logging the recovery if the loop
// was failing.
func (l *Loop) Succeeded() {
	if l.failures == 0 {
		return
	}
	l.Log.Info(l.What+" recovered", "failures", l.failures, "failing_for", time.Since(l.since).Round(time.Millisecond))
	l.failures, l.kind = 0, ""
}

// Failing reports whether the last attempt failed.
func (l *Loop) Failing() bool { return l.failures > 0 }

// Kind names the class of a database error for "did the failure change":
// the SQLSTATE when the server answered, "connection" when it could not be
// reached or the connection broke, "timeout", or "other".
func Kind(err error) string {
	var pgErr *pgconn.PgError
	var connErr *pgconn.ConnectError
	switch {
	case errors.As(err, &pgErr):
		return "sqlstate " + pgErr.Code
	case errors.As(err, &connErr), pgconn.SafeToRetry(err):
		return "connection"
	case pgconn.Timeout(err):
		return "timeout"
	}
	return "other"
}

// permanent is implemented by errors that say themselves whether a retry
// could help (e.g. a schema at the wrong migration version).
type permanent interface{ Permanent() bool }

// Permanent reports whether err is one that waiting and retrying cannot
// fix: the server refused our credentials (SQLSTATE class 28), the
// database does not exist (3D000), we lack a privilege (42501), or the
// error says so itself (a schema that is missing or at the wrong
// migration version).
func Permanent(err error) bool {
	var p permanent
	if errors.As(err, &p) {
		return p.Permanent()
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	return strings.HasPrefix(pgErr.Code, "28") || pgErr.Code == "3D000" || pgErr.Code == "42501"
}

// Explain prefixes a permanent error with what to do about it.
func Explain(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case strings.HasPrefix(pgErr.Code, "28"):
			return fmt.Errorf("the database refused our credentials (check the user and password in the URL): %w", err)
		case pgErr.Code == "3D000":
			return fmt.Errorf("the database does not exist (check the URL): %w", err)
		case pgErr.Code == "42501":
			return fmt.Errorf("the database role lacks a privilege the outbox needs: %w", err)
		}
	}
	return err
}
