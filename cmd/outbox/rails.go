package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ledgerline/outbox/admin"
	"github.com/ledgerline/outbox/attempts"
	"github.com/ledgerline/outbox/poolconfig"
)

// runRails lists, pauses and resumes rails for the whole relayer fleet.
func runRails(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet(env, "rails", "rails [flags] list | pause RAIL_TYPE | resume RAIL_TYPE   (RAIL_TYPE * is every rail; pause and resume need --reason; exit 4: the connection broke and whether it was done could not be told, COMMIT_UNKNOWN)")
	var db dbFlags
	db.register(fs, poolconfig.Operator("rails"))
	operator := fs.String("operator", defaultOperator(), "pause/resume: who is acting (recorded)")
	reason := fs.String("reason", "", "pause/resume: why (required; recorded)")
	wait := fs.Duration("wait", time.Minute, "pause: wait up to this long for the rail to go quiet (no claim that began before the pause still open, nothing in flight); 0: do not wait")
	history := fs.Int("history", 20, "list: also print this many of the newest pauses and resumes")
	if _, err := parseFlags(fs, env, args); err != nil {
		return err
	}
	action := fs.Arg(0)
	switch {
	case action == "list" && fs.NArg() == 1:
	case (action == "pause" || action == "resume") && fs.NArg() == 2:
		if strings.TrimSpace(fs.Arg(1)) == "" {
			return fmt.Errorf("%w: rails %s needs a rail type (or * for every rail)", errUsage, action)
		}
		if strings.TrimSpace(*reason) == "" {
			return fmt.Errorf("%w: rails %s needs --reason (it is recorded with who acted)", errUsage, action)
		}
		if err := admin.CheckOperatorAction(*operator, *reason); err != nil {
			return fmt.Errorf("%w: rails %s: %w", errUsage, action, err)
		}
	default:
		return fmt.Errorf("%w: usage: rails list | pause RAIL_TYPE | resume RAIL_TYPE", errUsage)
	}
	if *wait < 0 || *history < 0 {
		return fmt.Errorf("%w: rails: --wait and --history cannot be negative", errUsage)
	}
	archive, pool, cleanup, err := openArchive(ctx, env, &db)
	if err != nil {
		return err
	}
	defer cleanup()
	out := json.NewEncoder(env.stdout)
	railType := fs.Arg(1)
	switch action {
	case "list":
		pauses, err := archive.RailPauses(ctx, pool)
		if err != nil {
			return err
		}
		events, err := archive.RailPauseEvents(ctx, pool, *history)
		if err != nil {
			return err
		}
		return out.Encode(map[string]any{"paused": pauses, "history": events})
	case "resume":
		ok, err := archive.ResumeRail(ctx, pool, railType, *operator, *reason)
		if lost := lostAction(env, out, "resume", railType, err); lost != nil {
			return lost
		}
		if err != nil {
			return err
		}
		_ = out.Encode(map[string]any{"rail_type": railType, "action": "resume", "done": ok})
		if !ok {
			fmt.Fprintf(env.stderr, "outbox: rail %q was not paused (rails list shows the pauses in force)\n", railType)
			return exitError{code: 1}
		}
		return nil
	}
	ok, err := archive.PauseRail(ctx, pool, railType, *operator, *reason)
	if lost := lostAction(env, out, "pause", railType, err); lost != nil {
		return lost
	}
	if err != nil {
		return err
	}
	line := map[string]any{"rail_type": railType, "action": "pause", "done": ok}
	if !ok {
		line["note"] = "already paused: the first pause and its reason stay"
	}
	if *wait == 0 {
		if err := out.Encode(line); err != nil {
			return err
		}
		// Not waiting does not make a misspelt rail type any less
		// likely (the restore runbook pauses with --wait 0): look for
		// what the pause holds, as RailQuiet counts it when waiting.
		has, err := archive.RailHasPending(ctx, pool, railType)
		if err != nil {
			return err
		}
		warnNothingHeld(env, railType, has)
		return nil
	}
	start := time.Now()
	wctx, cancel := context.WithTimeout(ctx, *wait)
	defer cancel()
	q, err := archive.RailQuiet(wctx, pool, railType)
	line["quiet"], line["open_transactions"], line["in_flight"], line["held"] = err == nil, q.Transactions, q.InFlight, q.Held
	line["waited_seconds"] = time.Since(start).Round(time.Millisecond).Seconds()
	_ = out.Encode(line)
	switch {
	case errors.Is(err, attempts.ErrNotQuiet):
		fmt.Fprintf(env.stderr, "outbox: rail %q is paused, but after %s %d transactions that began before the pause are open and %d of its instructions are in flight (a dead relayer's come back after its lease): run the pause again to wait more\n",
			railType, *wait, q.Transactions, q.InFlight)
		return exitError{code: 1}
	case err != nil:
		return err
	}
	warnNothingHeld(env, railType, q.Held > 0)
	return nil
}

// warnNothingHeld warns of a pause that holds nothing back: most often a
// misspelt rail type, which pauses nothing any relayer serves.
func warnNothingHeld(env *environment, railType string, held bool) {
	if !held && railType != attempts.AllRails {
		fmt.Fprintf(env.stderr, "outbox: warning: no instruction of rail type %q is pending: is the name right? (rail types are case-sensitive)\n", railType)
	}
}

// lostAction reports a pause or resume whose connection broke (err
// attempts.ErrActionNotDone or attempts.ErrCommitUnknown) with its line,
// and returns the command's exit status for it; nil for any other err.
func lostAction(env *environment, out *json.Encoder, action, railType string, err error) error {
	switch {
	case errors.Is(err, attempts.ErrActionNotDone):
		_ = out.Encode(map[string]any{"rail_type": railType, "action": action, "done": false, "error": actionNotDone,
			"note": "nothing done: the connection broke before the " + action + " committed, and the database shows it was not done; run it again"})
		return exitError{code: 1}
	case errors.Is(err, attempts.ErrCommitUnknown):
		fmt.Fprintln(env.stderr, "outbox:", err)
		_ = out.Encode(map[string]any{"rail_type": railType, "action": action, "done": false, "error": actionCommitUnknown,
			"note": "the " + action + " may have been done: the connection broke after it was sent and the database could not tell; rails list shows the pauses in force and their history: read it before running it again (someone may have paused or resumed the rail since)"})
		return exitError{code: commitUnknownCode}
	}
	return nil
}
