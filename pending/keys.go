package pending

import (
	"encoding/binary"

	"github.com/gofrs/uuid/v5"
)

// keyRoot is the namespace of all deterministic keys. It is fixed forever:
// changing it would change every key and break deduplication across a
// deploy.
var keyRoot = uuid.NewV5(uuid.NamespaceURL, "https://github.com/ledgerline/outbox/idempotency-key")

// DeterministicKey derives an idempotency key (a UUIDv5, as text) from a
// namespace and the parts that identify a logical operation, e.g.
// DeterministicKey("payouts", tenantID, payoutID, "v1"). The same input
// gives the same key in every process and version; different input gives a
// different key. Parts are length-prefixed before hashing, so ("a:b", "c")
// and ("a", "b:c") differ.
func DeterministicKey(namespace string, parts ...string) string {
	ns := uuid.NewV5(keyRoot, namespace)
	var buf []byte
	for _, p := range parts {
		buf = binary.AppendUvarint(buf, uint64(len(p)))
		buf = append(buf, p...)
	}
	return uuid.NewV5(ns, string(buf)).String()
}
