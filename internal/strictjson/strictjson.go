// Package strictjson decodes JSON that comes from outside the process
// (instruction lines on stdin, the relay configuration, webhook request
// and answer bodies) by one set of rules, those of encoding/json/v2
// (github.com/go-json-experiment/json, the module Go's own v2 mirrors):
//
//   - a member name that appears twice in an object, at any depth, is an
//     error (encoding/json keeps the last one, so a gateway that checked the
//     first approved a different payment from the one queued);
//   - names match the documented ones exactly: "AMOUNT_MINOR" is not
//     "amount_minor" but an unknown member, and unknown members are errors;
//   - invalid UTF-8 and lone surrogate escapes are errors (encoding/json
//     replaces them with U+FFFD, so two different keys become one);
//   - anything after the one top-level value is an error.
//
// Every error is an [*Error] naming the offending member.
package strictjson

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/big"
	"reflect"
	"strings"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
)

// Reasons of an [Error].
const (
	ReasonDuplicate   = "duplicate"    // a member name appears twice in one object
	ReasonUnknown     = "unknown"      // a member name the target does not have (names are case-sensitive)
	ReasonInvalidUTF8 = "invalid_utf8" // invalid UTF-8 or a lone surrogate escape
	ReasonType        = "type"         // a value of the wrong JSON kind
	ReasonSyntax      = "syntax"       // not JSON, or trailing data after the value
	ReasonNUL         = "nul"          // a \u0000 in a string (PostgreSQL cannot store it)
	ReasonNumber      = "number"       // a number PostgreSQL's jsonb would refuse or blow up
)

// Error is a decoding error. Pointer is the RFC 6901 JSON pointer of the
// offending member or value ("" for the document), Name its member name
// (the last token of Pointer, "" at the top level).
type Error struct {
	Pointer string
	Name    string
	Reason  string
	// Offset is the byte offset of a syntax error, -1 when unknown.
	Offset int64
	msg    string
	err    error
}

// Error implements error.
func (e *Error) Error() string { return e.msg }

// Unwrap returns the decoder's own error.
func (e *Error) Unwrap() error { return e.err }

// Parent returns the JSON pointer of the object or array holding the
// offending member.
func (e *Error) Parent() string {
	i := strings.LastIndexByte(e.Pointer, '/')
	if i < 0 {
		return ""
	}
	return e.Pointer[:i]
}

// Unmarshal decodes exactly one JSON value from data into v by the
// package's rules, rejecting members v does not have.
func Unmarshal(data []byte, v any) error {
	if err := json.Unmarshal(data, v, json.RejectUnknownMembers(true)); err != nil {
		return translate(err, v)
	}
	return nil
}

// UnmarshalKnown is [Unmarshal] for documents of systems we do not control
// (a rail's answer) that may carry members we do not know: those are
// ignored. Names still match exactly ("REFERENCE" is ignored, never taken
// for "reference"), and a repeated name is still an error.
func UnmarshalKnown(data []byte, v any) error {
	if err := json.Unmarshal(data, v); err != nil {
		return translate(err, v)
	}
	return nil
}

// translate turns the decoder's error into an *Error.
func translate(err error, v any) error {
	var (
		syn *jsontext.SyntacticError
		sem *json.SemanticError
	)
	switch {
	case errors.As(err, &syn):
		e := newError(string(syn.JSONPointer), syn.ByteOffset, err)
		switch {
		case errors.Is(syn.Err, jsontext.ErrDuplicateName):
			e.Reason, e.msg = ReasonDuplicate, fmt.Sprintf("member %q appears more than once", e.Name)
		// The decoder's UTF-8 errors are not exported; the text only picks
		// the message, the document is refused either way.
		case strings.Contains(syn.Err.Error(), "UTF-8") || strings.Contains(syn.Err.Error(), "surrogate"):
			e.Reason, e.msg = ReasonInvalidUTF8, fmt.Sprintf("invalid UTF-8 in %s", where(e))
		default:
			e.Reason, e.msg = ReasonSyntax, fmt.Sprintf("not valid JSON at byte %d: %v", syn.ByteOffset, syn.Err)
		}
		return e
	case errors.As(err, &sem):
		e := newError(string(sem.JSONPointer), sem.ByteOffset, err)
		if errors.Is(sem.Err, json.ErrUnknownName) {
			e.Reason, e.msg = ReasonUnknown, fmt.Sprintf("unknown member %q", e.Name)
			if known := caseTwin(v, e); known != "" {
				e.msg += fmt.Sprintf(" (names are case-sensitive: the member is %q)", known)
			}
			return e
		}
		e.Reason = ReasonType
		e.msg = fmt.Sprintf("want %s, got a JSON %s", kindOf(sem.GoType), jsonKind(sem.JSONKind))
		if e.Name != "" {
			e.msg = e.Name + ": " + e.msg
		}
		return e
	}
	e := newError("", -1, err)
	e.Reason, e.msg = ReasonSyntax, "not valid JSON: "+err.Error()
	return e
}

func newError(pointer string, offset int64, err error) *Error {
	e := &Error{Pointer: pointer, Offset: offset, err: err}
	if i := strings.LastIndexByte(pointer, '/'); i >= 0 {
		e.Name = unescapePointer(pointer[i+1:])
	}
	return e
}

func unescapePointer(tok string) string {
	return strings.NewReplacer("~1", "/", "~0", "~").Replace(tok)
}

// where names the offending value for a message.
func where(e *Error) string {
	if e.Name == "" {
		return "the document"
	}
	return fmt.Sprintf("%q", e.Name)
}

// caseTwin returns the member of the struct v targets at the error's
// level whose name differs from the offending one only in letter case.
func caseTwin(v any, e *Error) string {
	if e.Parent() != "" {
		return ""
	}
	t := reflect.TypeOf(v)
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil || t.Kind() != reflect.Struct {
		return ""
	}
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name != "" && name != e.Name && strings.EqualFold(name, e.Name) {
			return name
		}
	}
	return ""
}

func kindOf(t reflect.Type) string {
	if t == nil {
		return "a value"
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a non-negative integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Map, reflect.Struct:
		return "an object"
	}
	return t.String()
}

func jsonKind(k jsontext.Kind) string {
	switch k {
	case 'n':
		return "null"
	case 'f', 't':
		return "boolean"
	case '"':
		return "string"
	case '0':
		return "number"
	case '{':
		return "object"
	case '[':
		return "array"
	}
	return "value"
}

// Number limits of [CheckStorable]: the most significant digit of a
// non-zero number stands below 10^maxExponent and its least significant
// digit at or above 10^-maxExponent. PostgreSQL's numeric accepts far more
// (131072 digits before the point, 16383 after), but stores 1e131071 in
// jsonb as 128 KiB of digits: a ten-byte input must not become that.
const maxExponent = 1000

// CheckStorable checks a JSON document from outside by the package's rules
// and for what PostgreSQL's jsonb would refuse or inflate: a \u0000 in a
// string (SQLSTATE 22P05, after the rows around it were sent) and numbers
// beyond ±10^1000 or finer than 10^-1000. It reads the document without
// decoding it into anything.
func CheckStorable(data []byte) error {
	dec := jsontext.NewDecoder(bytes.NewReader(data))
	for values := 0; ; {
		tok, err := dec.ReadToken()
		if errors.Is(err, io.EOF) && values == 1 {
			return nil
		}
		if err == nil && dec.StackDepth() == 0 {
			values++ // a top-level value ended
		}
		if err == nil && values > 1 || errors.Is(err, io.EOF) {
			e := newError("", dec.InputOffset(), err)
			e.Reason, e.msg = ReasonSyntax, "not one JSON value (empty, or more than one)"
			return e
		}
		if err != nil {
			return translate(err, nil)
		}
		switch tok.Kind() {
		case '"':
			if strings.IndexByte(tok.String(), 0) >= 0 {
				e := newError(string(dec.StackPointer()), dec.InputOffset(), nil)
				e.Reason, e.msg = ReasonNUL, fmt.Sprintf("a \\u0000 in %s: PostgreSQL cannot store it", where(e))
				return e
			}
		case '0':
			if !storableNumber(tok.String()) {
				e := newError(string(dec.StackPointer()), dec.InputOffset(), nil)
				e.Reason, e.msg = ReasonNumber, fmt.Sprintf("number %.40s in %s is beyond ±1e%d or finer than 1e-%d", tok.String(), where(e), maxExponent, maxExponent)
				return e
			}
		}
	}
}

// storableNumber reports whether a JSON number (valid syntax) is zero or
// has its significant digits within ±maxExponent decimal places.
func storableNumber(s string) bool {
	mant, exp, _ := strings.Cut(strings.ToLower(s), "e")
	mant = strings.TrimPrefix(mant, "-")
	intPart, frac, _ := strings.Cut(mant, ".")
	digits := strings.TrimLeft(intPart+frac, "0")
	if digits == "" {
		return true // zero, whatever the exponent
	}
	e := new(big.Int)
	if exp != "" {
		if _, ok := e.SetString(strings.TrimPrefix(exp, "+"), 10); !ok {
			return false
		}
	}
	// Value = 0.digits... shifted: the most significant digit of intPart+frac
	// stands at 10^(len(intPart)-1 - leading zeros) before the exponent.
	lead := len(intPart+frac) - len(digits)
	msd := new(big.Int).Add(e, big.NewInt(int64(len(intPart)-1-lead)))
	lsd := new(big.Int).Add(e, big.NewInt(int64(-len(frac))))
	// Trailing zeros of the digits do not count as precision.
	lsd.Add(lsd, big.NewInt(int64(len(digits)-len(strings.TrimRight(digits, "0")))))
	return msd.Cmp(big.NewInt(maxExponent)) < 0 && lsd.Cmp(big.NewInt(-maxExponent)) >= 0
}
