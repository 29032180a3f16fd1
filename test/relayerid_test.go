package test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ledgerline/outbox/internal/testdb"
)

// Log lines of a relayer about the other runs of its relayer id
// (engine/registration.go).
const (
	sharedIDError  = "another relayer is running under this relayer id"
	recentRunWarn  = "another run of this relayer id is registered and was seen recently"
	sharedIDPublic = "another relayer is running under this relayer's id"
)

// startFixed starts `outbox relay` under relayer id id (the fleet's
// generations each take a new one), with the fleet's flags, logging from
// WARN up.
func startFixed(t *testing.T, f *fleet, id string, extra ...string) *proc {
	t.Helper()
	args := append([]string{"relay",
		"--database-url", withAppName(t, f.dbURL(0), id),
		"--rails-config", f.railsConfig,
		"--relayer-id", id,
		"--lease-grace", leaseGrace.String(),
		"--reaper-interval", "1s",
		"--poll-interval", "200ms",
		"--stop-timeout", "3s",
		"--log-format", "json",
		"--log-level", "warn",
	}, extra...)
	p := startProc(t, fmt.Sprintf("%s-%d", id, len(f.all)), "", args...)
	f.all = append(f.all, p)
	return p
}

// TestRestartUnderAFixedIDAfterKill9: a relayer killed with SIGKILL under
// a fixed relayer id (a StatefulSet's pod) leaves its registration; one
// restarted at once under the same id starts, says so at WARN, drains
// the work, and is not misled into reporting the dead run as another live
// relayer after its refreshes (no ERROR). Its graceful stop removes its
// own registration; the dead run's stays for the reaper.
func TestRestartUnderAFixedIDAfterKill9(t *testing.T) {
	heavy(t)
	dbURL := testdb.URL(t)
	pool := openPool(t, dbURL)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb := startSandbox(t, sandboxFlags{seed: 1, latencyMin: time.Millisecond, latencyMax: 5 * time.Millisecond})
	f := newFleet(t, writeRailsConfig(t, sb.url), func(int) string { return dbURL })
	const id = "fixed-relayer"
	registered := func(n int64) func() (bool, string) {
		return func() (bool, string) {
			c := mustInts(t, pool, `SELECT count(*) FROM outbox.relayer_runs WHERE relayer_id = $1`, id)
			return c[0] == n, fmt.Sprintf("%d registrations, want %d", c[0], n)
		}
	}
	drained := func() (bool, string) {
		c := mustInts(t, pool, `SELECT (SELECT count(*) FROM outbox.pending) + (SELECT count(*) FROM outbox.inflight)`)
		return c[0] == 0, fmt.Sprintf("%d queued", c[0])
	}

	first := startFixed(t, f, id)
	poll(t, time.Minute, "the first run registered", registered(1))
	w := workload{prefix: "fixed-a", n: 200, seed: 1}
	if err := w.enqueue(ctx, pool, 0, w.n); err != nil {
		t.Fatal(err)
	}
	poll(t, time.Minute, "the first run's drain", drained)
	first.kill(t)

	second := startFixed(t, f, id)
	poll(t, time.Minute, "the restart registered beside the killed run's row", registered(2))
	w = workload{prefix: "fixed-b", n: 200, seed: 2}
	if err := w.enqueue(ctx, pool, 0, w.n); err != nil {
		t.Fatal(err)
	}
	poll(t, time.Minute, "the restart's drain", drained)
	// Two refreshes of the restart's registration: a live other run
	// would have been reported by now.
	poll(t, time.Minute, "the restart refreshed its registration twice", func() (bool, string) {
		c := mustInts(t, pool, `SELECT coalesce(max(extract(epoch FROM seen_at - started_at)), 0)::int8 FROM outbox.relayer_runs WHERE relayer_id = $1`, id)
		return c[0] >= 6, fmt.Sprintf("%d s between start and last refresh", c[0])
	})
	if err := second.crashed(); err != nil {
		t.Fatal(err)
	}
	log := second.log()
	if !strings.Contains(log, recentRunWarn) {
		t.Errorf("the restart did not say it found the killed run's registration; log tail:\n%s", second.tail(20))
	}
	if strings.Contains(log, sharedIDError) {
		t.Errorf("the restart reported the killed run as another live relayer; log tail:\n%s", second.tail(20))
	}
	if err := second.terminate(15 * time.Second); err != nil {
		t.Fatalf("graceful stop: %v; log tail:\n%s", err, second.tail(25))
	}
	poll(t, time.Minute, "the killed run's registration alone left", registered(1))
	verifyNow(t, pool, "after the restart under the same id")
	for _, p := range f.all {
		p.checkLogClean(t)
	}
}

// TestTwoProcessesUnderOneIDAreReported: two relayer processes started
// under one relayer id each log an ERROR line naming the other, and
// /readyz says degraded; once one stops gracefully, the other's /readyz
// is ready again.
func TestTwoProcessesUnderOneIDAreReported(t *testing.T) {
	heavy(t)
	dbURL := testdb.URL(t)
	sb := startSandbox(t, sandboxFlags{seed: 1, latencyMin: time.Millisecond, latencyMax: 5 * time.Millisecond})
	f := newFleet(t, writeRailsConfig(t, sb.url), func(int) string { return dbURL })
	const id = "shared-relayer"
	admin := freeAddrs(t, 1)
	one := startFixed(t, f, id, "--admin-addr", admin[0])
	two := startFixed(t, f, id)
	poll(t, time.Minute, "both report the other", func() (bool, string) {
		a, b := strings.Contains(one.log(), sharedIDError), strings.Contains(two.log(), sharedIDError)
		return a && b, fmt.Sprintf("first reported %v, second %v", a, b)
	})
	client := &http.Client{Timeout: 5 * time.Second}
	readyz := func() (status string, reasons []string, err error) {
		resp, err := client.Get("http://" + admin[0] + "/readyz")
		if err != nil {
			return "", nil, err
		}
		defer resp.Body.Close()
		var body struct {
			Status  string   `json:"status"`
			Reasons []string `json:"degraded_reasons"`
		}
		err = json.NewDecoder(resp.Body).Decode(&body)
		return body.Status, body.Reasons, err
	}
	poll(t, time.Minute, "/readyz degraded for the shared id", func() (bool, string) {
		status, reasons, err := readyz()
		return status == "degraded" && strings.Contains(strings.Join(reasons, "; "), sharedIDPublic),
			fmt.Sprintf("status %q, reasons %q, %v", status, reasons, err)
	})
	if err := two.terminate(15 * time.Second); err != nil {
		t.Fatalf("graceful stop: %v; log tail:\n%s", err, two.tail(25))
	}
	poll(t, time.Minute, "/readyz ready once the other stopped", func() (bool, string) {
		status, reasons, err := readyz()
		return status == "ready", fmt.Sprintf("status %q, reasons %q, %v", status, reasons, err)
	})
	if err := one.terminate(15 * time.Second); err != nil {
		t.Fatalf("graceful stop: %v; log tail:\n%s", err, one.tail(25))
	}
	for _, p := range f.all {
		p.checkLogClean(t)
	}
}
