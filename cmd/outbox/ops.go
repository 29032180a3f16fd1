package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"strings"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/admin"
	"github.com/ledgerline/outbox/attempts"
	"github.com/ledgerline/outbox/poolconfig"
)

// runStats prints the queue's operational state as one JSON object.
func runStats(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet(env, "stats", "stats [flags]   (queue depth, due, oldest due age, in flight, stuck, DLQ depth, idle relayers, paused rails, the archive's upkeep, what holds back vacuum)")
	var db dbFlags
	db.register(fs, poolconfig.Operator("stats"))
	if _, err := parseFlags(fs, env, args); err != nil {
		return err
	}
	archive, pool, cleanup, err := openArchive(ctx, env, &db)
	if err != nil {
		return err
	}
	defer cleanup()
	snap, err := archive.Snapshot(ctx, pool)
	if err != nil {
		return err
	}
	return json.NewEncoder(env.stdout).Encode(snap)
}

// deadLetterChanged is a dlq replay or ack line's error when the dead
// letter changed between its read and the action (ErrDeadLetterChanged).
const deadLetterChanged = "DEAD_LETTER_CHANGED"

// Errors of a dlq replay or ack line, or a cancel line, whose connection
// broke during the action: it was not done, the database shows
// (actionNotDone), or it may have been (actionCommitUnknown: nobody could
// tell).
const (
	actionNotDone       = "NOT_DONE"
	actionCommitUnknown = "COMMIT_UNKNOWN"
)

// commitUnknownCode is the exit status of dlq, cancel, rails pause and
// resume, and archive detach when an action may have been done
// (COMMIT_UNKNOWN): unlike 1 (nothing done on those lines), the command
// must not simply be run again.
const commitUnknownCode = 4

// stopAfter is the error that stops a dlq or cancel run at a line it
// cannot carry out: err, unless an earlier line's action may have been
// done (unknown of them, COMMIT_UNKNOWN), whose exit status it keeps,
// err printed. As err's status 1 (lines not done) it read as safe to run
// again, and the database is likely out of reach on the next line
// exactly when a line could not be settled.
func stopAfter(env *environment, err error, unknown int) error {
	if unknown == 0 {
		return err
	}
	fmt.Fprintln(env.stderr, "outbox:", err)
	printServerAdvice(env.stderr, err)
	return exitError{code: commitUnknownCode}
}

// runDLQ lists, replays or acknowledges dead letters.
func runDLQ(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet(env, "dlq", "dlq [flags] list | replay OUTBOX_ID... | ack OUTBOX_ID...   (replay and ack need --reason; each acts only on the dead letter it read, exit 1 if one was not done; exit 4: one whose connection broke and whose outcome the database could not tell, COMMIT_UNKNOWN: read its trail before running it again)")
	var db dbFlags
	db.register(fs, poolconfig.Operator("dlq"))
	all := fs.Bool("all", false, "list: include acknowledged dead letters")
	limit := fs.Int("limit", 100, "list: at most this many (0: every one, read a page at a time)")
	operator := fs.String("operator", defaultOperator(), "replay/ack: who is acting (recorded in the archive)")
	reason := fs.String("reason", "", "replay/ack: why (required; recorded in the archive)")
	if _, err := parseFlags(fs, env, args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return fmt.Errorf("%w: dlq needs an action: list, replay or ack", errUsage)
	}
	action, rest := fs.Arg(0), fs.Args()[1:]
	ids := make([]uuid.UUID, 0, len(rest))
	for _, a := range rest {
		id, err := uuid.FromString(a)
		if err != nil {
			return fmt.Errorf("%w: %q is not an outbox id", errUsage, a)
		}
		ids = append(ids, id)
	}
	switch {
	case action == "list" && len(ids) == 0:
	case (action == "replay" || action == "ack") && len(ids) > 0:
	default:
		return fmt.Errorf("%w: usage: dlq list | replay OUTBOX_ID [OUTBOX_ID ...] | ack OUTBOX_ID [OUTBOX_ID ...]", errUsage)
	}
	if *limit < 0 {
		return fmt.Errorf("%w: dlq list --limit %d: want 0 (every one) or more", errUsage, *limit)
	}
	if action != "list" && strings.TrimSpace(*reason) == "" {
		return fmt.Errorf("%w: dlq %s needs --reason (it is archived with who acted)", errUsage, action)
	}
	// Before any id is looked up: an id that is no open dead letter was
	// reported "not an open dead letter" for input never acceptable.
	if err := admin.CheckOperatorAction(*operator, *reason); action != "list" && err != nil {
		return fmt.Errorf("%w: dlq %s: %w", errUsage, action, err)
	}
	archive, pool, cleanup, err := openArchive(ctx, env, &db)
	if err != nil {
		return err
	}
	defer cleanup()
	out := json.NewEncoder(env.stdout)
	if action == "list" {
		return listDeadLetters(ctx, archive, pool, *all, *limit, out)
	}
	missing, unknown := 0, 0
	for _, id := range ids {
		dl, inFlight, err := archive.DeadLetterOrInFlight(ctx, pool, id)
		if err != nil {
			return stopAfter(env, err, unknown)
		}
		// Act on the dead letter read, whose outcome_unknown the line
		// reports: not on a failure that came after another operator's
		// replay of it meanwhile.
		var ok bool
		switch {
		case dl == nil: // not a dead letter: nothing to act on
			// One in flight is said so, as `cancel` does: "done": false
			// alone reads as an id unknown.
			if inFlight {
				missing++
				_ = out.Encode(map[string]any{"outbox_id": id, "action": action, "done": false, "error": admin.InFlight,
					"note": "nothing done: not a dead letter but in flight (a relayer claimed it and its rail call may be under way); its outcome settles it, and a failure makes it a dead letter"})
				continue
			}
		case action == "replay":
			ok, err = archive.ReplayAsRead(ctx, pool, *dl, *operator, *reason)
		default:
			ok, err = archive.AcknowledgeAsRead(ctx, pool, *dl, *operator, *reason)
		}
		if errors.Is(err, attempts.ErrDeadLetterChanged) {
			missing++
			_ = out.Encode(map[string]any{"outbox_id": id, "action": action, "done": false, "error": deadLetterChanged,
				"note": "nothing done: someone replayed or acknowledged this dead letter since it was read (it may have failed again); read it again (dlq list, audit trail) before acting"})
			continue
		}
		if errors.Is(err, attempts.ErrActionNotDone) {
			missing++
			_ = out.Encode(map[string]any{"outbox_id": id, "action": action, "done": false, "error": actionNotDone,
				"note": "nothing done: the connection broke before the " + action + " committed, and the database shows it was not done; run it again"})
			continue
		}
		if errors.Is(err, attempts.ErrCommitUnknown) {
			unknown++
			fmt.Fprintln(env.stderr, "outbox:", err)
			_ = out.Encode(map[string]any{"outbox_id": id, "action": action, "done": false, "error": actionCommitUnknown,
				"note": "the " + action + " may have been done: the connection broke after it was sent and the database could not tell; read its trail (outbox audit trail " + id.String() + ") before acting on it again (listed again, it may be a new failure)"})
			continue
		}
		if err != nil {
			return stopAfter(env, err, unknown)
		}
		if !ok {
			missing++
		}
		line := map[string]any{"outbox_id": id, "action": action, "done": ok}
		if dl == nil {
			// "done": false alone reads the same for an id mistyped and
			// one another operator has dealt with: the trail tells which.
			line["note"] = "nothing done: not an open dead letter (an unknown id, or one replayed, acknowledged or settled since; outbox audit trail " + id.String() + " shows which)"
		}
		if dl != nil {
			line["outcome_unknown"] = dl.OutcomeUnknown
			if dl.OutcomeUnknown && action == "replay" {
				line["note"] = attempts.OutcomeUnknownReplay
			}
		}
		_ = out.Encode(line)
	}
	switch {
	case unknown > 0:
		return exitError{code: commitUnknownCode}
	case missing > 0:
		return exitError{code: 1}
	}
	return nil
}

// dlqPage is how many dead letters `dlq list` reads per query: a list of
// any length (an outage's worth) streams in pages instead of being held in
// memory.
const dlqPage = 1000

// listDeadLetters prints up to limit dead letters (0: every one), oldest
// failure first, a page at a time.
func listDeadLetters(ctx context.Context, archive *attempts.Archive, pool *pgxpool.Pool, all bool, limit int, out *json.Encoder) error {
	var last *attempts.DeadLetter
	for printed := 0; limit == 0 || printed < limit; {
		n := dlqPage
		if limit > 0 {
			n = min(n, limit-printed)
		}
		page, err := archive.DeadLettersAfter(ctx, pool, all, last, n)
		if err != nil {
			return err
		}
		for _, d := range page {
			if err := out.Encode(d); err != nil {
				return err
			}
		}
		printed += len(page)
		if len(page) < n {
			return nil
		}
		last = &page[len(page)-1]
	}
	return nil
}

// runAudit prints an instruction's attempt trail, or verifies the
// invariants over the whole database.
func runAudit(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet(env, "audit", "audit [flags] trail (OUTBOX_ID | --instruction-id ID) | verify | checkpoint | checkpoints")
	var db dbFlags
	db.register(fs, auditSettings())
	instructionID := fs.String("instruction-id", "", "trail: the producer's instruction id instead of an outbox id")
	unordered := fs.Bool("unordered", false, "verify: skip the ordering invariants (ordering was off at some time: outbox migrate ordering-off)")
	against := fs.String("checkpoints", "", "verify: also compare with this export of the checkpoints (outbox audit checkpoints), kept outside the database")
	settle := fs.Duration("settle", attempts.DefaultCheckpointSettle, "checkpoint: end the period this long before now")
	workers := fs.Int("workers", attempts.DefaultVerifyWorkers, "verify: connections reading at once, in one shared snapshot (1: one connection, the checks one after another)")
	if _, err := parseFlags(fs, env, args); err != nil {
		return err
	}
	switch {
	case fs.NArg() == 0:
		return fmt.Errorf("%w: audit needs trail, verify, checkpoint or checkpoints", errUsage)
	case fs.Arg(0) == "checkpoint" || fs.Arg(0) == "checkpoints":
		if fs.NArg() != 1 {
			return fmt.Errorf("%w: audit %s takes no arguments", errUsage, fs.Arg(0))
		}
		if *settle < 0 {
			// Not the default in its place: a flipped sign is a mistake.
			return fmt.Errorf("%w: --settle %v is negative", errUsage, *settle)
		}
		return runCheckpoints(ctx, env, &db, fs.Arg(0) == "checkpoint", *settle)
	case fs.Arg(0) != "trail" && fs.Arg(0) != "verify":
		return fmt.Errorf("%w: audit needs trail, verify, checkpoint or checkpoints", errUsage)
	}
	if *against != "" {
		// Checked whole before anything is read from the database, a
		// checkpoint at a time: an export of years is millions of them,
		// which verify reads again from the file as it compares them.
		f, err := os.Open(*against)
		if err != nil {
			return fmt.Errorf("%w: %v", errUsage, err)
		}
		n, err := countCheckpoints(f)
		f.Close()
		if err != nil {
			return fmt.Errorf("%w: %s: %v", errUsage, *against, err)
		}
		if n == 0 {
			return fmt.Errorf("%w: %s holds no checkpoints", errUsage, *against)
		}
	}
	var outboxID uuid.UUID
	if fs.Arg(0) == "trail" {
		switch {
		case fs.NArg() == 2 && *instructionID == "":
			id, err := uuid.FromString(fs.Arg(1))
			if err != nil {
				return fmt.Errorf("%w: %q is not an outbox id", errUsage, fs.Arg(1))
			}
			outboxID = id
		case fs.NArg() == 1 && *instructionID != "":
		default:
			return fmt.Errorf("%w: audit trail takes an outbox id or --instruction-id", errUsage)
		}
	}
	if *workers < 1 {
		return fmt.Errorf("%w: audit verify --workers %d: want 1 or more", errUsage, *workers)
	}
	archive, pool, cleanup, err := openArchiveConns(ctx, env, &db, max(2, *workers))
	if err != nil {
		return err
	}
	defer cleanup()
	out := json.NewEncoder(env.stdout)
	if fs.Arg(0) == "verify" {
		opts := attempts.VerifyOptions{Ordered: !*unordered, Workers: *workers}
		if *against != "" {
			f, err := os.Open(*against)
			if err != nil {
				return fmt.Errorf("%w: %v", errUsage, err)
			}
			defer f.Close()
			opts.CheckpointsFrom = attempts.NewCheckpointsReader(f)
		}
		rep, err := archive.Verify(ctx, pool, opts)
		if errors.Is(err, attempts.ErrCheckpointsExport) {
			// The file changed since it was checked.
			return fmt.Errorf("%w: %s: %v", errUsage, *against, err)
		}
		if err != nil {
			return err
		}
		violations := make([]string, len(rep.Violations))
		for i, v := range rep.Violations {
			violations[i] = v.String()
		}
		_ = out.Encode(map[string]any{
			"instructions": rep.Instructions, "pending": rep.Pending, "in_flight": rep.InFlight,
			"dispatched": rep.Dispatched, "cancelled": rep.Cancelled, "dead_letters": rep.DeadLetters, "dispatched_twice": rep.DispatchedTwice,
			"attempts": rep.Attempts, "chained_rows": rep.Chained, "checkpoints": rep.Checkpoints,
			"exported_checkpoints": rep.ExportedCheckpoints, "ok": rep.OK(), "violations": violations,
			"standby": rep.Standby, "seconds": rep.Duration.Seconds(),
		})
		if !rep.Standby {
			fmt.Fprintf(env.stderr, "outbox: audit verify ran on the primary for %.1f s: its snapshot held back vacuum meanwhile; run it on a hot standby (docs/operations.md, \"Auditors belong on a replica\")\n",
				rep.Duration.Seconds())
		}
		if !rep.OK() {
			return exitError{code: 1}
		}
		return nil
	}
	// A page at a time: a trail through a long outage is thousands of rows.
	var last *attempts.Attempt
	for printed := 0; ; {
		var page []attempts.Attempt
		if *instructionID != "" {
			page, err = archive.TrailByInstructionAfter(ctx, pool, *instructionID, last, trailPage)
		} else {
			page, err = archive.TrailAfter(ctx, pool, outboxID, last, trailPage)
		}
		if err != nil {
			return err
		}
		for _, a := range page {
			_ = out.Encode(a)
		}
		printed += len(page)
		if len(page) < trailPage {
			if printed == 0 {
				fmt.Fprintln(env.stderr, "no attempts (not claimed yet, or unknown)")
			}
			return nil
		}
		last = &page[len(page)-1]
	}
}

// trailPage is how many archive rows `audit trail` reads per query.
const trailPage = 1000

// countCheckpoints reads an export through, holding one checkpoint at a
// time, and returns how many it holds, or why it is not whole.
func countCheckpoints(r io.Reader) (int, error) {
	cr := attempts.NewCheckpointsReader(r)
	for n := 0; ; n++ {
		_, ok, err := cr.Next()
		if err != nil || !ok {
			return n, err
		}
	}
}

// runCheckpoints takes the archive's next checkpoints up to now (take) and
// prints them (a checkpoint digests a bounded number of rows, migration
// 043, so a backlog takes several), or prints every checkpoint as JSON
// lines: the export an auditor keeps outside the database and passes back
// to audit verify --checkpoints.
func runCheckpoints(ctx context.Context, env *environment, db *dbFlags, take bool, settle time.Duration) error {
	archive, pool, cleanup, err := openArchive(ctx, env, db)
	if err != nil {
		return err
	}
	defer cleanup()
	if take {
		cps, err := archive.TakeCheckpoints(ctx, pool, settle)
		if len(cps) == 0 && err == nil {
			fmt.Fprintln(env.stderr, "no period to checkpoint yet")
		}
		// The ones taken, a line each: not an export (no first and end
		// lines).
		enc := json.NewEncoder(env.stdout)
		for _, c := range cps {
			if werr := enc.Encode(c); werr != nil && err == nil {
				err = werr
			}
		}
		return err
	}
	// A batch at a time: after years, millions of checkpoints.
	return archive.ExportCheckpoints(ctx, pool, env.stdout)
}

func openArchive(ctx context.Context, env *environment, db *dbFlags) (*attempts.Archive, *pgxpool.Pool, func(), error) {
	return openArchiveConns(ctx, env, db, 2)
}

// openArchiveConns is openArchive with a pool of at most conns
// connections.
func openArchiveConns(ctx context.Context, env *environment, db *dbFlags, conns int) (*attempts.Archive, *pgxpool.Pool, func(), error) {
	log, _ := newLogger(env.stderr, "text", "warn")
	pool, cleanup, err := db.connect(ctx, log, int32(conns))
	if err != nil {
		return nil, nil, nil, err
	}
	archive, err := attempts.New(db.schema)
	if err != nil {
		cleanup()
		return nil, nil, nil, fmt.Errorf("%w: %v", errUsage, err)
	}
	return archive, pool, cleanup, nil
}

// auditSettings are the audit command's: an operator's, without a
// statement timeout (verify reads the whole archive; run it on a replica).
func auditSettings() poolconfig.Settings {
	s := poolconfig.Operator("audit")
	s.StatementTimeout = 0
	return s
}

func defaultOperator() string {
	if u, err := user.Current(); err == nil {
		return u.Username
	}
	return "operator"
}
