package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/gofrs/uuid/v5"

	"github.com/ledgerline/outbox/poolconfig"
)

// runCancel cancels pending instructions: they are never sent.
func runCancel(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet(env, "cancel", "cancel [flags] OUTBOX_ID...   (needs --reason; only pending instructions: not one in flight)")
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
	archive, pool, cleanup, err := openArchive(ctx, env, &db)
	if err != nil {
		return err
	}
	defer cleanup()
	out := json.NewEncoder(env.stdout)
	missed := 0
	for _, id := range ids {
		ok, err := archive.Cancel(ctx, pool, id, *operator, *reason)
		if err != nil {
			return err
		}
		line := map[string]any{"outbox_id": id, "action": "cancel", "done": ok}
		if !ok {
			missed++
			line["note"] = "not pending: in flight (its rail call may be under way), already settled, or unknown; outbox audit trail " + id.String() + " shows which"
		}
		_ = out.Encode(line)
	}
	if missed > 0 {
		return exitError{code: 1}
	}
	return nil
}
