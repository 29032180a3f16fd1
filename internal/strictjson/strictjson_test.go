package strictjson

import (
	stdjson "encoding/json"
	"errors"
	"runtime"
	"strings"
	"testing"
)

type target struct {
	ID     string             `json:"instruction_id"`
	Amount int64              `json:"amount_minor"`
	Meta   stdjson.RawMessage `json:"metadata"`
}

func TestUnmarshalRules(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		in, reason, name, msg string
	}{
		{`{"instruction_id":"a","amount_minor":1}`, "", "", ""},
		{`{"amount_minor":100,"AMOUNT_MINOR":99999999}`, ReasonUnknown, "AMOUNT_MINOR", `the member is "amount_minor"`},
		{`{"instruction_id":"a","instruction_id":"b"}`, ReasonDuplicate, "instruction_id", "more than once"},
		{`{"Instruction_ID":"a"}`, ReasonUnknown, "Instruction_ID", "case-sensitive"},
		{"{\"instruction_id\":\"key-\xff\"}", ReasonInvalidUTF8, "instruction_id", "UTF-8"},
		{`{"instruction_id":"\udcff"}`, ReasonInvalidUTF8, "instruction_id", "UTF-8"},
		{`{"instruction_id":"a"} {"instruction_id":"b"}`, ReasonSyntax, "", "JSON"},
		{`{"metadata":{"a":1,"a":2}}`, ReasonDuplicate, "a", "more than once"},
		{`{"amount_minor":"100"}`, ReasonType, "amount_minor", "want an integer, got a JSON string"},
		{`{"instruction_id":`, ReasonSyntax, "instruction_id", "JSON"},
	} {
		var v target
		err := Unmarshal([]byte(tt.in), &v)
		if tt.reason == "" {
			if err != nil {
				t.Errorf("%s: %v", tt.in, err)
			}
			continue
		}
		var e *Error
		if !errors.As(err, &e) || e.Reason != tt.reason || e.Name != tt.name || !strings.Contains(e.Error(), tt.msg) {
			t.Errorf("%q: got %#v (%v), want reason %s naming %q with %q", tt.in, e, err, tt.reason, tt.name, tt.msg)
		}
	}
}

func TestCheckStorable(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		in     string
		reason string
	}{
		{`{"a":1,"b":[1.5,"x",{"c":null}],"d":12345678901234567890123}`, ""},
		{`{"a":1e999,"b":1e-1000,"c":0e99999,"d":-9.99e999,"e":1000e-1000,"f":0e-1000,"g":0.0e-999}`, ""},
		{`{"a":"x\u0000y"}`, ReasonNUL},
		{`{"x\u0000":1}`, ReasonNUL},
		{`{"a":1e1000}`, ReasonNumber},
		{`{"a":1e-1001}`, ReasonNumber},
		{`{"a":0.0001e131075}`, ReasonNumber},
		{`{"a":1.5e-1000}`, ReasonNumber},
		// numeric keeps trailing zeros and the zeros of a zero's exponent
		// in its display scale: these store more than 1000 digits after
		// the point (the first three more than numeric's 16383 at all).
		{`{"a":0e-20000}`, ReasonNumber},
		{`{"a":1.` + strings.Repeat("0", 16400) + `}`, ReasonNumber},
		{`{"a":0e-1073741822}`, ReasonNumber},
		{`{"a":0e-1001}`, ReasonNumber},
		{`{"a":1000e-1003}`, ReasonNumber},
		{`{"a":1.0e-1000}`, ReasonNumber},
		{`{"a":0e1073741823}`, ReasonNumber},
		{`{"a":1e99999999999999999999}`, ReasonNumber},
		{`{"a":1,"a":2}`, ReasonDuplicate},
		{"{\"a\":\"\xfe\"}", ReasonInvalidUTF8},
		{`{} {}`, ReasonSyntax},
		{``, ReasonSyntax},
		{`{"a":`, ReasonSyntax},
	} {
		err := CheckStorable([]byte(tt.in))
		var e *Error
		switch {
		case tt.reason == "" && err != nil:
			t.Errorf("%q: %v", tt.in, err)
		case tt.reason != "" && (!errors.As(err, &e) || e.Reason != tt.reason):
			t.Errorf("%q: got %v, want reason %s", tt.in, err, tt.reason)
		}
	}
}

// TestStoredSize guards the size a payload limit counts: numbers as
// numeric writes them back in full, the rest of the document as given.
func TestStoredSize(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		in   string
		want int // stored length of the number alone
	}{
		{`0`, 1}, {`-0`, 1}, {`-0.0`, 3}, {`0e-3`, 5}, {`-0e-3`, 5}, {`0.00e-2`, 6}, {`0e99999`, 1},
		{`1e3`, 4}, {`-1E+3`, 5}, {`1e0003`, 4}, {`123.456e2`, 7}, {`0.5`, 3}, {`-0.05e1`, 4},
		{`1000e-1000`, 1002}, {`1e-1000`, 1002}, {`9.99e999`, 1000}, {`0.0001e1003`, 1000},
	} {
		got, err := StoredSize([]byte(`[` + tt.in + `]`))
		if err != nil || got-2 != tt.want {
			t.Errorf("StoredSize([%s]) = %d, %v; want %d", tt.in, got, err, tt.want+2)
		}
	}
	doc := `{"a": [1e3, "1e3"], "b": 0e-5}` // 1000 and 0.00000: 1+3 bytes more
	if got, err := StoredSize([]byte(doc)); err != nil || got != len(doc)+4 {
		t.Errorf("StoredSize(%s) = %d, %v; want %d", doc, got, err, len(doc)+4)
	}
	// jsonb's text form puts one space after every ',' and ':' and none
	// elsewhere, whatever the input had: compact input grows by one byte
	// a separator (a payload limit on the compact form let 64 KiB of
	// [1,1,...] be stored and read back as 96 KiB), and spaces of the
	// input that jsonb drops do not count. Each want is what PostgreSQL
	// 15 writes back for the input (SELECT octet_length($1::jsonb::text)).
	for in, want := range map[string]string{
		`{"a":[1,2,3],"b":{}}`:           `{"a": [1, 2, 3], "b": {}}`,
		`[1,[2,[3,[]]],{"k":"v,:"}]`:     `[1, [2, [3, []]], {"k": "v,:"}]`,
		" {\n  \"a\" :\t[ 1 ,2 ] \r\n} ": `{"a": [1, 2]}`,
		`{"s":"a , b : c"}`:              `{"s": "a , b : c"}`,
		`{"e":"\\\" ,"}`:                 `{"e": "\\\" ,"}`,
		`[1e3,0e-2]`:                     `[1000, 0.00]`,
		`"x"`:                            `"x"`,
		`{}`:                             `{}`,
	} {
		if got, err := StoredSize([]byte(in)); err != nil || got != len(want) {
			t.Errorf("StoredSize(%s) = %d, %v; want %d, the length of %s", in, got, err, len(want), want)
		}
	}
}

// TestNumbersInFull: numbers are rewritten as jsonb stores them, and
// nothing else changes, digits and escapes inside strings included.
func TestNumbersInFull(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		`{"a":1,"b":"1e2"}`:                   ``,
		`{"a":1e2,"b":"1e2 \"3e4\" -0"}`:      `{"a":100,"b":"1e2 \"3e4\" -0"}`,
		`[ -0 , 0e-2,1.5E+1,true,null,-12e1]`: `[ 0 , 0.00,15,true,null,-120]`,
		`{"\\":[15e-3],"x\"1e2":{"y":-0.0}}`:  `{"\\":[0.015],"x\"1e2":{"y":0.0}}`,
	} {
		got, changed, err := NumbersInFull([]byte(in))
		if want == "" {
			want = in
		}
		if err != nil || string(got) != want || changed != (want != in) {
			t.Errorf("%s: %s, changed %v, %v; want %s", in, got, changed, err, want)
		}
	}
}

// FuzzNumbersInFull: for any storable document, the rewrite is valid JSON
// of the same stored size whose numbers need no further rewriting.
func FuzzNumbersInFull(f *testing.F) {
	for _, s := range []string{`{"a":[1e2,-0,0e-3,"1e2"]}`, `1.5E+1`, `"\"1\""`, `[0.0150e0,-12e1,1e-1000]`, `[0e100010000,0.00e-998]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		size, err := StoredSize(data)
		if err != nil {
			return
		}
		full, changed, err := NumbersInFull(data)
		if err != nil {
			t.Fatalf("%s: storable, but %v", data, err)
		}
		if !stdjson.Valid(full) {
			t.Fatalf("%s: rewritten to invalid JSON %s", data, full)
		}
		if got, _ := StoredSize(full); got != size || TextFormLength(full) != size {
			t.Fatalf("%s: stored size %d, rewritten %s stores %d (text form %d)", data, size, full, got, TextFormLength(full))
		}
		if again, more, _ := NumbersInFull(full); more || string(again) != string(full) {
			t.Fatalf("%s: rewritten %s is rewritten again to %s", data, full, again)
		}
		if !changed && string(full) != string(data) {
			t.Fatalf("%s: unchanged, but %s", data, full)
		}
	})
}

// TestStoredNumberOfZeroAllocatesLittle: zero with a huge exponent is
// stored as 0 (numeric accepts exponents up to about 10^9): it must not
// be written out digit by digit first, a gigabyte for a 14-byte
// 0e1073741822 in an instruction's metadata.
func TestStoredNumberOfZeroAllocatesLittle(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"0e1073741822": "0", "-0.00e1": "0.0", "0.0e-3": "0.0000", "0.000e100010000": "0",
	} {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		got, err := StoredNumber(in)
		runtime.ReadMemStats(&after)
		if err != nil || got != want {
			t.Errorf("%s: %q, %v; want %q", in, got, err, want)
		}
		if n := after.TotalAlloc - before.TotalAlloc; n > 1<<20 {
			t.Errorf("%s: allocated %d bytes", in, n)
		}
	}
	got, changed, err := NumbersInFull([]byte(`[0e1073741822,-0.00e1,0.0e-3]`))
	if err != nil || !changed || string(got) != `[0,0.0,0.0000]` {
		t.Errorf("NumbersInFull: %s, %v, %v", got, changed, err)
	}
}
