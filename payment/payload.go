package payment

import (
	"errors"
	"math"
	"unicode/utf8"

	"github.com/ledgerline/outbox/internal/strictjson"
)

// DecodePayload decodes a stored payload into a Payload, strictly: member
// names match exactly, and a member that is not a payload field, or one
// named twice, is refused (a row edited by hand must not pay the amount of
// "AMOUNT_minor", or the second of two amounts). Every error is a
// [*ValidationError] on [FieldPayload] naming the member at fault.
//
// A relayer decodes one at every dispatch, and the common payload, a
// payment without metadata, is read without reflection: in `outbox bench`,
// decoding and its allocations were about a tenth of the relayer's
// processor time per instruction. Any other form (metadata, escapes in a
// string, a member that is not a payment field, a repeated one, a number
// that is not a plain integer) goes to the strict decoder, whose result
// the fast path's always equals (FuzzDecodePayload compares the two).
func DecodePayload(data []byte) (Payload, error) {
	if p, ok := decodePlainPayload(data); ok {
		return p, nil
	}
	var p Payload
	if err := strictjson.Unmarshal(data, &p); err != nil {
		reason := ReasonInvalid
		if e := (*strictjson.Error)(nil); errors.As(err, &e) && (e.Reason == strictjson.ReasonUnknown || e.Reason == strictjson.ReasonDuplicate) {
			reason = ReasonNotAllowed
		}
		return Payload{}, Invalid(FieldPayload, reason, "%v", err)
	}
	return p, nil
}

// decodePlainPayload reads a JSON object whose members are amount_minor
// (an integer without fraction or exponent), currency and destination
// (strings of printable UTF-8 without escapes), each at most once, as
// PostgreSQL writes a jsonb payload back. It reports false for anything
// else, which the caller leaves to the strict decoder.
func decodePlainPayload(data []byte) (Payload, bool) {
	var (
		p    Payload
		seen [3]bool
	)
	i := skipSpace(data, 0)
	if i == len(data) || data[i] != '{' {
		return p, false
	}
	i = skipSpace(data, i+1)
	if i < len(data) && data[i] == '}' {
		return p, skipSpace(data, i+1) == len(data)
	}
	for {
		key, next, ok := plainString(data, i)
		if !ok {
			return p, false
		}
		i = skipSpace(data, next)
		if i == len(data) || data[i] != ':' {
			return p, false
		}
		i = skipSpace(data, i+1)
		var field int
		switch string(key) {
		case "amount_minor":
			field = 0
			p.AmountMinor, i, ok = plainInt(data, i)
		case "currency":
			field = 1
			p.Currency, i, ok = plainText(data, i)
		case "destination":
			field = 2
			p.Destination, i, ok = plainText(data, i)
		default:
			return p, false
		}
		if !ok || seen[field] {
			return p, false
		}
		seen[field] = true
		i = skipSpace(data, i)
		if i == len(data) {
			return p, false
		}
		switch data[i] {
		case ',':
			i = skipSpace(data, i+1)
		case '}':
			return p, skipSpace(data, i+1) == len(data)
		default:
			return p, false
		}
	}
}

// skipSpace returns the index of the first byte at or after i that is not
// JSON whitespace.
func skipSpace(data []byte, i int) int {
	for i < len(data) && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r') {
		i++
	}
	return i
}

// plainString reads a JSON string at i that needs no unescaping: valid
// UTF-8 without control characters, quotes or backslashes inside. It
// returns the string's bytes and the index after its closing quote.
func plainString(data []byte, i int) ([]byte, int, bool) {
	if i == len(data) || data[i] != '"' {
		return nil, i, false
	}
	start := i + 1
	for j := start; j < len(data); j++ {
		switch c := data[j]; {
		case c == '"':
			s := data[start:j]
			return s, j + 1, utf8.Valid(s)
		case c < 0x20 || c == '\\':
			return nil, j, false
		}
	}
	return nil, len(data), false
}

// plainText is plainString's string, as a Go string.
func plainText(data []byte, i int) (string, int, bool) {
	s, next, ok := plainString(data, i)
	return string(s), next, ok
}

// plainInt reads a JSON integer at i (no fraction, no exponent, no leading
// zeros) that fits an int64, and returns it and the index after it.
func plainInt(data []byte, i int) (int64, int, bool) {
	j := i
	if j < len(data) && data[j] == '-' {
		j++
	}
	digits := j
	for j < len(data) && data[j] >= '0' && data[j] <= '9' {
		j++
	}
	switch {
	case j == digits, j-digits > 1 && data[digits] == '0', j-digits > 19:
		return 0, j, false
	case j < len(data) && (data[j] == '.' || data[j] == 'e' || data[j] == 'E'):
		return 0, j, false
	}
	var u uint64 // 19 digits fit
	for _, c := range data[digits:j] {
		u = u*10 + uint64(c-'0')
	}
	if digits > i { // negative
		if u > 1<<63 {
			return 0, j, false
		}
		return int64(-u), j, true
	}
	if u > math.MaxInt64 {
		return 0, j, false
	}
	return int64(u), j, true
}
