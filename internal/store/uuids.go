package store

import (
	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// UUIDs cross the wire as pgtype.UUID, which pgx encodes and decodes in
// binary directly and, unlike a bare [16]byte, knows the type of without
// a prepared statement's description: behind a transaction pooler
// (QueryExecModeExec) pgx picks a parameter's type from its Go type
// alone. A uuid.UUID is a driver.Valuer and sql.Scanner, which pgx
// handles through text and, for arrays, through a failed plan and a
// formatted error per element: a quarter of the relayer's CPU in a drain.

// wireUUIDs returns the uuid id picks out of each element of xs.
func wireUUIDs[T any](xs []T, id func(*T) uuid.UUID) []pgtype.UUID {
	out := make([]pgtype.UUID, len(xs))
	for i := range xs {
		out[i] = pgtype.UUID{Bytes: id(&xs[i]), Valid: true}
	}
	return out
}

// scanUUID is the scan target of a uuid column that is never NULL.
func scanUUID(u *uuid.UUID) *[16]byte { return (*[16]byte)(u) }
