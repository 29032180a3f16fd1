package store

import "github.com/gofrs/uuid/v5"

// UUIDs cross the wire as [16]byte, which pgx encodes and decodes in
// binary directly. A uuid.UUID is a driver.Valuer and sql.Scanner, which
// pgx handles through text and, for arrays, through a failed plan and a
// formatted error per element: a quarter of the relayer's CPU in a drain
// before this.

// wireUUIDs returns the uuid id picks out of each element of xs.
func wireUUIDs[T any](xs []T, id func(*T) uuid.UUID) [][16]byte {
	out := make([][16]byte, len(xs))
	for i := range xs {
		out[i] = id(&xs[i])
	}
	return out
}

// scanUUID is the scan target of a uuid column.
func scanUUID(u *uuid.UUID) *[16]byte { return (*[16]byte)(u) }
