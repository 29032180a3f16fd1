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

// Number limits of [CheckStorable], on a number as PostgreSQL stores it
// in jsonb (a numeric, written back in full: 1e3 as 1000, 0e-3 as 0.000):
// at most maxIntDigits digits before the decimal point and maxScale after
// it. numeric's own limits are far wider (a 14-bit display scale, so 16383
// digits after the point, and an int16 weight in base-10000 digits, so
// 131072 before it), and a number beyond them fails the INSERT with
// SQLSTATE 22003 after the statement was sent, aborting the caller's
// transaction. Within them, a ten-byte 1e131071 is stored as 128 KiB of
// digits: the tighter bound keeps one number's growth small, and
// [StoredSize] lets a payload limit count what is stored.
const (
	maxIntDigits = 1000
	maxScale     = 1000
	// pgMaxExponent is the largest exponent magnitude numeric's input
	// takes, whatever the digits: PostgreSQL 15 refuses 2^30-1 and above
	// (PG_INT32_MAX/2), even on zero.
	pgMaxExponent = 1<<30 - 2
)

// CheckStorable checks a JSON document from outside by the package's rules
// and for what PostgreSQL's jsonb would refuse or inflate: a \u0000 in a
// string (SQLSTATE 22P05, after the rows around it were sent) and numbers
// that, written out in full as numeric stores them, have more than 1000
// digits before or after the decimal point (trailing zeros and the zeros
// of 0e-20 count: numeric keeps them). It reads the document without
// decoding it into anything.
func CheckStorable(data []byte) error {
	_, err := StoredSize(data)
	return err
}

// StoredSize checks data as [CheckStorable] does and returns its length
// once PostgreSQL's jsonb stores it and writes it back as text: every
// number written out in full (1e3 becomes 1000, 0e-3 0.000, -0 0), one
// space after every ',' and ':' and no other whitespace (jsonb's text
// form), strings as in data (jsonb writes an escape no longer than the
// input's). A size limit checked on it holds for what is stored and read
// back, which a limit on the input's length does not: 4,000 copies of
// 0e-1000 are 40 KB of input and 4 MB of stored digits, and 64 KiB of a
// compact [1,1,...] is 96 KiB read back.
func StoredSize(data []byte) (int, error) {
	size := TextFormLength(data)
	dec := jsontext.NewDecoder(bytes.NewReader(data))
	for values := 0; ; {
		tok, err := dec.ReadToken()
		if errors.Is(err, io.EOF) && values == 1 {
			return size, nil
		}
		if err == nil && dec.StackDepth() == 0 {
			values++ // a top-level value ended
		}
		if err == nil && values > 1 || errors.Is(err, io.EOF) {
			e := newError("", dec.InputOffset(), err)
			e.Reason, e.msg = ReasonSyntax, "not one JSON value (empty, or more than one)"
			return 0, e
		}
		if err != nil {
			return 0, translate(err, nil)
		}
		switch tok.Kind() {
		case '"':
			if strings.IndexByte(tok.String(), 0) >= 0 {
				e := newError(string(dec.StackPointer()), dec.InputOffset(), nil)
				e.Reason, e.msg = ReasonNUL, fmt.Sprintf("a \\u0000 in %s: PostgreSQL cannot store it", where(e))
				return 0, e
			}
		case '0':
			s := tok.String()
			n, why := storedNumber(s)
			if why != "" {
				e := newError(string(dec.StackPointer()), dec.InputOffset(), nil)
				e.Reason, e.msg = ReasonNumber, fmt.Sprintf("number %.40s in %s: %s", s, where(e), why)
				return 0, e
			}
			size += int(n) - len(s)
		}
	}
}

// TextFormLength is the length of a valid JSON document with jsonb's
// spacing, its numbers as given: the whitespace between tokens dropped,
// one space added after every ',' and ':' outside strings. A byte scan,
// without decoding: for a document whose numbers need no rewriting (Go's
// encoding/json writes them in full), it is [StoredSize] at a fraction of
// the cost.
func TextFormLength(data []byte) int {
	n := len(data)
	inString, escaped := false, false
	for _, c := range data {
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == ',' || c == ':':
			n++
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			n--
		}
	}
	return n
}

// storedNumber returns the length of a JSON number (valid syntax) as
// PostgreSQL's numeric stores and writes it back, or why it is refused.
// It follows numeric's input: the display scale is the count of digits
// after the point, trailing zeros included, less the exponent, never below
// 0, and for zero too (0e-5 is 0.00000); leading zeros are dropped, and
// zero loses its sign. Arithmetic is in int64: a scale can pass 2^31.
func storedNumber(s string) (int64, string) {
	mant, exp, hasExp := strings.Cut(s, "e")
	if !hasExp {
		mant, exp, _ = strings.Cut(s, "E")
	}
	neg := strings.HasPrefix(mant, "-")
	mant = strings.TrimPrefix(mant, "-")
	intPart, frac, _ := strings.Cut(mant, ".")

	var e int64
	if exp != "" {
		digits := strings.TrimLeft(strings.TrimLeft(exp, "+-"), "0")
		if len(digits) > 10 { // beyond pgMaxExponent whatever they are
			return 0, "its exponent is beyond what PostgreSQL accepts"
		}
		for _, c := range digits {
			e = e*10 + int64(c-'0')
		}
		if e > pgMaxExponent {
			return 0, "its exponent is beyond what PostgreSQL accepts"
		}
		if exp[0] == '-' {
			e = -e
		}
	}

	scale := max(int64(len(frac))-e, 0)
	intDigits := int64(1) // zero, or a value below 1, is written with one 0
	lead := len(intPart+frac) - len(strings.TrimLeft(intPart+frac, "0"))
	zero := lead == len(intPart+frac)
	if !zero {
		// The most significant digit stands at 10^msd.
		msd := int64(len(intPart)-1-lead) + e
		intDigits = max(msd+1, 1)
	}
	if scale > maxScale || intDigits > maxIntDigits {
		return 0, fmt.Sprintf("written out in full, as PostgreSQL stores it, it has more than %d digits before or %d after the decimal point", maxIntDigits, maxScale)
	}
	n := intDigits
	if scale > 0 {
		n += 1 + scale // the point and the digits after it
	}
	if neg && !zero {
		n++
	}
	return n, ""
}

// StoredNumber returns a JSON number (valid syntax, storable by
// [CheckStorable]'s rules) as PostgreSQL's numeric stores it in jsonb and
// writes it back: in full, without exponent or leading zeros, with as many
// digits after the point as the input's display scale (1e2 is 100, 1.5E+1
// 15, 1.0 1.0, 0e-2 0.00, -0 0). Two numbers jsonb stores alike return the
// same text, so a hash over it does not tell them apart; [StoredSize]'s
// count is its length.
func StoredNumber(s string) (string, error) {
	if _, why := storedNumber(s); why != "" {
		e := newError("", -1, nil)
		e.Reason, e.msg = ReasonNumber, fmt.Sprintf("number %.40s: %s", s, why)
		return "", e
	}
	mant, exp, hasExp := strings.Cut(s, "e")
	if !hasExp {
		mant, exp, _ = strings.Cut(s, "E")
	}
	neg := strings.HasPrefix(mant, "-")
	mant = strings.TrimPrefix(mant, "-")
	intPart, frac, _ := strings.Cut(mant, ".")
	var e int
	if exp != "" { // within pgMaxExponent, storedNumber checked
		for _, c := range strings.TrimLeft(exp, "+-") {
			e = e*10 + int(c-'0')
		}
		if exp[0] == '-' {
			e = -e
		}
	}
	// The digits with the point after the first point digits of them;
	// the display scale is what stands after it (never below 0).
	digits, point := intPart+frac, len(intPart)+e
	if strings.Trim(digits, "0") == "" {
		// Zero, whatever its exponent (0e1000000000 is 0, and must not
		// be written out digit by digit first): its scale only, which
		// storedNumber bounded.
		if scale := len(frac) - e; scale > 0 {
			return "0." + strings.Repeat("0", scale), nil
		}
		return "0", nil
	}
	// Not zero: storedNumber bounded the digits before the point, so
	// the padding is at most those and the input's leading zeros.
	if point < 0 {
		digits, point = strings.Repeat("0", -point)+digits, 0
	}
	if point > len(digits) {
		digits += strings.Repeat("0", point-len(digits))
	}
	whole := strings.TrimLeft(digits[:point], "0")
	if whole == "" {
		whole = "0"
	}
	out := whole
	if point < len(digits) {
		out += "." + digits[point:]
	}
	if neg {
		out = "-" + out
	}
	return out, nil
}

// NumbersInFull returns data, a valid JSON document, with every number
// written as [StoredNumber] writes it and everything else as it was, and
// whether any number changed (when none did, data itself is returned).
func NumbersInFull(data []byte) ([]byte, bool, error) {
	var out []byte
	last := 0 // data[last:] is not in out yet
	inString, escaped := false, false
	for i := 0; i < len(data); i++ {
		c := data[i]
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
			continue
		case c == '"':
			inString = true
			continue
		case c != '-' && (c < '0' || c > '9'):
			continue
		}
		end := i
		for end < len(data) && strings.IndexByte("0123456789.eE+-", data[end]) >= 0 {
			end++
		}
		if plain := data[i:end]; !bytes.ContainsAny(plain, ".eE") && string(plain) != "-0" {
			// An integer (JSON has no leading zeros) is stored as
			// written: every payload's amount_minor.
			i = end - 1
			continue
		}
		lit := string(data[i:end])
		full, err := StoredNumber(lit)
		if err != nil {
			return nil, false, err
		}
		if full != lit {
			out = append(append(out, data[last:i]...), full...)
			last = end
		}
		i = end - 1
	}
	if out == nil {
		return data, false, nil
	}
	return append(out, data[last:]...), true, nil
}
