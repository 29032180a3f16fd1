package main

import (
	"encoding/json"
	"testing"
)

// TestEnqueueUnstorableNumberDoesNotSinkItsBatch guards --batch against a
// metadata number jsonb cannot store (0e-20000: a display scale above
// numeric's 16383): it is refused up front as a validation error of its
// line, and the 9 good lines of the same batch are enqueued (PostgreSQL
// used to refuse the whole batch with SQLSTATE 22003).
func TestEnqueueUnstorableNumberDoesNotSinkItsBatch(t *testing.T) {
	t.Parallel()
	badMetadataDoesNotSinkItsBatch(t, map[string]any{"n": json.Number("0e-20000")})
}
