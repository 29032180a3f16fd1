package testdb

import (
	"bytes"
	"encoding/json"
	"reflect"
)

// SameJSON reports whether two JSON documents are the same value (numbers
// compared by their text, so 1.50 and 1.5 differ); absent and empty are
// the same. Round-trip tests compare what went in with what was stored.
func SameJSON(t TB, a, b []byte) bool {
	t.Helper()
	decode := func(raw []byte) any {
		if len(bytes.TrimSpace(raw)) == 0 {
			return nil
		}
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		var v any
		if err := dec.Decode(&v); err != nil {
			t.Fatalf("testdb: %q: %v", raw, err)
		}
		return v
	}
	return reflect.DeepEqual(decode(a), decode(b))
}
