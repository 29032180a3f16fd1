package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/migrations"
	"github.com/ledgerline/outbox/poolconfig"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// cliBundle is one test's database: its URL for the command line and a pool
// to look at what the commands did.
type cliBundle struct {
	ctx  context.Context
	url  string
	pool *pgxpool.Pool
}

func setupCLI(t *testing.T) *cliBundle {
	t.Helper()
	url := testdb.URL(t)
	pool, err := pgxpool.New(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return &cliBundle{ctx: t.Context(), url: url, pool: pool}
}

// cliResult is what one in-process invocation of the binary produced.
type cliResult struct {
	code           int
	stdout, stderr string
}

// invokeCLI runs the CLI in process with args, stdin and an environment made
// only of vars (the real process environment is never consulted). It never
// adds a database URL: callers must pass one, or db.connect would start an
// embedded cluster.
func invokeCLI(t *testing.T, vars map[string]string, stdin string, args ...string) cliResult {
	t.Helper()
	var stdout, stderr bytes.Buffer
	env := &environment{
		stdin:  strings.NewReader(stdin),
		stdout: &stdout,
		stderr: &stderr,
		getenv: func(k string) string { return vars[k] },
	}
	err := run(t.Context(), env, args)
	code := exitCode(env, err)
	return cliResult{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

// cli runs a command against this test's database (--database-url first).
func (b *cliBundle) cli(t *testing.T, stdin string, cmd string, args ...string) cliResult {
	t.Helper()
	return invokeCLI(t, nil, stdin, append([]string{cmd, "--database-url", b.url}, args...)...)
}

func (r cliResult) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

func requireExit(t *testing.T, r cliResult, want int) {
	t.Helper()
	if r.code != want {
		t.Fatalf("want exit status %d, got %s", want, r)
	}
}

// stdoutLines splits stdout into lines (a final newline ends the last).
func stdoutLines(t *testing.T, stdout string) []string {
	t.Helper()
	if stdout == "" {
		return nil
	}
	if !strings.HasSuffix(stdout, "\n") {
		t.Fatalf("output does not end with a newline: %q", stdout)
	}
	return strings.Split(strings.TrimSuffix(stdout, "\n"), "\n")
}

// enqueueLine is one decoded output line of `outbox enqueue`: a receipt or an
// error object, never both.
type enqueueLine struct {
	receipt bool
	// receipt
	outboxID   string
	sequenceID int64
	duplicate  bool
	// error
	code, field, message string
}

func decodeEnqueueLine(t *testing.T, line string) enqueueLine {
	t.Helper()
	var top map[string]json.RawMessage
	if err := json.Unmarshal([]byte(line), &top); err != nil {
		t.Fatalf("output line %q is not a JSON object: %v", line, err)
	}
	keys := make([]string, 0, len(top))
	for k := range top {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	strict := func(data []byte, v any) {
		t.Helper()
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		if err := dec.Decode(v); err != nil {
			t.Fatalf("output line %q: %v", line, err)
		}
	}
	switch {
	case slices.Equal(keys, []string{"duplicate", "outbox_id", "sequence_id"}):
		var r struct {
			OutboxID   string `json:"outbox_id"`
			SequenceID int64  `json:"sequence_id"`
			Duplicate  bool   `json:"duplicate"`
		}
		strict([]byte(line), &r)
		if r.OutboxID == "" || r.SequenceID < 1 {
			t.Fatalf("receipt line %q has no outbox id or sequence id", line)
		}
		return enqueueLine{receipt: true, outboxID: r.OutboxID, sequenceID: r.SequenceID, duplicate: r.Duplicate}
	case slices.Equal(keys, []string{"error"}):
		var e struct {
			Code    string `json:"code"`
			Field   string `json:"field"`
			Message string `json:"message"`
		}
		strict(top["error"], &e)
		if e.Code == "" || e.Message == "" {
			t.Fatalf("error line %q lacks a code or a message", line)
		}
		return enqueueLine{code: e.Code, field: e.Field, message: e.Message}
	default:
		t.Fatalf("output line %q has keys %v, want a receipt {outbox_id, sequence_id, duplicate} or {error}", line, keys)
		return enqueueLine{}
	}
}

// inputJSON renders one JSON input line: a sandbox payment of amount (a raw JSON
// number) from participant under key; kv pairs then set (or, with a nil
// value, remove) fields.
func inputJSON(participant, key, amount string, kv ...any) string {
	m := map[string]any{
		"instruction_id":  "ins-" + key,
		"participant_id":  participant,
		"idempotency_key": key,
		"rail":            "sandbox",
		"amount_minor":    json.Number(amount),
		"currency":        "USD",
		"destination":     "acct-1",
	}
	for i := 0; i+1 < len(kv); i += 2 {
		k := kv[i].(string)
		if kv[i+1] == nil {
			delete(m, k)
		} else {
			m[k] = kv[i+1]
		}
	}
	b, err := json.Marshal(m)
	if err != nil {
		panic(err)
	}
	return string(b)
}

type queuedRow struct {
	outboxID    string
	participant string
	sequenceID  int64
	key         string
}

func (b *cliBundle) pendingRows(t *testing.T) []queuedRow {
	t.Helper()
	rows, err := b.pool.Query(b.ctx, `SELECT outbox_id::text, participant_id, sequence_id, idempotency_key
		FROM outbox.pending ORDER BY participant_id, sequence_id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []queuedRow
	for rows.Next() {
		var r queuedRow
		if err := rows.Scan(&r.outboxID, &r.participant, &r.sequenceID, &r.key); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// transactions groups the pending rows' keys by the transaction (xmin) that
// inserted them, in the form of sortGroups.
func (b *cliBundle) transactions(t *testing.T) [][]string {
	t.Helper()
	rows, err := b.pool.Query(b.ctx, `SELECT array_agg(idempotency_key) FROM outbox.pending GROUP BY xmin::text`)
	if err != nil {
		t.Fatal(err)
	}
	groups, err := pgx.CollectRows(rows, pgx.RowTo[[]string])
	if err != nil {
		t.Fatal(err)
	}
	return sortGroups(groups)
}

// sortGroups sorts each group and then the groups by their first element.
func sortGroups(groups [][]string) [][]string {
	for _, g := range groups {
		slices.Sort(g)
	}
	slices.SortFunc(groups, func(a, b []string) int { return slices.Compare(a, b) })
	return groups
}

func (b *cliBundle) count(t *testing.T, table string) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(b.ctx, "SELECT count(*) FROM outbox."+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func wantStatusLine(schema string, current int32, notify string) string {
	ordering := "n/a"
	if current >= 5 {
		ordering = "on"
	}
	return fmt.Sprintf("schema %s: version %d of %d, notify trigger %s, ordering %s\n", schema, current, migrations.Latest(), notify, ordering)
}

func TestMigrateStatusAndUp(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	latest := migrations.Latest()
	if latest < 1 {
		t.Fatalf("migrations.Latest() = %d", latest)
	}

	r := b.cli(t, "", "migrate", "status")
	requireExit(t, r, 0)
	if want := wantStatusLine("outbox", latest, "on"); r.stdout != want {
		t.Errorf("migrate status printed %q, want %q", r.stdout, want)
	}

	// Already at the latest version: up is a no-op that reports the status.
	r = b.cli(t, "", "migrate", "up")
	requireExit(t, r, 0)
	if want := wantStatusLine("outbox", latest, "on"); r.stdout != want {
		t.Errorf("migrate up printed %q, want %q", r.stdout, want)
	}
}

func TestMigrateFreshSchema(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	latest := migrations.Latest()

	r := b.cli(t, "", "migrate", "--schema", "cli_fresh", "status")
	requireExit(t, r, 0)
	if want := wantStatusLine("cli_fresh", 0, "n/a"); r.stdout != want {
		t.Errorf("status of an unmigrated schema printed %q, want %q", r.stdout, want)
	}

	// No action means up.
	r = b.cli(t, "", "migrate", "--schema", "cli_fresh")
	requireExit(t, r, 0)
	if want := wantStatusLine("cli_fresh", latest, "on"); r.stdout != want {
		t.Errorf("migrate (up) printed %q, want %q", r.stdout, want)
	}
	var exists bool
	if err := b.pool.QueryRow(b.ctx, "SELECT to_regclass('cli_fresh.pending') IS NOT NULL").Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if !exists {
		t.Error("migrate up did not create cli_fresh.pending")
	}
}

func TestMigrateNotifySwitch(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	latest := migrations.Latest()

	r := b.cli(t, "", "migrate", "notify-off")
	requireExit(t, r, 0)
	if want := "schema outbox: notify trigger off\n"; r.stdout != want {
		t.Errorf("notify-off printed %q, want %q", r.stdout, want)
	}
	if on, err := migrations.NotifyEnabled(b.ctx, b.pool, "outbox"); err != nil || on {
		t.Fatalf("after notify-off the trigger is enabled=%v (err %v)", on, err)
	}
	r = b.cli(t, "", "migrate", "status")
	requireExit(t, r, 0)
	if want := wantStatusLine("outbox", latest, "off"); r.stdout != want {
		t.Errorf("status after notify-off printed %q, want %q", r.stdout, want)
	}

	r = b.cli(t, "", "migrate", "notify-on")
	requireExit(t, r, 0)
	if want := "schema outbox: notify trigger on\n"; r.stdout != want {
		t.Errorf("notify-on printed %q, want %q", r.stdout, want)
	}
	r = b.cli(t, "", "migrate", "status")
	requireExit(t, r, 0)
	if want := wantStatusLine("outbox", latest, "on"); r.stdout != want {
		t.Errorf("status after notify-on printed %q, want %q", r.stdout, want)
	}
}

func TestMigrateUsageErrors(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	for _, args := range [][]string{
		{"sideways"},
		{"up", "status"},
		{"--no-such-flag"},
		{"--lock-try", "-1s", "up"},
	} {
		r := b.cli(t, "", "migrate", args...)
		if r.code != 2 {
			t.Errorf("migrate %q: want exit status 2, got %s", args, r)
		}
		if r.stdout != "" {
			t.Errorf("migrate %q printed %q on stdout", args, r.stdout)
		}
	}
	if on, err := migrations.NotifyEnabled(b.ctx, b.pool, "outbox"); err != nil || !on {
		t.Errorf("usage errors changed the schema: notify enabled=%v (err %v)", on, err)
	}
}

// TestMigrateWaitsForLocksInTries: --lock-try and --lock-timeout reach the
// migration: behind a transaction holding pending, migrate up gives up
// after --lock-timeout, in tries of --lock-try, naming the migration that
// waited, and exits 1 with the schema left where it was.
func TestMigrateWaitsForLocksInTries(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	if err := migrations.MigrateWith(b.ctx, b.pool, migrations.Options{Schema: "cli_busy", TargetVersion: 38}); err != nil {
		t.Fatal(err)
	}
	slow, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Rollback(context.Background())
	if _, err := slow.Exec(b.ctx, "LOCK TABLE cli_busy.pending IN ROW EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	r := b.cli(t, "", "migrate", "--schema", "cli_busy", "--lock-timeout", "1s", "--lock-try", "100ms")
	if r.code != 1 || !strings.Contains(r.stderr, "migration 039_retry_time_behind_a_replay.sql could not take its locks") ||
		!strings.Contains(r.stderr, "tries of 100ms") {
		t.Fatalf("migrate behind a held lock: %s; want exit 1 naming migration 039 and its tries of 100ms", r)
	}
	if st, err := migrations.GetStatus(b.ctx, b.pool, "cli_busy"); err != nil || st.Current != 38 {
		t.Fatalf("status %+v, %v: want 038", st, err)
	}
}

func TestEnqueueFromFlags(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	args := []string{"--instruction-id", "ins-1", "--participant-id", "merchant-1", "--idempotency-key", "key-1",
		"--rail", "sandbox", "--amount-minor", "1250", "--currency", "USD", "--destination", "acct-1",
		"--metadata", `{"invoice": "INV-1"}`}

	r := b.cli(t, "this is not read in flag mode\n", "enqueue", args...)
	requireExit(t, r, 0)
	lines := stdoutLines(t, r.stdout)
	if len(lines) != 1 {
		t.Fatalf("want one receipt line, got %q", r.stdout)
	}
	first := decodeEnqueueLine(t, lines[0])
	if !first.receipt || first.sequenceID != 1 || first.duplicate {
		t.Fatalf("first enqueue: %+v, want a fresh receipt with sequence 1", first)
	}
	rows := b.pendingRows(t)
	if len(rows) != 1 || rows[0] != (queuedRow{first.outboxID, "merchant-1", 1, "key-1"}) {
		t.Fatalf("pending rows %+v, want one for outbox %s", rows, first.outboxID)
	}
	var payload map[string]any
	if err := b.pool.QueryRow(b.ctx, "SELECT payload FROM outbox.pending").Scan(&payload); err != nil {
		t.Fatal(err)
	}
	if payload["amount_minor"] != float64(1250) || payload["currency"] != "USD" || payload["destination"] != "acct-1" {
		t.Errorf("payload %v does not carry the flags' payment", payload)
	}
	if meta, _ := payload["metadata"].(map[string]any); meta["invoice"] != "INV-1" {
		t.Errorf("payload %v does not carry --metadata", payload)
	}

	// The same command again: the original receipt, nothing new written.
	r = b.cli(t, "", "enqueue", args...)
	requireExit(t, r, 0)
	lines = stdoutLines(t, r.stdout)
	if len(lines) != 1 {
		t.Fatalf("want one receipt line, got %q", r.stdout)
	}
	again := decodeEnqueueLine(t, lines[0])
	if !again.receipt || !again.duplicate || again.outboxID != first.outboxID || again.sequenceID != 1 {
		t.Fatalf("replay: %+v, want duplicate of %+v", again, first)
	}
	if n := b.count(t, "pending"); n != 1 {
		t.Errorf("replay left %d pending rows, want 1", n)
	}

	// The same key with another amount: a mismatch line and exit status 1.
	changed := slices.Clone(args)
	changed[slices.Index(changed, "1250")] = "1251"
	r = b.cli(t, "", "enqueue", changed...)
	requireExit(t, r, 1)
	lines = stdoutLines(t, r.stdout)
	if len(lines) != 1 {
		t.Fatalf("want one error line, got %q", r.stdout)
	}
	if got := decodeEnqueueLine(t, lines[0]); got.receipt || got.code != "IDEMPOTENCY_MISMATCH" || got.field != "idempotency_key" {
		t.Errorf("mismatch: %+v, want IDEMPOTENCY_MISMATCH on idempotency_key", got)
	}
	if n := b.count(t, "idempotency_keys"); n != 1 {
		t.Errorf("mismatch wrote a key: %d keys, want 1", n)
	}
}

func TestEnqueueFromFlagsInvalid(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	r := b.cli(t, "", "enqueue", "--instruction-id", "ins-1", "--participant-id", "merchant-1", "--idempotency-key", "key-1",
		"--rail", "sandbox", "--amount-minor", "1250", "--currency", "DEM", "--destination", "acct-1")
	requireExit(t, r, 1)
	lines := stdoutLines(t, r.stdout)
	if len(lines) != 1 {
		t.Fatalf("want one error line, got %q", r.stdout)
	}
	if got := decodeEnqueueLine(t, lines[0]); got.receipt || got.code != "VALIDATION_FAILED" || got.field != "currency" {
		t.Errorf("got %+v, want VALIDATION_FAILED on currency", got)
	}
	if n := b.count(t, "idempotency_keys"); n != 0 {
		t.Errorf("an invalid instruction wrote %d keys", n)
	}

	// Positional arguments are a usage error.
	r = b.cli(t, "", "enqueue", "--rail", "sandbox", "stray")
	requireExit(t, r, 2)
}

// wantLine is the expected output for one non-blank input line.
type wantLine struct {
	seq    int64 // receipt: sequence id (0: an error line)
	dup    bool
	sameAs int // receipt: index of an earlier line with the same outbox id, or -1
	code   string
	field  string
}

func wantReceipt(seq int64) wantLine         { return wantLine{seq: seq, sameAs: -1} }
func wantDup(line int, seq int64) wantLine   { return wantLine{seq: seq, dup: true, sameAs: line} }
func wantError(code, field string) wantLine  { return wantLine{code: code, field: field, sameAs: -1} }
func wantInvalidInput(field string) wantLine { return wantError("INVALID_INPUT", field) }
func wantValidation(field string) wantLine   { return wantError("VALIDATION_FAILED", field) }
func wantMismatch(field string) wantLine     { return wantError("IDEMPOTENCY_MISMATCH", field) }
func wantReused() wantLine                   { return wantError("INSTRUCTION_ID_REUSED", "instruction_id") }

func checkEnqueueOutput(t *testing.T, stdout string, want []wantLine) []enqueueLine {
	t.Helper()
	lines := stdoutLines(t, stdout)
	if len(lines) != len(want) {
		t.Fatalf("got %d output lines, want %d (one per non-blank input line):\n%s", len(lines), len(want), stdout)
	}
	got := make([]enqueueLine, len(lines))
	for i, l := range lines {
		got[i] = decodeEnqueueLine(t, l)
	}
	for i, w := range want {
		g := got[i]
		switch {
		case w.seq == 0:
			if g.receipt || g.code != w.code || g.field != w.field {
				t.Errorf("line %d: got %+v, want error %s field %q", i, g, w.code, w.field)
			}
		case !g.receipt || g.sequenceID != w.seq || g.duplicate != w.dup:
			t.Errorf("line %d: got %+v, want receipt sequence %d duplicate %v", i, g, w.seq, w.dup)
		case w.sameAs >= 0 && g.outboxID != got[w.sameAs].outboxID:
			t.Errorf("line %d: outbox id %s, want %s (line %d's)", i, g.outboxID, got[w.sameAs].outboxID, w.sameAs)
		case w.sameAs < 0:
			for j := range i {
				if got[j].receipt && got[j].outboxID == g.outboxID {
					t.Errorf("line %d: outbox id %s already belongs to line %d", i, g.outboxID, j)
				}
			}
		}
	}
	return got
}

func TestEnqueueFromStdin(t *testing.T) {
	t.Parallel()

	input := strings.Join([]string{
		inputJSON("p1", "k1", "100"), // 0
		"",
		`{"instruction_id": "ins-x", "participant_id": `,     // 1: bad JSON
		inputJSON("p1", "k-unknown", "100", "colour", "red"), // 2: unknown field
		inputJSON("p1", "k-dem", "100", "currency", "DEM"),   // 3: withdrawn currency
		inputJSON("p1", "k-frac", "10.5"),                    // 4: excess precision
		"   \t",                                              // blank
		inputJSON("p1", "k-big", "9007199254740993"),         // 5: overflow
		`{"instruction_id": "ins-ev", "participant_id": "p2", "idempotency_key": "k-ev", "rail": "event", "metadata": {"kind": "usage", "units": 3}}`, // 6: event rail
		inputJSON("p1", "k2", "200"), // 7
		inputJSON("p1", "k1", "999"), // 8: k1 reused with another amount
		inputJSON("p1", "k3", "300"), // 9
		inputJSON("p1", "k4", "400"), // 10
		inputJSON("p1", "k4", "401"), // 11: mismatch of a key new in the same batch
		inputJSON("p1", "k1", "100"), // 12: exact replay of line 0
		"",
		inputJSON("p1", "k5", "500"), // 13
		inputJSON("p1", "k5", "500", "instruction_id", "ins-other"), // 14: k5 under another instruction id
		inputJSON("p1", "k6", "600", "instruction_id", "ins-k1"),    // 15: line 0's instruction id under another key
		inputJSON("p1", "k7", "700"),                                // 16
		inputJSON("p1", "k8", "800", "instruction_id", "ins-k7"),    // 17: line 16's instruction id under another key; no final newline
	}, "\n")
	want := []wantLine{
		0:  wantReceipt(1),
		1:  wantInvalidInput("participant_id"),
		2:  wantInvalidInput("colour"),
		3:  wantValidation("currency"),
		4:  wantValidation("amount_minor"),
		5:  wantValidation("amount_minor"),
		6:  wantReceipt(1),
		7:  wantReceipt(2),
		8:  wantMismatch("idempotency_key"),
		9:  wantReceipt(3),
		10: wantReceipt(4),
		11: wantMismatch("idempotency_key"),
		12: wantDup(0, 1),
		13: wantReceipt(5),
		14: wantMismatch("idempotency_key"),
		15: wantReused(),
		16: wantReceipt(6),
		17: wantReused(),
	}
	// Every enqueued line, with its participant and key.
	enqueued := map[int]queuedRow{
		0: {participant: "p1", sequenceID: 1, key: "k1"}, 6: {participant: "p2", sequenceID: 1, key: "k-ev"},
		7: {participant: "p1", sequenceID: 2, key: "k2"}, 9: {participant: "p1", sequenceID: 3, key: "k3"},
		10: {participant: "p1", sequenceID: 4, key: "k4"}, 13: {participant: "p1", sequenceID: 5, key: "k5"},
		16: {participant: "p1", sequenceID: 6, key: "k7"},
	}

	for _, tc := range []struct {
		name string
		args []string
		// transactions groups the enqueued keys by the transaction that
		// wrote them.
		transactions [][]string
	}{
		{"one transaction per line", nil, [][]string{{"k1"}, {"k-ev"}, {"k2"}, {"k3"}, {"k4"}, {"k5"}, {"k7"}}},
		// Batches of 3 lines: [0 1 2] [3 4 5] [6 7 8] [9 10 11] [12 13 14]
		// [15 16 17], so line 8 mismatches a committed key inside a batch
		// of good lines, and lines 11 and 14 one that is new in their own
		// batch; line 15 names a committed instruction id under another
		// key, and line 17 one given its key earlier in its batch.
		{"batch of 3", []string{"--batch", "3"}, [][]string{{"k1"}, {"k-ev", "k2"}, {"k3", "k4"}, {"k5"}, {"k7"}}},
		{"one batch", []string{"--batch", "100"}, [][]string{{"k-ev", "k1", "k2", "k3", "k4", "k5", "k7"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setupCLI(t)
			r := b.cli(t, input, "enqueue", tc.args...)
			requireExit(t, r, 1) // some lines failed
			got := checkEnqueueOutput(t, r.stdout, want)
			if t.Failed() {
				t.FailNow()
			}

			// Good lines were enqueued despite the bad ones, and nothing else.
			var wantRows []queuedRow
			for i, row := range enqueued {
				row.outboxID = got[i].outboxID
				wantRows = append(wantRows, row)
			}
			slices.SortFunc(wantRows, func(a, b queuedRow) int {
				return strings.Compare(fmt.Sprintf("%s/%09d", a.participant, a.sequenceID), fmt.Sprintf("%s/%09d", b.participant, b.sequenceID))
			})
			if rows := b.pendingRows(t); !slices.Equal(rows, wantRows) {
				t.Errorf("pending rows:\n%+v\nwant\n%+v", rows, wantRows)
			}
			if n := b.count(t, "idempotency_keys"); n != len(enqueued) {
				t.Errorf("%d idempotency keys, want %d", n, len(enqueued))
			}
			// --batch N writes N lines per transaction: rows written by one
			// transaction share their xmin.
			if txs := b.transactions(t); !slices.EqualFunc(txs, sortGroups(tc.transactions), slices.Equal) {
				t.Errorf("keys by writing transaction: %q, want %q", txs, tc.transactions)
			}
			// k1 keeps its first payload.
			var amount int64
			if err := b.pool.QueryRow(b.ctx, "SELECT (payload->>'amount_minor')::bigint FROM outbox.pending WHERE idempotency_key = 'k1'").Scan(&amount); err != nil {
				t.Fatal(err)
			}
			if amount != 100 {
				t.Errorf("k1 amount %d, want 100 (the mismatching line must not overwrite it)", amount)
			}
		})
	}
}

func TestEnqueueFromStdinAllGood(t *testing.T) {
	t.Parallel()
	input := inputJSON("p1", "a", "1") + "\n\n" + inputJSON("p1", "b", "2") + "\n" + inputJSON("p2", "c", "3") + "\n"
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"one transaction per line", nil},
		{"batch of 2", []string{"--batch", "2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setupCLI(t)
			r := b.cli(t, input, "enqueue", tc.args...)
			requireExit(t, r, 0)
			checkEnqueueOutput(t, r.stdout, []wantLine{wantReceipt(1), wantReceipt(2), wantReceipt(1)})
			if n := b.count(t, "pending"); n != 3 {
				t.Errorf("%d pending rows, want 3", n)
			}

			// Replaying the whole input is all duplicates and still exit 0.
			r = b.cli(t, input, "enqueue", tc.args...)
			requireExit(t, r, 0)
			checkEnqueueOutput(t, r.stdout, []wantLine{
				{seq: 1, dup: true, sameAs: -1}, {seq: 2, dup: true, sameAs: -1}, {seq: 1, dup: true, sameAs: -1},
			})
			if n := b.count(t, "pending"); n != 3 {
				t.Errorf("replay left %d pending rows, want 3", n)
			}
		})
	}
}

func TestEnqueueEmptyStdin(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	r := b.cli(t, "\n  \n", "enqueue")
	requireExit(t, r, 0)
	if r.stdout != "" {
		t.Errorf("blank input printed %q", r.stdout)
	}
}

func TestHelp(t *testing.T) {
	t.Parallel()
	// The database commands; --help never connects, so no URL is needed.
	for _, name := range []string{"migrate", "enqueue", "demo"} {
		if !slices.ContainsFunc(commands, func(c command) bool { return c.name == name }) {
			t.Errorf("command %s is missing", name)
			continue
		}
		for _, h := range []string{"--help", "-h"} {
			r := invokeCLI(t, nil, "", name, h)
			if r.code != 0 {
				t.Errorf("%s %s: want exit status 0, got %s", name, h, r)
			}
			out := r.stdout + r.stderr
			if !strings.Contains(out, "usage: outbox "+name) {
				t.Errorf("%s %s does not print its usage:\n%s", name, h, out)
			}
			for _, s := range []string{"--database-url", "OUTBOX_DATABASE_URL", "OUTBOX_SCHEMA"} {
				if !strings.Contains(out, s) {
					t.Errorf("%s %s does not list %s:\n%s", name, h, s, out)
				}
			}
		}
	}

	r := invokeCLI(t, nil, "", "--help")
	requireExit(t, r, 0)
	for _, c := range commands {
		if !strings.Contains(r.stdout, "  "+c.name+" ") {
			t.Errorf("outbox --help does not list %s:\n%s", c.name, r.stdout)
		}
	}
	if !strings.Contains(r.stdout, "OUTBOX_DATABASE_URL") {
		t.Errorf("outbox --help does not mention OUTBOX_DATABASE_URL:\n%s", r.stdout)
	}
}

func TestUnknownOrMissingCommand(t *testing.T) {
	t.Parallel()
	r := invokeCLI(t, nil, "", "frobnicate", "--database-url", "postgres://unused")
	requireExit(t, r, 2)
	if !strings.Contains(r.stderr, "frobnicate") || !strings.Contains(r.stderr, "usage: outbox") {
		t.Errorf("unknown command: stderr does not name it and show the usage:\n%s", r.stderr)
	}
	if r.stdout != "" {
		t.Errorf("unknown command printed %q on stdout", r.stdout)
	}

	r = invokeCLI(t, nil, "")
	requireExit(t, r, 2)
}

// TestEnvDatabaseURL runs commands with the URL only in OUTBOX_DATABASE_URL.
func TestEnvDatabaseURL(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	vars := map[string]string{"OUTBOX_DATABASE_URL": b.url}

	// Guard first: without the variable applied, db.connect would start an
	// embedded cluster instead of failing.
	var db dbFlags
	fs := flag.NewFlagSet("guard", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	db.register(fs, poolconfig.Operator("guard"))
	env := &environment{getenv: func(k string) string { return vars[k] }}
	if _, err := parseFlags(fs, env, nil); err != nil || db.url != b.url {
		t.Fatalf("OUTBOX_DATABASE_URL not applied: url %q, err %v", db.url, err)
	}

	r := invokeCLI(t, vars, "", "migrate", "status")
	requireExit(t, r, 0)
	if want := wantStatusLine("outbox", migrations.Latest(), "on"); r.stdout != want {
		t.Errorf("migrate status printed %q, want %q", r.stdout, want)
	}
	r = invokeCLI(t, vars, inputJSON("p1", "k1", "100")+"\n", "enqueue")
	requireExit(t, r, 0)
	checkEnqueueOutput(t, r.stdout, []wantLine{wantReceipt(1)})
	if n := b.count(t, "pending"); n != 1 {
		t.Errorf("%d pending rows, want 1", n)
	}
}

func TestEnvFlagsAppliedAndFlagsWin(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	badSchema := map[string]string{"OUTBOX_SCHEMA": "Bad-Schema"}

	// Control: the command works without the variable.
	r := b.cli(t, "", "migrate", "status")
	requireExit(t, r, 0)

	// The variable is applied: an invalid schema is a usage error.
	r = invokeCLI(t, badSchema, "", "migrate", "--database-url", b.url, "status")
	requireExit(t, r, 2)
	if !strings.Contains(r.stderr, "Bad-Schema") {
		t.Errorf("stderr does not name the bad schema:\n%s", r.stderr)
	}
	r = invokeCLI(t, badSchema, inputJSON("p1", "k1", "100")+"\n", "enqueue", "--database-url", b.url)
	requireExit(t, r, 2)
	if n := b.count(t, "pending"); n != 0 {
		t.Errorf("enqueue with an invalid schema wrote %d rows", n)
	}

	// The command line beats the environment.
	r = invokeCLI(t, badSchema, "", "migrate", "--database-url", b.url, "--schema", "outbox", "status")
	requireExit(t, r, 0)
	if want := wantStatusLine("outbox", migrations.Latest(), "on"); r.stdout != want {
		t.Errorf("migrate status printed %q, want %q", r.stdout, want)
	}
	deadURL := map[string]string{"OUTBOX_DATABASE_URL": "postgres://nobody@127.0.0.1:1/nowhere?sslmode=disable&connect_timeout=5"}
	r = invokeCLI(t, deadURL, inputJSON("p1", "k1", "100")+"\n", "enqueue", "--database-url", b.url)
	requireExit(t, r, 0)
	checkEnqueueOutput(t, r.stdout, []wantLine{wantReceipt(1)})

	// A variable that does not parse for its flag is a usage error naming it.
	r = invokeCLI(t, map[string]string{"OUTBOX_BATCH": "three"}, "", "enqueue", "--database-url", b.url)
	requireExit(t, r, 2)
	if !strings.Contains(r.stderr, "OUTBOX_BATCH") {
		t.Errorf("stderr does not name OUTBOX_BATCH:\n%s", r.stderr)
	}
}

// TestEnqueueRejectsTrailingData: a line is one JSON object. Two objects
// run together (a lost newline) or stray text after the object must fail
// the line, not enqueue the first object and drop the rest unreported.
func TestEnqueueRejectsTrailingData(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	input := inputJSON("p1", "k1", "100") + inputJSON("p1", "k2", "200") + "\n" +
		inputJSON("p1", "k3", "300") + "}\n"
	r := b.cli(t, input, "enqueue")
	lines := stdoutLines(t, r.stdout)
	if len(lines) != 2 {
		t.Fatalf("want one output line per input line, got %s", r)
	}
	requireExit(t, r, 1)
	checkEnqueueOutput(t, r.stdout, []wantLine{wantInvalidInput(""), wantInvalidInput("")})
	if n := b.count(t, "idempotency_keys"); n != 0 {
		t.Errorf("rejected lines wrote %d keys", n)
	}
}

// TestEnvInstructionFlagKeepsStdinMode: an instruction flag set only in the
// environment (OUTBOX_TENANT_ID) must not switch enqueue from stdin mode to
// single-instruction mode.
func TestEnvInstructionFlagKeepsStdinMode(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	input := inputJSON("p1", "k1", "100") + "\n" + inputJSON("p1", "k2", "200") + "\n"
	r := invokeCLI(t, map[string]string{"OUTBOX_TENANT_ID": "t1", "OUTBOX_DATABASE_URL": b.url}, input, "enqueue")
	requireExit(t, r, 0)
	if lines := stdoutLines(t, r.stdout); len(lines) != 2 {
		t.Fatalf("want two receipts from stdin, got %s", r)
	}
	if n := b.count(t, "idempotency_keys"); n != 2 {
		t.Fatalf("%d instructions enqueued, want 2", n)
	}
}

// TestRelayFailsFastOnPermanentErrors: a relayer the database refuses (an
// unknown role: the same SQLSTATE class as a wrong password) or whose
// schema is not migrated exits 1 at once with a message saying what to do,
// instead of logging "relayer started" and retrying forever.
func TestRelayFailsFastOnPermanentErrors(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	u, err := url.Parse(b.url)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword("nobody_here", "wrong-password")
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"refused credentials", []string{"relay", "--database-url", u.String()}, "credentials"},
		{"schema not migrated", []string{"relay", "--database-url", b.url, "--schema", "never_migrated"}, "outbox migrate"},
	} {
		r := invokeCLI(t, nil, "", tt.args...)
		requireExit(t, r, 1)
		if !strings.Contains(r.stderr, tt.want) || strings.Contains(r.stderr, "relayer started") || strings.Contains(r.stderr, "wrong-password") {
			t.Errorf("%s: want a clear error mentioning %q (no start, no password), got %s", tt.name, tt.want, r)
		}
	}
}

// TestDemoSaysItsOutageAndKeepsItsInvariants runs the README's demo
// briefly against this test's database: it announces the outage it
// scripts, and the run ends with no duplicate payment and every invariant
// true (the demo exits 1 otherwise).
func TestDemoSaysItsOutageAndKeepsItsInvariants(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	r := b.cli(t, "", "demo", "--duration", "3s", "--outage", "1s", "--rate", "200", "--participants", "20")
	requireExit(t, r, 0)
	for _, want := range []string{
		"demo: the sandbox rail goes down at 1s for 1s;",
		"effective duplicates 0\n",
		"invariants: OK",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("demo output lacks %q:\n%s", want, r)
		}
	}
}

// TestMigrateSaysWhatTheServerAdvises: a migration that stops on data it
// cannot change (028, a key two instruction ids share) explains itself in
// PostgreSQL's detail and hint, with the query that lists the rows; the
// CLI printed the message alone.
func TestMigrateSaysWhatTheServerAdvises(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	if err := migrations.MigrateWith(b.ctx, b.pool, migrations.Options{Schema: "shared", TargetVersion: 27}); err != nil {
		t.Fatal(err)
	}
	for _, instruction := range []string{"ins-1", "ins-2"} {
		if _, err := b.pool.Exec(b.ctx, `INSERT INTO shared.idempotency_keys
			(instruction_id, idempotency_key, outbox_id, participant_id, sequence_id, payload_hash)
			VALUES ($1, 'k1', gen_random_uuid(), 'p1', 1, '\x00')`, instruction); err != nil {
			t.Fatal(err)
		}
	}
	r := b.cli(t, "", "migrate", "--schema", "shared", "up")
	requireExit(t, r, 1)
	if !strings.Contains(r.stderr, "outbox: detail: A rail deduplicates by the key alone") ||
		!strings.Contains(r.stderr, "outbox: hint: List them with: SELECT tenant_id, idempotency_key") {
		t.Fatalf("stderr leaves out the server's detail and hint:\n%s", r.stderr)
	}
}

// TestDemoSummarySaysWhichRailsWerePaused runs the demo on a database
// whose sandbox rail an earlier run left paused, and pauses and resumes
// the event rail while it runs: the summary names the pause in force and
// the one during the run, and does not put the held instructions down to
// retries not yet due. The pause made during the run waits for the demo's
// first enqueue, so it falls within the run.
func TestDemoSummarySaysWhichRailsWerePaused(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	requireExit(t, b.cli(t, "", "rails", "--operator", "olga", "--reason", "left from an earlier run", "--wait", "0", "pause", "sandbox"), 0)
	requireExit(t, b.cli(t, "", "rails", "--operator", "olga", "--reason", "restore", "--wait", "0", "pause", "*"), 0)
	during := make(chan error, 1)
	go func() {
		during <- func() error {
			for {
				var held bool
				err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error {
					if _, err := tx.Exec(b.ctx, `SELECT set_config('outbox.tenant', '*', true)`); err != nil {
						return err
					}
					return tx.QueryRow(b.ctx, `SELECT EXISTS (SELECT FROM outbox.pending)`).Scan(&held)
				})
				if err != nil {
					return err
				}
				if held {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			if _, err := b.pool.Exec(b.ctx, `SELECT outbox.pause_rail('event', 'ivan', 'a look at the event rail')`); err != nil {
				return err
			}
			_, err := b.pool.Exec(b.ctx, `SELECT outbox.resume_rail('event', 'ivan', 'looked')`)
			return err
		}()
	}()
	r := b.cli(t, "", "demo", "--duration", "2s", "--outage", "0", "--rate", "100", "--participants", "5")
	if err := <-during; err != nil {
		t.Fatal(err)
	}
	requireExit(t, r, 0)
	for _, want := range []string{
		`rail "sandbox" is paused (by olga: left from an earlier run)`,
		`rail "event" was paused during the run (by ivan: a look at the event rail), and resumed`,
		`every rail ("*") is paused (by olga: restore) since `,
		"until it is resumed (outbox rails resume '*')",
		"invariants: OK",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("demo output lacks %q:\n%s", want, r)
		}
	}
	if strings.Contains(r.stdout, "pending (retries not yet due)") {
		t.Errorf("demo output puts the instructions the pause holds down to retries:\n%s", r)
	}
}

// TestMigrateOrderingSwitchOnASchemaBehind: the ordering switch runs this
// build's statements, which need migration 039 (pending.retry_at): on a
// schema before it, ordering-on and ordering-off failed with the
// database's "column does not exist". Now they say the schema is behind
// and to run `outbox migrate` (a *migrations.SchemaError), exit 1 as
// every command does on a schema behind, and change nothing; status still
// reports the switch.
func TestMigrateOrderingSwitchOnASchemaBehind(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	const schema = "cli_ord38"
	if err := migrations.MigrateWith(b.ctx, b.pool, migrations.Options{Schema: schema, TargetVersion: 38}); err != nil {
		t.Fatal(err)
	}
	for _, action := range []string{"ordering-off", "ordering-on"} {
		r := b.cli(t, "", "migrate", "--schema", schema, action)
		if r.code != 1 || !strings.Contains(r.stderr, "version 38") || !strings.Contains(r.stderr, "run `outbox migrate`") || r.stdout != "" {
			t.Errorf("migrate %s on a schema at 38: want exit 1 saying it is behind, got %s", action, r)
		}
	}
	var behind *migrations.SchemaError
	if err := migrations.SetOrdered(b.ctx, b.pool, schema, false); !errors.As(err, &behind) || behind.Current != 38 {
		t.Errorf("SetOrdered on a schema at 38: %v, want a *migrations.SchemaError at 38", err)
	}
	if on, err := migrations.Ordered(b.ctx, b.pool, schema); err != nil || !on {
		t.Errorf("ordering after the refused switches: on=%v (%v), want it left on", on, err)
	}
	r := b.cli(t, "", "migrate", "--schema", schema, "status")
	requireExit(t, r, 0)
	if !strings.Contains(r.stdout, "version 38 of") || !strings.Contains(r.stdout, "ordering on") {
		t.Errorf("status on a schema at 38: %q", r.stdout)
	}
}

// TestMigrateNotifySwitchOnASchemaNeverMigrated: notify-on and notify-off
// on a schema that was never migrated (a --schema misspelt) failed with
// the database's "relation does not exist"; they say it is not migrated
// (a *migrations.SchemaError), exit 1, and create nothing.
func TestMigrateNotifySwitchOnASchemaNeverMigrated(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	for _, action := range []string{"notify-off", "notify-on"} {
		r := b.cli(t, "", "migrate", "--schema", "cli_never", action)
		if r.code != 1 || !strings.Contains(r.stderr, "is not migrated") || r.stdout != "" {
			t.Errorf("migrate %s on a schema never migrated: want exit 1 saying so, got %s", action, r)
		}
	}
	var behind *migrations.SchemaError
	if err := migrations.SetNotify(b.ctx, b.pool, "cli_never", true); !errors.As(err, &behind) || behind.Current != 0 {
		t.Errorf("SetNotify on a schema never migrated: %v, want a *migrations.SchemaError", err)
	}
	var exists bool
	if err := b.pool.QueryRow(b.ctx, "SELECT to_regnamespace('cli_never') IS NOT NULL").Scan(&exists); err != nil || exists {
		t.Errorf("schema cli_never exists after the refused switches (%v)", err)
	}
}
