package test

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"

	"github.com/ledgerline/outbox/rails"
)

// Relayer settings shared by every scenario. The lease is the rail timeout
// plus the lease grace.
const (
	railTimeout = 2 * time.Second
	leaseGrace  = time.Second
	lease       = railTimeout + leaseGrace
	// secretEnv names the variable that hands the webhook secret to the
	// sandbox server and the relayers.
	secretEnv = "OUTBOX_FAULT_SECRET"
)

// webhookSecret signs requests between relayers and the sandbox server.
var webhookSecret = func() string {
	b := make([]byte, 32)
	rand.Read(b)
	return hex.EncodeToString(b)
}()

// childEnv is the environment of every child process: ours without
// OUTBOX_* and PG* variables (they would silently override flags or
// connection settings), plus the webhook secret.
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "OUTBOX_") || strings.HasPrefix(kv, "PG") {
			continue
		}
		env = append(env, kv)
	}
	if raceBuild && os.Getenv("GORACE") == "" {
		// A race-enabled binary sleeps 1s at exit by default, which would
		// make every graceful stop look slow.
		env = append(env, "GORACE=atexit_sleep_ms=0")
	}
	return append(env, secretEnv+"="+webhookSecret)
}

// debugLogs (OUTBOX_FAULT_LOGS=1) prints every child's log tail, not only
// when a test fails.
var debugLogs = os.Getenv("OUTBOX_FAULT_LOGS") != ""

// proc is one child process of the outbox binary. Its stdout and stderr go
// to a log file that is printed (tail) when the test fails.
type proc struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{} // closed once the process was waited for
	waitErr error         // valid after done
	// intended is set before we signal the process, so its exit is not
	// reported as a crash.
	intended atomic.Bool
}

// startProc starts the outbox binary with args. Stdout goes to stdoutPath
// if given, else to the log file with stderr. The process is stopped
// (SIGTERM, then SIGKILL) when the test ends, and dies with the test binary
// (Pdeathsig) if that is killed.
func startProc(t *testing.T, name, stdoutPath string, args ...string) *proc {
	t.Helper()
	return startProcIn(t, name, stdoutPath, nil, args...)
}

// startProcIn is startProc with stdin (nil: none).
func startProcIn(t *testing.T, name, stdoutPath string, stdin io.Reader, args ...string) *proc {
	t.Helper()
	if outboxBin == "" {
		t.Fatal("the outbox binary was not built (TestMain)")
	}
	dir := t.TempDir()
	p := &proc{name: name, logPath: filepath.Join(dir, name+".log"), done: make(chan struct{})}
	logFile, err := os.Create(p.logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close() // the child has its own descriptor
	stdout := logFile
	if stdoutPath != "" {
		if stdout, err = os.Create(stdoutPath); err != nil {
			t.Fatal(err)
		}
		defer stdout.Close()
	}
	p.cmd = exec.Command(outboxBin, args...)
	p.cmd.Env = childEnv()
	p.cmd.Stdin, p.cmd.Stdout, p.cmd.Stderr = stdin, stdout, logFile
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		p.waitErr = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.stop(5 * time.Second)
		if t.Failed() || debugLogs {
			t.Logf("--- %s (%s) log tail:\n%s", p.name, p.exitState(), p.tail(25))
		}
	})
	return p
}

// exited reports whether the process has ended.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// crashed returns an error if the process ended without being told to.
func (p *proc) crashed() error {
	if p.exited() && !p.intended.Load() {
		return fmt.Errorf("%s exited on its own (%v); log tail:\n%s", p.name, p.waitErr, p.tail(25))
	}
	return nil
}

// kill sends SIGKILL and waits for the process to be gone.
func (p *proc) kill(t *testing.T) {
	t.Helper()
	p.intended.Store(true)
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	if !p.waitExit(10 * time.Second) {
		t.Fatalf("%s did not die within 10s of SIGKILL", p.name)
	}
}

// sigterm asks the process to stop gracefully.
func (p *proc) sigterm() {
	p.intended.Store(true)
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
}

// waitExit waits up to d for the process to end and reports whether it did.
func (p *proc) waitExit(d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-p.done:
		return true
	case <-timer.C:
		return false
	}
}

// terminate sends SIGTERM and waits up to grace for the process to end. It
// returns the exit error (nil for status 0).
func (p *proc) terminate(grace time.Duration) error {
	p.sigterm()
	if !p.waitExit(grace) {
		return fmt.Errorf("%s did not exit within %s of SIGTERM", p.name, grace)
	}
	return p.waitErr
}

// stop ends the process whatever it is doing: SIGTERM, then SIGKILL.
func (p *proc) stop(grace time.Duration) {
	if p.exited() {
		return
	}
	if p.terminate(grace) != nil && !p.exited() {
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		<-p.done
	}
}

func (p *proc) exitState() string {
	if !p.exited() {
		return "running"
	}
	if p.waitErr == nil {
		return "exit status 0"
	}
	return p.waitErr.Error()
}

// log returns the whole log file.
func (p *proc) log() string {
	b, _ := os.ReadFile(p.logPath)
	return string(b)
}

// tail returns the last n lines of the log, leaving out the warnings every
// failed attempt logs (the injected rail failures would drown the rest);
// it says how many it left out.
func (p *proc) tail(n int) string {
	var lines []string
	skipped := 0
	for _, line := range strings.Split(strings.TrimRight(p.log(), "\n"), "\n") {
		if strings.Contains(line, `"msg":"attempt failed: `) {
			skipped++
			continue
		}
		lines = append(lines, line)
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	if skipped > 0 {
		lines = append(lines, fmt.Sprintf("(%d \"attempt failed\" lines not shown)", skipped))
	}
	return strings.Join(lines, "\n")
}

// checkLogClean fails the test if the process logged a panic, a fatal
// runtime error or a data race.
func (p *proc) checkLogClean(t *testing.T) {
	t.Helper()
	for _, bad := range []string{"panic:", "fatal error:", "DATA RACE"} {
		if strings.Contains(p.log(), bad) {
			t.Errorf("%s logged %q; log tail:\n%s", p.name, bad, p.tail(40))
		}
	}
}

// sandboxServer is `outbox sandbox serve`: the rail, in its own process, so
// its memory of idempotency keys outlives the relayers.
type sandboxServer struct {
	*proc
	url string // http://127.0.0.1:port
}

// sandboxFlags are the injected behaviours of a sandbox server.
type sandboxFlags struct {
	seed                   int64
	latencyMin, latencyMax time.Duration
	hangRate, timeoutRate  float64
	retryableRate          float64
	terminalRate           float64
	slowRate               float64
	slowLatency            time.Duration
}

// args are the server's flags. It always records attempts: checkEnd
// compares them with the archive.
func (f sandboxFlags) args() []string {
	args := []string{"--seed", fmt.Sprint(f.seed), "--record-attempts"}
	add := func(name string, v any, set bool) {
		if set {
			args = append(args, "--"+name, fmt.Sprint(v))
		}
	}
	add("latency-min", f.latencyMin, f.latencyMin > 0)
	add("latency-max", f.latencyMax, f.latencyMax > 0)
	add("hang-rate", f.hangRate, f.hangRate > 0)
	add("timeout-rate", f.timeoutRate, f.timeoutRate > 0)
	add("retryable-rate", f.retryableRate, f.retryableRate > 0)
	add("terminal-rate", f.terminalRate, f.terminalRate > 0)
	add("slow-rate", f.slowRate, f.slowRate > 0)
	add("slow-latency", f.slowLatency, f.slowRate > 0)
	return args
}

// startSandbox starts the sandbox server and waits for its address.
func startSandbox(t *testing.T, f sandboxFlags) *sandboxServer {
	t.Helper()
	stdout := filepath.Join(t.TempDir(), "sandbox.stdout")
	args := append([]string{"sandbox", "serve", "--addr", "127.0.0.1:0", "--secret-env", secretEnv}, f.args()...)
	p := startProc(t, "sandbox", stdout, args...)
	const prefix = "sandbox rail listening on "
	var addr string
	poll(t, 15*time.Second, "the sandbox server to print its address", func() (bool, string) {
		if err := p.crashed(); err != nil {
			t.Fatal(err)
		}
		out, _ := os.ReadFile(stdout)
		for _, line := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(line, prefix) {
				addr = strings.TrimSpace(strings.TrimPrefix(line, prefix))
				return true, ""
			}
		}
		return false, fmt.Sprintf("stdout so far: %q", out)
	})
	if _, err := url.Parse(addr); err != nil || !strings.HasPrefix(addr, "http://127.0.0.1:") {
		t.Fatalf("sandbox printed an unexpected address %q", addr)
	}
	return &sandboxServer{proc: p, url: addr}
}

// stats reads GET /stats.
func (s *sandboxServer) stats(t *testing.T) rails.SandboxStatsResponse {
	t.Helper()
	var st rails.SandboxStatsResponse
	s.get(t, "/stats", &st)
	return st
}

// attemptIDs reads GET /attempts: every attempt the rail was called for.
func (s *sandboxServer) attemptIDs(t *testing.T) []uuid.UUID {
	t.Helper()
	var a rails.SandboxAttemptsResponse
	s.get(t, "/attempts", &a)
	return a.AttemptIDs
}

// get decodes the JSON answer of GET path, which must be 200.
func (s *sandboxServer) get(t *testing.T, path string, v any) {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get(s.url + path)
	if err != nil {
		t.Fatalf("sandbox %s: %v", path, err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("sandbox %s: status %d, decode error %v", path, resp.StatusCode, err)
	}
}

// writeRailsConfig writes the relayers' rail configuration: the "sandbox"
// rail type (generic profile, USD) on a webhook transport to the sandbox
// server, with the short rail timeout the lease is built from.
func writeRailsConfig(t *testing.T, sandboxURL string) string {
	t.Helper()
	return writeRailsConfigTimeout(t, sandboxURL, railTimeout)
}

// writeRailsConfigTimeout is writeRailsConfig with another rail timeout.
func writeRailsConfigTimeout(t *testing.T, sandboxURL string, timeout time.Duration) string {
	t.Helper()
	cfg := rails.Config{
		Transports: map[string]rails.TransportConfig{
			"sandbox-server": {Kind: "webhook", Webhook: &rails.WebhookConfig{URL: sandboxURL + "/pay", SecretEnv: secretEnv}},
		},
		Rails: []rails.RailConfig{{
			Type: "sandbox", Profile: "generic", Transport: "sandbox-server",
			Currencies: []string{"USD"}, Timeout: timeout.String(),
		}},
	}
	b, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "rails.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// fleet is a set of relayer processes, one per slot. A slot's process can
// be killed and replaced by a new generation with a new relayer id.
type fleet struct {
	t           *testing.T
	railsConfig string
	// dbURL returns the database URL for a slot (a proxy for some).
	dbURL func(slot int) string
	// extraArgs are added to every relayer's command line.
	extraArgs []string
	// adminAddr, if set, gives a slot's --admin-addr (its /readyz).
	adminAddr func(slot int) string
	current   map[int]*proc
	gen       map[int]int
	all       []*proc // every process ever started, for the log checks
}

func newFleet(t *testing.T, railsConfig string, dbURL func(slot int) string) *fleet {
	return &fleet{t: t, railsConfig: railsConfig, dbURL: dbURL, current: map[int]*proc{}, gen: map[int]int{}}
}

// relayerID names a slot's generation; it is also the application_name of
// its database connections, so the test can find them in pg_stat_activity.
func relayerID(slot, gen int) string { return fmt.Sprintf("relayer-%d-gen%d", slot, gen) }

// withAppName adds application_name to a database URL.
func withAppName(t *testing.T, dbURL, name string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatalf("database URL: %v", err)
	}
	q := u.Query()
	q.Set("application_name", name)
	u.RawQuery = q.Encode()
	return u.String()
}

// start starts the next generation of a slot and returns its relayer id.
func (f *fleet) start(slot int) string {
	f.t.Helper()
	id := relayerID(slot, f.gen[slot])
	f.gen[slot]++
	args := append([]string{"relay",
		"--database-url", withAppName(f.t, f.dbURL(slot), id),
		"--rails-config", f.railsConfig,
		"--relayer-id", id,
		"--lease-grace", leaseGrace.String(),
		"--reaper-interval", "1s",
		"--poll-interval", "200ms",
		"--stop-timeout", "3s",
		"--log-format", "json",
		"--log-level", "warn",
	}, f.extraArgs...)
	if f.adminAddr != nil {
		args = append(args, "--admin-addr", f.adminAddr(slot))
	}
	p := startProc(f.t, id, "", args...)
	f.current[slot] = p
	f.all = append(f.all, p)
	return id
}

// kill kill -9s a slot's process and waits until it is gone.
func (f *fleet) kill(slot int) string {
	f.t.Helper()
	p := f.current[slot]
	p.kill(f.t)
	return p.name
}

// healthy returns an error if a current relayer exited on its own.
func (f *fleet) healthy() error {
	for _, p := range f.current {
		if err := p.crashed(); err != nil {
			return err
		}
	}
	return nil
}

// stopAll stops every current relayer with SIGTERM and requires a clean
// exit (status 0), then checks every log of the fleet for panics and races.
func (f *fleet) stopAll() {
	f.t.Helper()
	for slot, p := range f.current {
		if err := p.crashed(); err != nil {
			f.t.Error(err)
			continue
		}
		if err := p.terminate(15 * time.Second); err != nil {
			f.t.Errorf("relayer slot %d: graceful stop: %v; log tail:\n%s", slot, err, p.tail(25))
		}
	}
	for _, p := range f.all {
		p.checkLogClean(f.t)
	}
}

// poll calls cond every 100ms until it reports true, failing the test with
// what and cond's last detail after timeout.
func poll(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, detail := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s: %s", timeout, what, detail)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
