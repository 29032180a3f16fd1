package main

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/ledgerline/outbox/internal/strictjson"
	"github.com/ledgerline/outbox/internal/testdb"
	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/pending"
)

// FuzzEnqueueLine drives the JSON-lines reader of `outbox enqueue` with
// arbitrary lines: never a panic; a rejected line always gets a typed
// error (a strict JSON error or a validation error, which the output turns
// into INVALID_INPUT or VALIDATION_FAILED naming the field); an accepted
// line's stored payload decodes back to exactly what the line said.
func FuzzEnqueueLine(f *testing.F) {
	f.Add([]byte(`{"instruction_id":"i1","participant_id":"p1","idempotency_key":"k1","rail":"sandbox","amount_minor":1250,"currency":"USD","destination":"acct-42"}`))
	f.Add([]byte(`{"instruction_id":"i1","participant_id":"p1","idempotency_key":"k1","rail":"sandbox","amount_minor":"1250.00","currency":"USD","destination":"acct-42","metadata":{"note":"caf\u00e9","n":1.50}}`))
	f.Add([]byte(`{"instruction_id":"i1","participant_id":"p1","idempotency_key":"k1","rail":"sandbox","amount_minor":"1250","currency":"USD","destination":"acct-42","metadata":null,"tenant_id":null}`))
	f.Add([]byte(`{"amount_minor":100,"AMOUNT_MINOR":99999999,"Destination":"attacker-acct"}`))
	f.Add([]byte(`{"instruction_id":"a","instruction_id":"b"}`))
	f.Add([]byte("{\"idempotency_key\":\"key-\xff\"}"))
	f.Add([]byte(`{"instruction_id":"e","participant_id":"p","idempotency_key":"k","rail":"event","metadata":{"a":"\u0000"}}`))
	f.Add([]byte(`{"instruction_id":"e","participant_id":"p","idempotency_key":"k","rail":"event","metadata":{"n":1e-1001}} {}`))
	producer, err := pending.NewProducer(pending.Config{})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var line inputLine
		if err := decodeLine(raw, &line); err != nil {
			var jerr *strictjson.Error
			if !errors.As(err, &jerr) || classifyInput(err).Code != codeInvalidInput {
				t.Fatalf("untyped decoding error %T: %v", err, err)
			}
			return
		}
		in, err := line.instruction()
		var stored []byte
		if err == nil {
			stored, err = producer.Payload(in)
		}
		if err != nil {
			var verr *payment.ValidationError
			var jerr *strictjson.Error
			if !errors.As(err, &verr) && !errors.As(err, &jerr) {
				t.Fatalf("untyped rejection %T: %v", err, err)
			}
			if c := classifyInput(err).Code; c == codeDatabaseError {
				t.Fatalf("rejection classified as %s: %v", c, err)
			}
			return
		}
		var got payment.Payload
		if err := json.Unmarshal(stored, &got); err != nil {
			t.Fatalf("stored payload %q does not decode: %v", stored, err)
		}
		amount, _ := amountText(line.AmountMinor)
		if got.Currency != line.Currency || got.Destination != line.Destination || (amount != "" && got.AmountMinor != in.AmountMinor) {
			t.Fatalf("line %q stored as %q", raw, stored)
		}
		if !testdb.SameJSON(t, got.Metadata, line.Metadata) {
			t.Fatalf("line metadata %s stored as %s", line.Metadata, got.Metadata)
		}
	})
}
