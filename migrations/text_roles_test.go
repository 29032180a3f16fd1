package migrations_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"unicode"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/payment"
)

// TestRolesCannotWriteTextGoRefuses: the operators' functions and a
// producer's direct writes, run with psql-like statements as the roles
// (no Go check in front), refuse the text the store and the validators
// refuse (migration 051): control and format characters (a line break,
// U+2028, a bidi override, a zero-width space), a name or reason of
// spaces only (Unicode's, which btrim left), an operator's name or reason
// past its bound, and a producer's ids Go would refuse. Each refusal has
// its SQLSTATE, and nothing is written.
func TestRolesCannotWriteTextGoRefuses(t *testing.T) {
	t.Parallel()
	b := setupRoles(t)
	producer := b.as(t, "outbox_producer", "")
	relayer := b.as(t, "outbox_relayer", "")
	operator := b.as(t, "outbox_operator", "*")
	dead, err := b.enqueue(t, producer, "", "dead")
	if err != nil {
		t.Fatal(err)
	}
	b.settle(t, relayer, store.Failed)
	queued, err := b.enqueue(t, producer, "", "queued")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.st.PauseRail(b.ctx, operator, "held", "alice", "to resume"); err != nil {
		t.Fatal(err)
	}
	var pausedAt any
	if err := b.admin.QueryRow(b.ctx, `SELECT paused_at FROM outbox.rail_pauses WHERE rail_type = 'held'`).Scan(&pausedAt); err != nil {
		t.Fatal(err)
	}

	// What the store refuses (CheckOperator), each for the name and the
	// reason: every one refused by the database as well.
	bad := map[string]string{
		"a line feed":          "a\nb",
		"a carriage return":    "a\rb",
		"a NEL":                "a\u0085b",
		"a line separator":     "a\u2028b",
		"a bidi override":      "evil\u202egnp.exe",
		"a zero-width space":   "al\u200bice",
		"a byte order mark":    "\ufeffalice",
		"a variation selector": "alice\ufe0f",
		"no-break spaces only": "\u00a0\u00a0",
		"ideographic space":    "\u3000",
	}
	long := map[string][2]string{
		"a name past its bound":    {strings.Repeat("n", store.MaxOperatorNameBytes+1), "why"},
		"a reason past its bound":  {"alice", strings.Repeat("r", store.MaxReasonBytes+1)},
		"a name of many megabytes": {strings.Repeat("n", 4<<20), "why"},
	}
	type call struct {
		what, sql string
		args      func(op, why string) []any
	}
	calls := []call{
		{"replay_dead_letter", `SELECT outbox.replay_dead_letter($1, $2, $3)`, func(op, why string) []any { return []any{dead.OutboxID, op, why} }},
		{"acknowledge_dead_letter", `SELECT outbox.acknowledge_dead_letter($1, $2, $3)`, func(op, why string) []any { return []any{dead.OutboxID, op, why} }},
		{"cancel_pending", `SELECT outbox.cancel_pending($1, $2, $3)`, func(op, why string) []any { return []any{queued.OutboxID, op, why} }},
		{"pause_rail", `SELECT outbox.pause_rail('sandbox', $1, $2)`, func(op, why string) []any { return []any{op, why} }},
		{"resume_rail", `SELECT outbox.resume_rail('held', $1, $2)`, func(op, why string) []any { return []any{op, why} }},
		{"resume_rail_shown", `SELECT outbox.resume_rail_shown('held', $1, $2, $3)`, func(op, why string) []any { return []any{pausedAt, op, why} }},
	}
	refusedAs := func(what, code string, err error) {
		t.Helper()
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != code {
			t.Errorf("%s: %v, want a %s refusal", what, err, code)
		}
	}
	for _, c := range calls {
		for name, v := range bad {
			for i, args := range [][2]string{{v, "why"}, {"alice", v}} {
				if err := store.CheckOperator(args[0], args[1]); !errors.Is(err, store.ErrOperatorAction) {
					t.Errorf("store.CheckOperator with %s as the %s: %v, want ErrOperatorAction", name, []string{"name", "reason"}[i], err)
				}
				_, err := operator.Exec(b.ctx, c.sql, c.args(args[0], args[1])...)
				refusedAs(fmt.Sprintf("%s with %s as the %s", c.what, name, []string{"name", "reason"}[i]), "22023", err)
			}
		}
		for name, args := range long {
			if err := store.CheckOperator(args[0], args[1]); !errors.Is(err, store.ErrOperatorAction) {
				t.Errorf("store.CheckOperator with %s: %v, want ErrOperatorAction", name, err)
			}
			_, err := operator.Exec(b.ctx, c.sql, c.args(args[0], args[1])...)
			refusedAs(fmt.Sprintf("%s with %s", c.what, name), "22023", err)
		}
	}
	// A pause names a rail as an instruction does: one Go would refuse is
	// refused (a resume is not: it must end a pause made before).
	for _, rail := range []string{"sand\u202ebox", "sandbox\n", "\u00a0", strings.Repeat("r", 201)} {
		if _, err := b.st.PauseRail(b.ctx, operator, rail, "alice", "why"); !errors.Is(err, store.ErrRailType) {
			t.Errorf("store.PauseRail(%q): %v, want ErrRailType", rail, err)
		}
		_, err := operator.Exec(b.ctx, `SELECT outbox.pause_rail($1, 'alice', 'why')`, rail)
		refusedAs(fmt.Sprintf("pause_rail(%q)", rail), "22023", err)
	}

	// A producer's direct writes: a key row, and the instruction made of it.
	producerAll := b.as(t, "outbox_producer", "*")
	keyCases := map[string][4]string{ // tenant, instruction, key, participant
		"an instruction id with a line feed": {"", "ins\nforged", "k-1", "p-1"},
		"an instruction id of spaces":        {"", "\u2003", "k-2", "p-1"},
		"an instruction id past 200 bytes":   {"", strings.Repeat("i", 201), "k-3", "p-1"},
		"a participant with a bidi override": {"", "ins-4", "k-4", "p\u202e1"},
		"a participant past 200 bytes":       {"", "ins-5", "k-5", strings.Repeat("p", 201)},
		"a key with a zero-width space":      {"", "ins-6", "k\u200b6", "p-1"},
		"a key beyond ASCII":                 {"", "ins-7", "clé", "p-1"},
		"a key ending in a space":            {"", "ins-8", "k-8 ", "p-1"},
		"a key past 200 bytes":               {"", "ins-9", strings.Repeat("k", 201), "p-1"},
		"a tenant with a line separator":     {"t\u2028a", "ins-10", "k-10", "p-1"},
		"the tenant that means every tenant": {"*", "ins-11", "k-11", "p-1"},
		"a tenant of spaces":                 {" ", "ins-12", "k-12", "p-1"},
	}
	for name, k := range keyCases {
		ins := payment.Instruction{TenantID: k[0], InstructionID: k[1], IdempotencyKey: k[2], ParticipantID: k[3], RailType: "event", Metadata: []byte(`{}`)}
		if err := (payment.Event{}).Validate(ins); err == nil {
			t.Errorf("%s: the validators accept it", name)
		}
		_, err := producerAll.Exec(b.ctx, `INSERT INTO outbox.idempotency_keys (tenant_id, instruction_id, idempotency_key, outbox_id, participant_id, payload_hash)
			VALUES ($1, $2, $3, $4, $5, '\x00')`, k[0], k[1], k[2], uuid.Must(uuid.NewV4()), k[3])
		refusedAs("a key row with "+name, "23514", err)
	}
	// An enqueue of a key row that is fine, with a rail type or
	// correlation id Go would refuse.
	for name, rc := range map[string][2]string{
		"a rail type with a line feed":          {"sandbox\n", ""},
		"a rail type of spaces":                 {"\u00a0", ""},
		"a rail type past 200 bytes":            {strings.Repeat("r", 201), ""},
		"a correlation id with a bidi override": {"sandbox", "c\u202e1"},
		"a correlation id past 200 bytes":       {"sandbox", strings.Repeat("c", 201)},
	} {
		id := uuid.Must(uuid.NewV4())
		key := "k-" + id.String()
		if _, err := producer.Exec(b.ctx, `INSERT INTO outbox.idempotency_keys (instruction_id, idempotency_key, outbox_id, participant_id, payload_hash)
			VALUES ($1, $1, $2, 'p-1', '\x00')`, key, id); err != nil {
			t.Fatal(err)
		}
		for _, q := range []string{
			`SELECT outbox.enqueue_pending($1, $2, $3, '{}')`,
			`SELECT outbox.enqueue_pending_batch(ARRAY[$1::uuid], ARRAY[$2::text], ARRAY[$3::text], ARRAY['{}'])`,
		} {
			_, err := producer.Exec(b.ctx, q, id, rc[0], rc[1])
			refusedAs(q+" with "+name, "22023", err)
		}
	}

	// Nothing of it was written.
	var n int
	if err := b.admin.QueryRow(b.ctx, `SELECT (SELECT count(*) FROM outbox.attempts WHERE state IN ('REPLAYED', 'ACKNOWLEDGED', 'CANCELLED'))
		+ (SELECT count(*) FROM outbox.rail_pause_events WHERE action = 'RESUMED' OR rail_type <> 'held')
		+ (SELECT count(*) FROM outbox.dead_letters WHERE acknowledged_at IS NOT NULL)
		+ (SELECT count(*) FROM outbox.idempotency_keys WHERE instruction_id NOT LIKE 'k-%' AND idempotency_key NOT IN ('dead', 'queued'))
		+ (SELECT count(*) FROM outbox.pending WHERE outbox_id <> $1)`, queued.OutboxID).Scan(&n); err != nil || n != 0 {
		t.Errorf("after the refusals: %d rows written (%v), want none", n, err)
	}
}

// TestTextChecksMatchGo: the database's text checks (migration 051) are
// payment.ControlRune, unicode.IsSpace (strings.TrimSpace) and
// payment.ValidateText, code point for code point, so that the last line refuses what Go refuses and
// nothing else: every code point PostgreSQL's text can hold (U+0001 to
// U+10FFFF but the surrogates) is asked of both. A Go release whose
// Unicode tables change fails it: the SQL's classes then need a
// migration.
func TestTextChecksMatchGo(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, f := range []struct {
		sql    string
		goSide func(rune) bool
	}{
		{`SELECT coalesce(array_agg(c ORDER BY c), '{}') FROM generate_series(1, 1114111) c
		  WHERE (c < 55296 OR c > 57343) AND NOT outbox.text_free_of_controls(chr(c))`, payment.ControlRune},
		{`SELECT coalesce(array_agg(c ORDER BY c), '{}') FROM generate_series(1, 1114111) c
		  WHERE (c < 55296 OR c > 57343) AND outbox.text_is_blank(chr(c))`, unicode.IsSpace},
		// One character is an identifier unless Go refuses it either way.
		{`SELECT coalesce(array_agg(c ORDER BY c), '{}') FROM generate_series(1, 1114111) c
		  WHERE (c < 55296 OR c > 57343) AND NOT outbox.text_is_identifier(chr(c), 4)`,
			func(r rune) bool { return payment.ValidateText("id", string(r), 4) != nil }},
	} {
		var got []int32
		if err := b.pool.QueryRow(b.ctx, f.sql).Scan(&got); err != nil {
			t.Fatal(err)
		}
		var want []int32
		for r := rune(1); r <= unicode.MaxRune; r++ {
			if (r < 0xd800 || r > 0xdfff) && f.goSide(r) {
				want = append(want, r)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s\nthe database: %d code points, Go: %d; first differences: %v", f.sql, len(got), len(want), firstDifferences(got, want))
		}
	}
	// Whole strings, as the functions read them.
	for s, want := range map[string][3]bool{ // free of controls, blank, an identifier of at most 8 bytes
		"":                        {true, true, false},
		"alice":                   {true, false, true},
		" \u00a0\u3000 ":          {true, true, false},
		" a ":                     {true, false, true},
		"\u3000a\u00a0":           {true, false, true},
		"a\u202eb":                {false, false, false},
		"a\nb":                    {false, false, false},
		"\t":                      {false, true, false},
		"a\t":                     {false, false, false},
		"日本\U0001F600":            {true, false, false}, // 10 bytes
		"日本":                      {true, false, true},
		"abcdefghi":               {true, false, false},
		"\u200b\u200b\u200b":      {false, false, false}, // not a space: a format character
		"\U000e0001tag\U000e007f": {false, false, false},
	} {
		var free, blank, id bool
		if err := b.pool.QueryRow(b.ctx, `SELECT outbox.text_free_of_controls($1), outbox.text_is_blank($1), outbox.text_is_identifier($1, 8)`, s).Scan(&free, &blank, &id); err != nil {
			t.Fatal(err)
		}
		if free != want[0] || blank != want[1] || id != want[2] {
			t.Errorf("%q: free of controls %v, blank %v, an identifier %v; want %v", s, free, blank, id, want)
		}
		goFree, goBlank, goID := strings.IndexFunc(s, payment.ControlRune) < 0, strings.TrimSpace(s) == "", payment.ValidateText("id", s, 8) == nil
		if goFree != want[0] || goBlank != want[1] || goID != want[2] {
			t.Errorf("%q: Go says free of controls %v, blank %v, an identifier %v; want %v", s, goFree, goBlank, goID, want)
		}
	}
}

// firstDifferences returns up to 10 code points in one list and not the
// other.
func firstDifferences(a, b []int32) []string {
	var d []string
	in := func(s []int32, r int32) bool { _, ok := slices.BinarySearch(s, r); return ok }
	for _, r := range a {
		if !in(b, r) && len(d) < 10 {
			d = append(d, fmt.Sprintf("%U only in the database", r))
		}
	}
	for _, r := range b {
		if !in(a, r) && len(d) < 20 {
			d = append(d, fmt.Sprintf("%U only in Go", r))
		}
	}
	return d
}
