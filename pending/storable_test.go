package pending_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/pending"
)

// TestEnqueueUnstorableMetadataNumber guards the promise that an
// instruction the database cannot store is a *payment.ValidationError
// before anything is sent: metadata numbers whose display scale numeric
// cannot hold (above 16383 digits, trailing zeros and a zero's exponent
// included) failed the INSERT with SQLSTATE 22003 and aborted the caller's
// transaction.
func TestEnqueueUnstorableMetadataNumber(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for name, meta := range map[string]string{
		"zero with a large negative exponent": `{"n": 0e-20000}`,
		"fraction of trailing zeros":          `{"n": 1.` + strings.Repeat("0", 16400) + `}`,
		"trailing zeros behind an exponent":   `{"n": 1000e-16383}`,
	} {
		in := payout("p1", "k-"+strings.ReplaceAll(name, " ", "-"))
		in.Metadata = json.RawMessage(meta)
		var verr *payment.ValidationError
		if err := b.producer.Validate(in); !errors.As(err, &verr) || verr.Field != payment.FieldMetadata {
			t.Errorf("%s: Validate = %v, want a validation error naming the metadata", name, err)
		}
		tx, err := b.pool.Begin(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.producer.Enqueue(b.ctx, tx, in); !errors.Is(err, payment.ErrValidation) {
			t.Errorf("%s: Enqueue = %v, want a validation error", name, err)
		}
		if _, err := tx.Exec(b.ctx, "SELECT 1"); err != nil {
			t.Errorf("%s: the caller's transaction is no longer usable: %v", name, err)
		}
		_ = tx.Rollback(b.ctx)
	}
	if c := b.counts(t); c != (tableCounts{}) {
		t.Errorf("counts = %+v, want nothing written", c)
	}
}

// TestPayloadLimitCountsStoredNumbers guards the payload limit against
// jsonb's expansion of numbers: 0e-1000 is 7 bytes given and 1,002
// stored, so 2,000 of them in a 28 KB payload became 2 MB in the table
// (and in every relayer's request). The limit counts numbers as stored,
// and a payload it accepts reads back within it (give or take the space
// jsonb's text form puts after every ':' and ',').
func TestPayloadLimitCountsStoredNumbers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	meta := func(n int) json.RawMessage {
		parts := make([]string, n)
		for i := range parts {
			parts[i] = fmt.Sprintf(`"k%d":0e-1000`, i)
		}
		return json.RawMessage("{" + strings.Join(parts, ",") + "}")
	}

	big := payout("p1", "k-big")
	big.Metadata = meta(2000)
	p, err := b.producer.Payload(big)
	var verr *payment.ValidationError
	if !errors.As(err, &verr) || verr.Field != payment.FieldPayload || verr.Reason != payment.ReasonTooLarge {
		t.Fatalf("a %d-byte payload storing 2 MB: Payload = %v, want %s/%s", len(p), err, payment.FieldPayload, payment.ReasonTooLarge)
	}

	const members = 60 // 60 KB stored, under the 64 KiB limit
	fits := payout("p1", "k-fits")
	fits.Metadata = meta(members)
	if _, err := b.producer.Enqueue(b.ctx, b.pool, fits); err != nil {
		t.Fatal(err)
	}
	var stored int
	if err := b.pool.QueryRow(b.ctx, `SELECT octet_length(payload::text) FROM outbox.pending`).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if limit := payment.DefaultMaxPayloadBytes + 2*(members+4); stored > limit {
		t.Errorf("an accepted payload reads back as %d bytes, over the limit (%d with jsonb's spaces)", stored, limit)
	}
	tooMany := payout("p1", "k-too-many")
	tooMany.Metadata = meta(66) // 66 KB stored, 1 KB given
	if err := b.producer.Validate(tooMany); !errors.As(err, &verr) || verr.Reason != payment.ReasonTooLarge {
		t.Errorf("66 KB stored: Validate = %v, want %s", err, payment.ReasonTooLarge)
	}
}

// TestPayloadLimitCountsStoredSpacing guards the payload limit against
// jsonb's spacing: the payload is read back (by every relayer, the
// console, exports) with a space after every ',' and ':', so a limit on
// the compact form let 1,000 bytes of [1,1,...] be stored and read back
// as 1,300. The largest metadata of that kind the producer accepts reads
// back within the limit, give or take the 7 separators of the payload
// object's own four members, which the producer still counts on the
// compact form.
func TestPayloadLimitCountsStoredSpacing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const limit = 1000
	producer, err := pending.NewProducer(pending.Config{MaxPayloadBytes: limit})
	if err != nil {
		t.Fatal(err)
	}
	ones := func(n int) json.RawMessage {
		return json.RawMessage(`{"a":[` + strings.TrimSuffix(strings.Repeat("1,", n), ",") + `]}`)
	}
	in := payout("p1", "k-spacing")
	n := 1
	for ; ; n++ {
		in.Metadata = ones(n)
		if err := producer.Validate(in); err != nil {
			if !errors.Is(err, payment.ErrValidation) {
				t.Fatal(err)
			}
			break
		}
	}
	in.Metadata = ones(n - 1)
	if _, err := producer.Enqueue(b.ctx, b.pool, in); err != nil {
		t.Fatal(err)
	}
	var stored int
	if err := b.pool.QueryRow(b.ctx, `SELECT octet_length(payload::text) FROM outbox.pending`).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	// Each step adds "1, " as read back: the largest payload accepted
	// reads back within 3 bytes under the limit, never over it.
	if stored > limit || stored <= limit-3 {
		t.Errorf("the largest payload accepted under a %d-byte limit reads back as %d bytes", limit, stored)
	}
}
