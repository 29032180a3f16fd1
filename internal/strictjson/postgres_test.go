package strictjson_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ledgerline/outbox/internal/strictjson"
	"github.com/ledgerline/outbox/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// TestNumbersAgreeWithPostgreSQL guards the number rules against the real
// jsonb: every edge number CheckStorable accepts inserts, and is stored
// exactly as long as StoredSize says and as StoredNumber writes it; every one it refuses is one
// PostgreSQL refuses (value overflows numeric format, after the statement
// was sent) or stores with more than 1000 digits before or after the point.
func TestNumbersAgreeWithPostgreSQL(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := t.Context()
	if _, err := pool.Exec(ctx, `CREATE TABLE numbers (j jsonb)`); err != nil {
		t.Fatal(err)
	}
	zeros := strings.Repeat("0", 16383)
	for _, n := range []string{
		"0", "-0", "-0.0", "0.00e-2", "0e-1000", "0.0e-999", "0e-1001", "0e-16383", "0e-16384", "0e-20000",
		"0e99999", "0e1073741822", "0e1073741823", "0e-1073741822", "1e2000000000",
		"1e999", "1e1000", "-9.99e999", "0.0001e1003", "0.0001e1004", "1e131071", "1e131072", "0.0001e131075",
		"1e-1000", "-1e-1000", "1e-1001", "1.0e-1000", "1000e-1000", "1000e-1003", "1.5e-1000", "1E+2", "1e+0002",
		"123.456e2", "-0.05e1", "1.5E+1", "15e-3", "-1.2e2", "0e-2", "-0.00", "100e0", "0.0150e0", "-0e5", "12345678901234567890123", "0.000000000000000000001", "5e-324",
		"1.7976931348623157e308", "1." + zeros[:1000], "1." + zeros[:1001], "1." + zeros, "1." + zeros + "0",
		"1" + zeros[:999], "1" + zeros[:1000],
	} {
		doc := `[` + n + `]`
		size, checkErr := strictjson.StoredSize([]byte(doc))
		full, fullErr := strictjson.StoredNumber(n)
		if (fullErr == nil) != (checkErr == nil) {
			t.Errorf("%.40s: StoredNumber says %v, StoredSize %v", n, fullErr, checkErr)
		}
		var stored int
		var text string
		err := pool.QueryRow(ctx, `INSERT INTO numbers VALUES ($1::jsonb) RETURNING octet_length(j::text), (j->0)::text`, doc).Scan(&stored, &text)
		var pgErr *pgconn.PgError
		switch {
		case checkErr == nil && err != nil:
			t.Errorf("%.40s: accepted, PostgreSQL refuses it: %v", n, err)
		case checkErr == nil && stored != size:
			t.Errorf("%.40s: StoredSize %d, PostgreSQL stores %d bytes", n, size, stored)
		case checkErr == nil && full != text:
			t.Errorf("%.40s: StoredNumber %.60s, PostgreSQL stores %.60s", n, full, text)
		case checkErr != nil && err != nil && !(errors.As(err, &pgErr) && pgErr.Code == "22003"):
			t.Errorf("%.40s: PostgreSQL refuses it with an unexpected error: %v", n, err)
		case checkErr != nil && err == nil:
			// Refused though storable: only for being too long written out.
			var text string
			if err := pool.QueryRow(ctx, `SELECT ($1::jsonb ->> 0)`, doc).Scan(&text); err != nil {
				t.Fatal(err)
			}
			intPart, frac, _ := strings.Cut(strings.TrimPrefix(text, "-"), ".")
			if len(intPart) <= strictjson.MaxIntDigits && len(frac) <= strictjson.MaxScale {
				t.Errorf("%.40s: refused (%v), PostgreSQL stores it as %d+%d digits", n, checkErr, len(intPart), len(frac))
			}
		}
		var e *strictjson.Error
		if checkErr != nil && (!errors.As(checkErr, &e) || e.Reason != strictjson.ReasonNumber) {
			t.Errorf("%.40s: %v, want a %s error", n, checkErr, strictjson.ReasonNumber)
		}
	}
}

// TestTextFormAgreesWithPostgreSQL guards the spacing StoredSize counts
// against the real jsonb: a document is read back with one space after
// every ',' and ':' and no other whitespace, so StoredSize is its length
// read back, and never less where jsonb rewrites an escape shorter.
func TestTextFormAgreesWithPostgreSQL(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	ctx := t.Context()
	for doc, exact := range map[string]bool{
		`{"a":[1,2,3],"b":{}}`:                 true,
		" [ 1 ,\n{ \"k\" :\t[ ] } ]\r\n":       true,
		`{"s":"a , b : c","t":"\\\" , :"}`:     true,
		`{"bb":1,"a":[true,false,null],"c":2}`: true,
		`[[[[1e2,0e-3,-0]]]]`:                  true,
		`{"u":"\u00e9","v":"\/"}`:              false,
		`{"h":"\u003c&\u003e"}`:                false,
	} {
		size, err := strictjson.StoredSize([]byte(doc))
		if err != nil {
			t.Fatalf("%q: %v", doc, err)
		}
		var stored int
		if err := pool.QueryRow(ctx, `SELECT octet_length($1::jsonb::text)`, doc).Scan(&stored); err != nil {
			t.Fatal(err)
		}
		if size < stored || exact && size != stored {
			t.Errorf("%q: StoredSize %d, PostgreSQL writes back %d bytes", doc, size, stored)
		}
	}
}
