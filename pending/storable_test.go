package pending_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/ledgerline/outbox/payment"
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
