package pending_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/ledgerline/outbox/internal/strictjson"
	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/pending"
)

// FuzzValidate drives the Go API's validation with arbitrary fields:
// never a panic; a rejection is always a *payment.ValidationError; an
// accepted instruction's stored payload decodes back to exactly its
// payment fields and (semantically) its metadata.
func FuzzValidate(f *testing.F) {
	f.Add("ins-1", "p1", "k1", "sandbox", int64(1250), "USD", "acct-42", []byte(`{"note":"x","n":[1,2.50,"\u00e9"]}`))
	f.Add("ins-2", "p\u0085", "k\u202e", "event", int64(0), "", "", []byte(`{"kind":"usage","units":3}`))
	f.Add("ins-3", "p3", "key-\xff", "sandbox", int64(-1), "DEM", "a\x00b", []byte(`{"a":1,"a":2}`))
	f.Add("ins-4", "p4", "k4", "sandbox", int64(1), "JPY", "acct", []byte(`{"big":123456789012345678901234567890,"e":1e999,"z":"\u0000"}`))
	f.Add("ins-5", "p5", "k5", "event", int64(0), "", "", []byte(`{"z":0e-20000,"t":1.000e-999,"s":[0e-1000,0e-1000]}`))
	f.Add("ins-6", "p6", "k6", "sandbox", int64(7), "EUR", "acct", []byte(`{"n":1e2,"f":[1.5E+1,-0,0e-2,-1.20e1,0e1073741822],"s":"1e2"}`))
	f.Add("", "", "", "", int64(0), "", "", []byte(`null`))
	producer, err := pending.NewProducer(pending.Config{})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, id, participant, key, rail string, amount int64, currency, dest string, meta []byte) {
		in := pending.Instruction{InstructionID: id, ParticipantID: participant, IdempotencyKey: key, RailType: rail,
			AmountMinor: amount, Currency: currency, Destination: dest}
		if len(meta) > 0 {
			in.Metadata = meta
		}
		stored, err := producer.Payload(in)
		if err != nil {
			var verr *payment.ValidationError
			if !errors.As(err, &verr) || !errors.Is(err, payment.ErrValidation) {
				t.Fatalf("untyped rejection %T: %v", err, err)
			}
			return
		}
		checkRoundTrip(t, in, stored)
		checkNumbersDoNotCount(t, producer, in)
	})
}

// checkNumbersDoNotCount asserts that in (accepted), with its metadata's
// numbers written as jsonb stores them, has the same payload hash: a
// retry that spells a number otherwise is the same payment.
func checkNumbersDoNotCount(t *testing.T, producer *pending.Producer, in pending.Instruction) {
	t.Helper()
	if len(in.Metadata) == 0 {
		return
	}
	full, changed, err := strictjson.NumbersInFull(in.Metadata)
	if err != nil {
		t.Fatalf("accepted metadata %s: %v", in.Metadata, err)
	}
	if !changed {
		return
	}
	h1, err1 := pending.PayloadHashOf(producer, in)
	respelled := in
	respelled.Metadata = full
	h2, err2 := pending.PayloadHashOf(producer, respelled)
	if err1 != nil || err2 != nil || !bytes.Equal(h1, h2) {
		t.Fatalf("metadata %s and %s (its numbers as stored) hash differently (%v, %v)", in.Metadata, full, err1, err2)
	}
}

// checkRoundTrip asserts that stored (a payload the producer accepted for
// in) decodes back to in's payment fields and metadata.
func checkRoundTrip(t *testing.T, in pending.Instruction, stored []byte) {
	t.Helper()
	var got payment.Payload
	if err := json.Unmarshal(stored, &got); err != nil {
		t.Fatalf("stored payload %q does not decode: %v", stored, err)
	}
	if got.AmountMinor != in.AmountMinor || got.Currency != in.Currency || got.Destination != in.Destination {
		t.Fatalf("stored %q, want amount %d currency %q destination %q", stored, in.AmountMinor, in.Currency, in.Destination)
	}
	if !testdb.SameJSON(t, got.Metadata, in.Metadata) {
		t.Fatalf("stored metadata %s differs from the input %s", got.Metadata, in.Metadata)
	}
}

// TestStoredPayloadRoundTrips: what the database stores for accepted
// instructions with tricky metadata (escapes, big integers, exponents at
// the limit, nesting) is exactly the payload the producer computed (jsonb
// equality) and decodes back to the input; the columns are the input's.
func TestStoredPayloadRoundTrips(t *testing.T) {
	t.Parallel()
	b := setup(t)
	metas := []string{
		`{"note":"caf\u00e9 \"quoted\" \\ back\/slash \t tab \u2028 sep","emoji":"\ud83d\udcb8"}`,
		`{"big":123456789012345678901234567890,"neg":-0.000000000000000000001,"exp":9.99e999,"tiny":1e-1000,"zero":0e5000}`,
		`{"nested":{"b":[1,{"c":null,"d":[true,false]}],"a":"x"},"html":"<a href=\"&\">"}`,
		`{}`,
	}
	for i, meta := range metas {
		in := payout("p1", fmt.Sprintf("rt-%d", i))
		in.Metadata = json.RawMessage(meta)
		in.TenantID, in.CorrelationID = "tenant-é", "corr-1"
		want, err := b.producer.Payload(in)
		if err != nil {
			t.Fatalf("%s: %v", meta, err)
		}
		checkRoundTrip(t, in, want)
		r, err := b.producer.Enqueue(b.ctx, b.pool, in)
		if err != nil {
			t.Fatalf("%s: %v", meta, err)
		}
		var same bool
		var instr, part, key, rail, tenant, corr string
		if err := b.pool.QueryRow(b.ctx, `SELECT payload = $2::jsonb, instruction_id, participant_id, idempotency_key,
			rail_type, tenant_id, correlation_id FROM outbox.pending WHERE outbox_id = $1`, r.OutboxID, string(want)).
			Scan(&same, &instr, &part, &key, &rail, &tenant, &corr); err != nil {
			t.Fatal(err)
		}
		if !same || instr != in.InstructionID || part != in.ParticipantID || key != in.IdempotencyKey ||
			rail != in.RailType || tenant != in.TenantID || corr != in.CorrelationID {
			t.Errorf("%s: stored row differs (payload equal: %v; %q %q %q %q %q %q)", meta, same, instr, part, key, rail, tenant, corr)
		}
	}
}
