package main

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ledgerline/outbox/internal/store"
)

// TestArchiveDetachLostCommitReply: the connection of an `outbox archive
// detach` breaks while a month is moved. Where the commit's answer was
// lost (the month moved), the command settles it on a new connection,
// lists the month detached, goes on, and exits 0; it used to print
// `"detached": [], "ok": false` (exit 1) for a month that had moved. Where
// the move did not commit, the line says NOT_DONE and a run again moves
// it; where the database cannot be reached again to tell, COMMIT_UNKNOWN
// and exit status 4.
func TestArchiveDetachLostCommitReply(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	for m := 1; m <= 4; m++ {
		if _, err := b.pool.Exec(b.ctx, fmt.Sprintf(`CREATE TABLE outbox.attempts_2020_%02d PARTITION OF outbox.attempts
			FOR VALUES FROM ('2020-%02d-01 00:00Z') TO ('2020-%02d-01 00:00Z')`, m, m, m+1)); err != nil {
			t.Fatal(err)
		}
	}
	b.settle(t, store.Dispatched, "k1")
	time.Sleep(5 * time.Millisecond)
	requireExit(t, b.cli(t, "", "audit", "--settle", "1ms", "checkpoint"), 0)
	proxy, db := b.proxied(t)
	type line struct {
		Detached []string `json:"detached"`
		OK       bool     `json:"ok"`
		Error    string   `json:"error"`
	}
	detach := func(before string) (cliResult, line) {
		t.Helper()
		r := invokeCLI(t, nil, "", append([]string{"archive", "--before", before, "detach"}, db...)...)
		return r, oneJSONLine[line](t, r)
	}
	parent := func(month string) (p string) {
		t.Helper()
		if err := b.pool.QueryRow(b.ctx, `SELECT i.inhparent::regclass::text FROM pg_inherits i WHERE i.inhrelid = $1::regclass`,
			"outbox.attempts_"+month).Scan(&p); err != nil {
			t.Fatal(err)
		}
		return p
	}

	// The commit's answer is lost, the move done: listed, and the next
	// month moved too.
	seal := []byte("seal_archive_partition") // the move's last statement: its commit follows
	proxy.CutReplyAfterSeen(seal, []byte("commit"))
	r, l := detach("2020-03")
	if p := parent("2020_01"); p != "outbox.attempts_detached" {
		t.Fatalf("the cut move: attempts_2020_01 is under %s, want attempts_detached (the cut was not after the commit):\n%s", p, r)
	}
	if r.code != 0 || !l.OK || !slices.Equal(l.Detached, []string{"attempts_2020_01", "attempts_2020_02"}) {
		t.Fatalf("a detach whose commit's answer was lost, and that was done, was reported as:\n%s", r)
	}

	// The move's statement is cut: rolled back, said so, done by a run again.
	proxy.CutReplyAfter([]byte("DETACH PARTITION"))
	r, l = detach("2020-04")
	if p := parent("2020_03"); p != "outbox.attempts" {
		t.Fatalf("a move cut before its commit: attempts_2020_03 is under %s, want attempts", p)
	}
	if r.code != 1 || l.OK || l.Error != "NOT_DONE" || len(l.Detached) != 0 {
		t.Fatalf("a detach cut before its commit was reported as:\n%s", r)
	}
	if r, l = detach("2020-04"); r.code != 0 || !slices.Equal(l.Detached, []string{"attempts_2020_03"}) {
		t.Fatalf("the detach run again:\n%s", r)
	}

	// The commit's answer is lost and the database out of reach.
	proxy.RefuseAfterCut(3 * time.Second)
	proxy.CutReplyAfterSeen(seal, []byte("commit"))
	r, l = detach("2020-05")
	if p := parent("2020_04"); p != "outbox.attempts_detached" {
		t.Fatalf("the cut move: attempts_2020_04 is under %s, want attempts_detached:\n%s", p, r)
	}
	if r.code != 4 || l.OK || l.Error != "COMMIT_UNKNOWN" || len(l.Detached) != 0 {
		t.Fatalf("a detach whose commit's answer was lost, with the database out of reach, was reported as:\n%s", r)
	}
	requireExit(t, b.cli(t, "", "audit", "verify"), 0)
}
