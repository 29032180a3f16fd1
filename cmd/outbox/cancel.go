package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/gofrs/uuid/v5"

	"github.com/ledgerline/outbox/admin"
	"github.com/ledgerline/outbox/attempts"
	"github.com/ledgerline/outbox/poolconfig"
)

// cancelRefusedCode is the exit status of a cancel of which some
// instruction was refused because the rail may still be acting on its
// cut-off call (attempts.ErrRailMayStillAct): unlike "not pending" (1), the
// same cancel succeeds once the time on its line has passed.
const cancelRefusedCode = 3

// runCancel cancels pending instructions: they are never sent. Each id
// gets a line; one in flight is refused (error IN_FLIGHT, exit status 1,
// as for one not pending); an instruction whose rail call a relayer's stop cut off is
// refused until its claim's lease ends (its line says until when, and the
// exit status is 3) without stopping the others.
func runCancel(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet(env, "cancel", "cancel [flags] OUTBOX_ID...   (needs --reason; only pending instructions: one in flight is refused, IN_FLIGHT; exit 3: one whose rail call a relayer's stop cut off, refused until the retry_after on its line; exit 4: one whose connection broke and whose outcome the database could not tell, COMMIT_UNKNOWN)")
	var db dbFlags
	db.register(fs, poolconfig.Operator("cancel"))
	operator := fs.String("operator", defaultOperator(), "who is acting (archived)")
	reason := fs.String("reason", "", "why (required; archived)")
	if _, err := parseFlags(fs, env, args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return fmt.Errorf("%w: usage: cancel OUTBOX_ID [OUTBOX_ID ...] --reason WHY", errUsage)
	}
	ids := make([]uuid.UUID, 0, fs.NArg())
	for _, a := range fs.Args() {
		id, err := uuid.FromString(a)
		if err != nil {
			return fmt.Errorf("%w: %q is not an outbox id", errUsage, a)
		}
		ids = append(ids, id)
	}
	if strings.TrimSpace(*reason) == "" {
		return fmt.Errorf("%w: cancel needs --reason (it is archived with who acted)", errUsage)
	}
	if err := admin.CheckOperatorAction(*operator, *reason); err != nil {
		return fmt.Errorf("%w: cancel: %w", errUsage, err)
	}
	archive, pool, cleanup, err := openArchive(ctx, env, &db)
	if err != nil {
		return err
	}
	defer cleanup()
	out := json.NewEncoder(env.stdout)
	missed, refused, unknown := 0, 0, 0
	for _, id := range ids {
		ok, err := archive.Cancel(ctx, pool, id, *operator, *reason)
		var wait *attempts.RailMayStillActError
		if errors.As(err, &wait) {
			refused++
			line := map[string]any{"outbox_id": id, "action": "cancel", "done": false, "error": admin.RailMayStillAct,
				"note": "refused, nothing done: its rail call was cut off by a relayer's stop (CUT_OFF_AT_STOP, outcome unknown) and the rail may still be acting on it; run the cancel again after retry_after"}
			if !wait.Until.IsZero() {
				line["retry_after"] = wait.Until.UTC().Format(time.RFC3339Nano)
			}
			_ = out.Encode(line)
			continue
		}
		if errors.Is(err, attempts.ErrCancelInFlight) {
			missed++
			_ = out.Encode(map[string]any{"outbox_id": id, "action": "cancel", "done": false, "error": admin.InFlight,
				"note": "refused, nothing done: in flight (a relayer claimed it and its rail call may be under way); its outcome settles it, and a cancel takes it if it comes back to pending"})
			continue
		}
		if errors.Is(err, attempts.ErrActionNotDone) {
			missed++
			_ = out.Encode(map[string]any{"outbox_id": id, "action": "cancel", "done": false, "error": actionNotDone,
				"note": "nothing done: the connection broke before the cancel committed, and the database shows it was not done; run it again"})
			continue
		}
		if errors.Is(err, attempts.ErrCommitUnknown) {
			unknown++
			fmt.Fprintln(env.stderr, "outbox:", err)
			_ = out.Encode(map[string]any{"outbox_id": id, "action": "cancel", "done": false, "error": actionCommitUnknown,
				"note": "the cancel may have been done: the connection broke after it was sent and the database could not tell; outbox audit trail " + id.String() + " shows whether it was"})
			continue
		}
		if err != nil {
			return stopAfter(env, err, unknown)
		}
		line := map[string]any{"outbox_id": id, "action": "cancel", "done": ok}
		if !ok {
			missed++
			line["note"] = "not pending: already settled, or unknown; outbox audit trail " + id.String() + " shows which"
		}
		_ = out.Encode(line)
	}
	switch {
	case unknown > 0:
		return exitError{code: commitUnknownCode}
	case refused > 0:
		return exitError{code: cancelRefusedCode}
	case missed > 0:
		return exitError{code: 1}
	}
	return nil
}
