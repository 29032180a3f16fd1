package strictjson

import (
	stdjson "encoding/json"
	"errors"
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
		{`{"a":1e999,"b":1e-1000,"c":0e99999,"d":-9.99e999,"e":1000e-1003}`, ""},
		{`{"a":"x\u0000y"}`, ReasonNUL},
		{`{"x\u0000":1}`, ReasonNUL},
		{`{"a":1e1000}`, ReasonNumber},
		{`{"a":1e-1001}`, ReasonNumber},
		{`{"a":0.0001e131075}`, ReasonNumber},
		{`{"a":1.5e-1000}`, ReasonNumber},
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
