package pending_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/ledgerline/outbox/pending"
)

// TestMetadataNumbersAsStoredDecideTheKey guards the payload hash against
// the way a number is written: PostgreSQL stores 1e2 as 100, 1.5E+1 as
// 15, -0 as 0 and 0e-2 as 0.00, so a retry whose encoder writes the same
// number otherwise (another language's JSON library, a float printed in
// exponent form) asks the rail for exactly what the first enqueue did, and
// got IDEMPOTENCY_MISMATCH, refused for good. It is the original receipt.
// Numbers PostgreSQL stores differently (1.0 and 1, 0.00 and 0) are still
// another payload: the rail is sent each as stored.
func TestMetadataNumbersAsStoredDecideTheKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first := payout("p1", "k-numbers")
	first.Metadata = json.RawMessage(`{"n": 100, "f": 15, "z": 0, "s": 0.00, "a": [0.015, -120]}`)
	r, err := b.producer.Enqueue(b.ctx, b.pool, first)
	if err != nil {
		t.Fatal(err)
	}
	for _, meta := range []string{
		`{"n": 1e2, "f": 1.5E+1, "z": -0, "s": 0e-2, "a": [15e-3, -1.2e2]}`,
		`{"a":[1.5e-2,-12e1],"f":15,"n":100e0,"s":-0.00,"z":0}`,
	} {
		retry := first
		retry.Metadata = json.RawMessage(meta)
		var stored, retried string
		if err := b.pool.QueryRow(b.ctx, `SELECT $1::jsonb::text, payload->>'metadata' FROM outbox.pending WHERE outbox_id = $2`,
			meta, r.OutboxID).Scan(&retried, &stored); err != nil {
			t.Fatal(err)
		}
		if retried != stored {
			t.Fatalf("the test's premise: PostgreSQL stores %s as %s, the first as %s", meta, retried, stored)
		}
		got, err := b.producer.Enqueue(b.ctx, b.pool, retry)
		if err != nil || got != (pending.Receipt{OutboxID: r.OutboxID, SequenceID: r.SequenceID, Duplicate: true}) {
			t.Errorf("retry with %s = %+v, %v; want the original receipt %+v, duplicate", meta, got, err, r)
		}
	}
	for _, meta := range []string{
		`{"n": 100.0, "f": 15, "z": 0, "s": 0.00, "a": [0.015, -120]}`,
		`{"n": 100, "f": 15, "z": 0, "s": 0, "a": [0.015, -120]}`,
		`{"n": 100, "f": 15, "z": 0, "s": 0.00, "a": [0.0150, -120]}`,
		`{"n": 100, "f": 15, "z": 0, "s": 0.00, "a": [0.015, 120]}`,
	} {
		other := first
		other.Metadata = json.RawMessage(meta)
		if _, err := b.producer.Enqueue(b.ctx, b.pool, other); !errors.Is(err, pending.ErrIdempotencyMismatch) {
			t.Errorf("metadata %s, stored otherwise: %v, want a mismatch", meta, err)
		}
	}
	if c := b.counts(t); c != (tableCounts{keys: 1, pending: 1, sequences: 1}) {
		t.Errorf("counts = %+v, want the first enqueue only", c)
	}
}

// TestKeyOfAnEarlierBuildMatchesItsRetry guards the upgrade: an earlier
// build hashed metadata numbers as given, so its key of an instruction
// with 1e2 holds that hash. A retry sent as it was then is still the
// original receipt, not a mismatch; another payload is still refused.
func TestKeyOfAnEarlierBuildMatchesItsRetry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	in := payout("p1", "k-earlier")
	in.Metadata = json.RawMessage(`{"n": 1e2}`)
	r, err := b.producer.Enqueue(b.ctx, b.pool, in)
	if err != nil {
		t.Fatal(err)
	}
	asGiven, err := pending.AsGivenHash(b.producer, in)
	if err != nil {
		t.Fatal(err)
	}
	tag, err := b.pool.Exec(b.ctx, `UPDATE outbox.idempotency_keys SET payload_hash = $1 WHERE idempotency_key = $2 AND payload_hash <> $1`,
		asGiven, in.IdempotencyKey)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("writing the earlier build's hash: %v (%d rows)", err, tag.RowsAffected())
	}
	got, err := b.producer.Enqueue(b.ctx, b.pool, in)
	if err != nil || got != (pending.Receipt{OutboxID: r.OutboxID, SequenceID: r.SequenceID, Duplicate: true}) {
		t.Errorf("retry as sent then = %+v, %v; want the original receipt, duplicate", got, err)
	}
	other := in
	other.Metadata = json.RawMessage(`{"n": 1e3}`)
	if _, err := b.producer.Enqueue(b.ctx, b.pool, other); !errors.Is(err, pending.ErrIdempotencyMismatch) {
		t.Errorf("another number: %v, want a mismatch", err)
	}
}
