package admin_test

import (
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ledgerline/outbox/admin"
	"github.com/ledgerline/outbox/internal/store"
)

// TestVerifyPageAccountsForEveryInstruction: the console's verify page
// says where every instruction is (dispatched, pending, in flight, dead
// letter, cancelled), as the API does: it gave the instructions and the
// dispatched ones only, so an auditor could not see where the others
// were, which is what "every committed enqueue in exactly one place" is
// about.
func TestVerifyPageAccountsForEveryInstruction(t *testing.T) {
	t.Parallel()
	b := setup(t, admin.Config{})
	b.enqueue(t, "p-dead", "k1")
	b.record(t, b.claim(t, "r1", time.Hour), store.Failed, "RAIL_REJECTED", 0)
	b.enqueue(t, "p-sent", "k2")
	b.record(t, b.claim(t, "r1", time.Hour), store.Dispatched, "", 0)
	b.enqueue(t, "p-flight", "k3")
	b.claim(t, "r1", time.Hour)
	b.enqueue(t, "p-pending", "k4")
	cancelled := b.enqueue(t, "p-cancelled", "k5")
	if ok, err := b.st.Cancel(b.ctx, b.pool, cancelled, "olga", "customer withdrew"); err != nil || !ok {
		t.Fatalf("cancel: %v %v", ok, err)
	}

	page := consoleAt(t, b.url).post(t, "/console/verify", url.Values{})
	for _, want := range []string{"instructions", "dispatched", "pending", "in flight", "dead letters", "cancelled"} {
		m := regexp.MustCompile(`<dt>` + want + `</dt><dd>(\d+)</dd>`).FindStringSubmatch(page)
		wantN := "1"
		if want == "instructions" {
			wantN = "5"
		}
		if m == nil || m[1] != wantN {
			t.Errorf("the verify page's %s: %v, want %s", want, m, wantN)
		}
	}
	if !strings.Contains(page, "Every invariant holds.") {
		t.Errorf("verify:\n%s", page)
	}
}
