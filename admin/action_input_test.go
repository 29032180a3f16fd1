package admin_test

import (
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/gofrs/uuid/v5"

	"github.com/ledgerline/outbox/admin"
	"github.com/ledgerline/outbox/internal/store"
)

// TestActionInputCheckedBeforeLookup: a replay, acknowledgement or cancel
// whose reason the archive refuses (a control or format character) is
// answered 400 BAD_REQUEST, nothing done, whether or not the id is an
// open dead letter or a pending instruction; the console's form says why.
// A replay or an acknowledgement looked the dead letter up first and
// checked the reason only on acting, so an unknown id answered 404
// NOT_FOUND (the console: "already replayed or acknowledged") for input
// that was never acceptable.
func TestActionInputCheckedBeforeLookup(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	unknown := uuid.Must(uuid.NewV7())
	for _, reason := range []string{"a\x07bell", "a\u202ereversed", "two\nlines"} {
		for _, path := range []string{
			"/api/v1/dead-letters/" + unknown.String() + "/replay",
			"/api/v1/dead-letters/" + unknown.String() + "/acknowledge",
			"/api/v1/instructions/" + unknown.String() + "/cancel",
		} {
			var body map[string]any
			if st := b.call(t, "POST", path, operatorSecret, map[string]string{"reason": reason}, &body); st != http.StatusBadRequest || body["code"] != admin.BadRequest {
				t.Errorf("POST %s, reason %q: %d %v, want 400 BAD_REQUEST", path, reason, st, body)
			}
		}
		for _, action := range []string{admin.ActionReplay, admin.ActionAcknowledge, admin.ActionCancel} {
			if _, err := b.srv.Act(b.ctx, unknown, "oscar", action, reason); !errors.Is(err, store.ErrOperatorAction) {
				t.Errorf("Act %s, reason %q: %v, want ErrOperatorAction", action, reason, err)
			}
		}
	}
	c := consoleAs(t, b.url, operatorSecret)
	page := c.post(t, "/console/dead-letters/"+unknown.String()+"/replay", url.Values{"reason": {"a\u202ereversed"}, "failed": {"1"}})
	if !strings.Contains(page, "control or format character") || strings.Contains(page, "already replayed") {
		t.Errorf("console replay of an unknown id with a refused reason:\n%s", page)
	}
}

// TestCheckOperatorActionAgreesWithTheStore: admin.CheckOperatorAction
// refuses exactly what the store's actions refuse (store.ErrOperatorAction,
// read through a real cancel of an unknown id), so that checking first
// changes no answer but the order (both are store.CheckOperator; this
// keeps an action from checking anything else).
func TestCheckOperatorActionAgreesWithTheStore(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	for _, c := range []struct{ operator, reason string }{
		{"alice", "why"}, {"", "why"}, {" ", "why"}, {"alice", ""}, {"alice", " \t"},
		{"alice (Database Role x)", "why"}, {"al\nice", "why"}, {"alice", "a\x00b"},
		{"alice", "a\u200db"}, {"alice", "a\u202eb"}, {"alice", "é ok"}, {"alice", "tab\there"},
	} {
		mine := admin.CheckOperatorAction(c.operator, c.reason)
		_, theirs := b.st.Cancel(b.ctx, b.pool, uuid.Must(uuid.NewV7()), c.operator, c.reason)
		if errors.Is(mine, store.ErrOperatorAction) != errors.Is(theirs, store.ErrOperatorAction) ||
			(mine == nil) != (theirs == nil) {
			t.Errorf("%q, %q: CheckOperatorAction %v, the store %v", c.operator, c.reason, mine, theirs)
		}
	}
}
