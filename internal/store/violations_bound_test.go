package store_test

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/ledgerline/outbox/internal/store"
)

// TestCheckpointViolationsAreBounded: a month of checkpoints tampered
// with (43,200 of them, one a minute) must not become 43,200 violations
// held in the report of a relayer verifying for the console and sent
// whole through the API. Each checkpoint check keeps VerifyOptions.Examples
// of them and says how many more, as the other checks do, whether verify
// reads the checkpoints all in one batch, one at a time or on four
// connections.
func TestCheckpointViolationsAreBounded(t *testing.T) {
	t.Parallel()
	b := setupRecord(t)
	const checkpoints, examples = 5, 2
	for i := range checkpoints {
		p := fmt.Sprintf("p-bound-%d", i)
		b.enqueue(t, p, "k-"+p)
		b.record(t, recordOutcome(t, b.claimOne(t, "r1", longLease), "r1", store.Dispatched))
		b.checkpoint(t)
	}
	export, err := b.st.Checkpoints(b.ctx, b.pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(export) != checkpoints {
		t.Fatalf("%d checkpoints, want %d", len(export), checkpoints)
	}
	// Every checkpoint's row count changed: each no longer matches its
	// hash, its period's digest or the export. Plus checkpoints of the
	// export the database never had.
	extra := append([]store.Checkpoint(nil), export...)
	for i := range checkpoints {
		c := export[i]
		c.PeriodStart = c.PeriodStart.AddDate(-1, 0, 0)
		c.PeriodEnd = c.PeriodEnd.AddDate(-1, 0, 0)
		extra = append(extra, c)
	}
	b.execAll(t, `SET session_replication_role = replica`, `UPDATE outbox.checkpoints SET row_count = row_count + 1`)

	opts := store.VerifyOptions{Ordered: true, Checkpoints: extra, Examples: examples}
	r, err := b.st.Verify(b.ctx, b.pool, opts)
	if err != nil {
		t.Fatal(err)
	}
	perCheck := map[string][]string{}
	for _, v := range r.Violations {
		perCheck[v.Check] = append(perCheck[v.Check], v.Detail)
	}
	wantMore := map[string]int{
		"checkpoint chain":     checkpoints - examples,
		"checkpoint digests":   checkpoints - examples,
		"exported checkpoints": 2*checkpoints - examples,
	}
	for check, more := range wantMore {
		got := perCheck[check]
		if len(got) != examples+1 {
			t.Errorf("%q: %d violations held, want %d examples and one \"and %d more\": %v", check, len(got), examples, more, got)
			continue
		}
		if last := got[examples]; last != fmt.Sprintf("and %d more", more) {
			t.Errorf("%q: last violation %q, want \"and %d more\"", check, last, more)
		}
		for _, d := range got[:examples] {
			if strings.HasPrefix(d, "and ") {
				t.Errorf("%q: an example %q before the count", check, d)
			}
		}
	}
	parallel, err := b.st.Verify(b.ctx, b.pool, store.VerifyOptions{Ordered: true, Checkpoints: extra, Examples: examples, Workers: 4})
	if err != nil {
		t.Fatal(err)
	}
	batched, err := store.WithCheckpointBatch(b.st, 1).Verify(b.ctx, b.pool, opts)
	if err != nil {
		t.Fatal(err)
	}
	r.Duration, parallel.Duration, batched.Duration = 0, 0, 0
	if !reflect.DeepEqual(r, parallel) {
		t.Errorf("verify on four connections differs from verify on one:\n%+v\n%+v", parallel, r)
	}
	if !reflect.DeepEqual(r, batched) {
		t.Errorf("verify reading one checkpoint at a time differs:\n%+v\n%+v", batched, r)
	}
}
