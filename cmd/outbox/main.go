// Command outbox is the one binary of the outbox engine: schema migrations,
// the relayer daemon, the zombie reaper, enqueueing from the shell, the demo,
// benchmarks and operator tools.
//
// Every flag can also be set through an environment variable: the flag name
// upper-cased with dashes as underscores and an OUTBOX_ prefix
// (--database-url is OUTBOX_DATABASE_URL). Flags win over the environment.
// The exceptions are marked "command line only" in --help: enqueue's
// instruction flags.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
)

// command is one subcommand.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, env *environment, args []string) error
}

var commands = []command{
	{"migrate", "apply schema migrations (up; --create-roles sets up least-privilege roles), show status, or switch the NOTIFY trigger or per-participant ordering [role: outbox_owner; a superuser for --create-roles]", runMigrate},
	{"enqueue", "enqueue one instruction from flags, or JSON lines from stdin [role: outbox_producer]", runEnqueue},
	{"demo", "run the whole system locally: Postgres, relayer, sandbox rail, a producer stream, a live summary", runDemo},
	{"relay", "run a relayer (and the zombie reaper): claim, dispatch to rails, record outcomes [role: outbox_relayer]", runRelay},
	{"bench", "benchmarks: drain (ordering on/off), steady-rate latency, enqueue, the pgbench ceiling of the same statements, NOTIFY on/off, soak", runBench},
	{"sandbox", "sandbox serve: the sandbox rail as an HTTP server (webhook protocol), for crash tests and demos", runSandbox},
	{"stats", "queue state: pending, due, oldest due age, in flight, stuck, DLQ depth, idle relayers, paused rails, the archive's upkeep, what holds back vacuum (JSON) [role: outbox_auditor or outbox_operator]", runStats},
	{"dlq", "dead letters: list, replay, ack [role: outbox_operator]", runDLQ},
	{"cancel", "cancel pending instructions: never sent, a CANCELLED row archives who and why [role: outbox_operator]", runCancel},
	{"rails", "pause and resume dispatch to a rail (or every rail) across the relayer fleet; list the pauses and their history [role: outbox_operator; outbox_auditor for list]", runRails},
	{"audit", "an instruction's attempt trail, verify the invariants and the archive's tamper evidence, export checkpoints [role: outbox_auditor; outbox_relayer for checkpoint]", runAudit},
	{"archive", "the archive's months: list them, detach old ones (and retire their keys), export one to CSV with its checksum, give months written into the default partition their own [role: outbox_auditor; outbox_owner for detach and move-default]", runArchive},
	{"reap", "one zombie-reaper pass: requeue in-flight instructions whose lease expired [role: outbox_relayer]", runReap},
}

// environment is what every subcommand gets besides its flags.
type environment struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string
}

// errUsage marks errors caused by bad command-line usage (exit status 2).
var errUsage = errors.New("usage error")

// exitError carries a specific exit status without printing anything more.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	env := &environment{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv}
	err := run(ctx, env, os.Args[1:])
	stop()
	os.Exit(exitCode(env, err))
}

func exitCode(env *environment, err error) int {
	var ee exitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.code
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		fmt.Fprintln(env.stderr, "outbox:", err)
		return 2
	default:
		fmt.Fprintln(env.stderr, "outbox:", err)
		printServerAdvice(env.stderr, err)
		return 1
	}
}

// printServerAdvice prints the detail and hint PostgreSQL gave with an
// error, which its message leaves out: a migration that stops on data it
// cannot change (028, keys shared by two instruction ids) says there what
// happened and how to find the rows.
func printServerAdvice(w io.Writer, err error) {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return
	}
	if pgErr.Detail != "" {
		fmt.Fprintln(w, "outbox: detail:", pgErr.Detail)
	}
	if pgErr.Hint != "" {
		fmt.Fprintln(w, "outbox: hint:", pgErr.Hint)
	}
}

func run(ctx context.Context, env *environment, args []string) error {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		usage(env.stdout)
		if len(args) == 0 {
			return fmt.Errorf("%w: no command given", errUsage)
		}
		return nil
	}
	for _, c := range commands {
		if c.name == args[0] {
			return c.run(ctx, env, args[1:])
		}
	}
	usage(env.stderr)
	return fmt.Errorf("%w: unknown command %q", errUsage, args[0])
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: outbox <command> [flags]   (outbox <command> --help for its flags)")
	fmt.Fprintln(w, "\ncommands:")
	cs := append([]command(nil), commands...)
	sort.Slice(cs, func(i, j int) bool { return cs[i].name < cs[j].name })
	for _, c := range cs {
		fmt.Fprintf(w, "  %-9s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nEvery flag is also read from OUTBOX_<FLAG_NAME> (e.g. OUTBOX_DATABASE_URL), unless its --help says command line only.")
}

// newFlagSet returns a FlagSet for a subcommand whose --help lists every
// flag with its environment variable.
func newFlagSet(env *environment, name, synopsis string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(env.stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: outbox %s\n\nflags (each also settable as the environment variable shown, unless command line only):\n", synopsis)
		fs.VisitAll(func(f *flag.Flag) {
			def := ""
			if f.DefValue != "" {
				def = fmt.Sprintf(" (default %s)", f.DefValue)
			}
			source, usage := envName(f.Name), f.Usage
			if isCommandLineOnly(f) {
				source, usage = "command line only", strings.TrimSuffix(usage, commandLineOnlyNote)
			}
			fmt.Fprintf(fs.Output(), "  --%s  [%s]\n      %s%s\n", f.Name, source, usage, def)
		})
	}
	return fs
}

func envName(flagName string) string {
	return "OUTBOX_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// commandLineOnlyNote ends the usage of the flags [commandLineOnly] marked.
const commandLineOnlyNote = " (command line only)"

// commandLineOnly marks flags that are never read from OUTBOX_* variables.
func commandLineOnly(fs *flag.FlagSet, names ...string) {
	for _, n := range names {
		fs.Lookup(n).Usage += commandLineOnlyNote
	}
}

func isCommandLineOnly(f *flag.Flag) bool { return strings.HasSuffix(f.Usage, commandLineOnlyNote) }

// formerNameValue is the value of a flag registered by [formerName]: the
// current flag's value, and the current flag's name.
type formerNameValue struct {
	flag.Value
	of string
}

// IsBoolFlag forwards to the current flag, so `--former` alone works for
// a boolean one as it does for the current name.
func (v formerNameValue) IsBoolFlag() bool {
	b, ok := v.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// formerName registers old as a former name of the already registered
// flag current: both set one value, and [parseFlags] treats them as one
// setting, so the environment variable of either never overrides the other
// given on the command line.
func formerName(fs *flag.FlagSet, old, current string) {
	fs.Var(formerNameValue{Value: fs.Lookup(current).Value, of: current}, old, "the former name of --"+current)
}

// parseFlags parses the command line, then applies OUTBOX_* environment
// variables to the flags the command line did not set (flags win), except
// to the flags marked [commandLineOnly]. A flag and its [formerName] are
// one setting: either on the command line counts as both, and otherwise
// the current name's variable wins over the former name's. It returns the
// names of the flags set on the command line.
func parseFlags(fs *flag.FlagSet, env *environment, args []string) (map[string]bool, error) {
	if err := fs.Parse(flagsFirst(fs, args)); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %v", errUsage, err)
	}
	onCommandLine := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { onCommandLine[f.Name] = true })
	fs.VisitAll(func(f *flag.Flag) {
		if v, ok := f.Value.(formerNameValue); ok && (onCommandLine[f.Name] || onCommandLine[v.of]) {
			onCommandLine[f.Name], onCommandLine[v.of] = true, true
		}
	})
	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		if onCommandLine[f.Name] || envErr != nil || isCommandLineOnly(f) {
			return
		}
		if v, ok := f.Value.(formerNameValue); ok && env.getenv(envName(v.of)) != "" {
			return
		}
		if v := env.getenv(envName(f.Name)); v != "" {
			if err := fs.Set(f.Name, v); err != nil {
				envErr = fmt.Errorf("%w: %s=%q: %v", errUsage, envName(f.Name), v, err)
			}
		}
	})
	return onCommandLine, envErr
}

// flagsFirst moves flags before positional arguments (the flag package
// stops at the first positional one), so `outbox dlq list --limit 5` works.
func flagsFirst(fs *flag.FlagSet, args []string) []string {
	var flags, positional []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			positional = append(positional, args[i+1:]...)
			break
		}
		if len(a) < 2 || a[0] != '-' {
			positional = append(positional, a)
			continue
		}
		flags = append(flags, a)
		name := strings.TrimLeft(a, "-")
		if strings.Contains(name, "=") {
			continue
		}
		f := fs.Lookup(name)
		if f == nil {
			continue // let Parse report it
		}
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
			continue
		}
		if i+1 < len(args) {
			i++
			flags = append(flags, args[i])
		}
	}
	if len(positional) == 0 {
		return flags
	}
	return append(append(flags, "--"), positional...)
}

// newLogger builds the slog logger selected by --log-format/--log-level.
func newLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("%w: --log-level %q", errUsage, level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	default:
		return nil, fmt.Errorf("%w: --log-format %q (want json or text)", errUsage, format)
	}
}
