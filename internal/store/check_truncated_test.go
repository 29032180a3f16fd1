package store_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/ledgerline/outbox/internal/store"
)

// TestCheckSaysItHasMore: the checks of invariants 1 to 5 stop at
// VerifyOptions.Examples violations; a report that stopped there without
// saying so read as if those were all (ten instructions lost where a
// restore lost fifty thousand). A check with more now ends its examples
// with one line saying there are more.
func TestCheckSaysItHasMore(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	const lost, examples = 4, 2
	for i := range lost {
		b.enqueue(t, fmt.Sprintf("p%d", i), fmt.Sprintf("k%d", i))
	}
	if _, err := b.pool.Exec(b.ctx, `DELETE FROM outbox.pending`); err != nil {
		t.Fatal(err)
	}
	check := func(examples int) []string {
		t.Helper()
		r, err := b.st.Verify(b.ctx, b.pool, store.VerifyOptions{Ordered: true, Examples: examples})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, v := range r.Violations {
			if v.Check == "exactly one place" {
				got = append(got, v.Detail)
			}
		}
		return got
	}
	got := check(examples)
	if len(got) != examples+1 || !strings.HasPrefix(got[examples], "and more") {
		t.Fatalf("%d instructions in no place, %d examples asked: got %q, want %d examples and an \"and more\" line", lost, examples, got, examples)
	}
	// Exactly as many as asked: nothing more to say.
	if got := check(lost); len(got) != lost {
		t.Fatalf("%d instructions in no place, %d examples asked: got %q", lost, lost, got)
	}
}
