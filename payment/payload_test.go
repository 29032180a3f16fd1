package payment_test

import (
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/ledgerline/outbox/internal/strictjson"
	"github.com/ledgerline/outbox/payment"
)

// TestDecodePayloadReadsWhatPostgreSQLWrites: the payloads PostgreSQL
// hands back (jsonb's own form: members by key length, ", " and ": ") are
// read without the strict decoder, and what needs it (metadata, an escape,
// an exponent, a repeated member, another member) is left to it.
func TestDecodePayloadReadsWhatPostgreSQLWrites(t *testing.T) {
	t.Parallel()
	plain := map[string]payment.Payload{
		`{"currency": "USD", "destination": "acct-1", "amount_minor": 1000}`: {AmountMinor: 1000, Currency: "USD", Destination: "acct-1"},
		`{"amount_minor":-9223372036854775808}`:                              {AmountMinor: math.MinInt64},
		`{"amount_minor": 9223372036854775807, "currency": "JPY"}`:           {AmountMinor: math.MaxInt64, Currency: "JPY"},
		" {\t\"destination\" :\"DE89 3704 0044 0532 0130 00\"\r\n} ":         {Destination: "DE89 3704 0044 0532 0130 00"},
		`{"currency": "€"}`:   {Currency: "€"},
		`{"amount_minor": 0}`: {},
		`{}`:                  {},
	}
	for in, want := range plain {
		got, ok := payment.DecodePlainPayload([]byte(in))
		if !ok || got.AmountMinor != want.AmountMinor || got.Currency != want.Currency || got.Destination != want.Destination || got.Metadata != nil {
			t.Errorf("%s: plain %v, %+v; want %+v", in, ok, got, want)
		}
	}
	for _, in := range []string{
		`{"currency": "USD", "metadata": {"k": "v"}, "amount_minor": 1}`,
		`{"currency": "U\u0053D"}`,
		`{"amount_minor": 1e3}`,
		`{"amount_minor": 1.0}`,
		`{"amount_minor": 01}`,
		`{"amount_minor": 9223372036854775808}`,
		`{"amount_minor": -9223372036854775809}`,
		`{"amount_minor": 12345678901234567890}`,
		`{"amount_minor": "100"}`,
		`{"amount_minor": null}`,
		`{"currency": "USD", "currency": "EUR"}`,
		`{"Currency": "USD"}`,
		`{"currency": "USD",}`,
		`{"currency": "USD"} x`,
		"{\"currency\": \"US\xffD\"}",
		"{\"currency\": \"US\tD\"}",
		`[]`,
		``,
	} {
		if got, ok := payment.DecodePlainPayload([]byte(in)); ok {
			t.Errorf("%s: read as plain %+v, want it left to the strict decoder", in, got)
		}
	}
}

// FuzzDecodePayload: DecodePayload's result is the strict decoder's for
// every input, it fails exactly when that decoder does (with a
// ValidationError on the payload), and what it reads itself the strict
// decoder reads the same.
func FuzzDecodePayload(f *testing.F) {
	for _, s := range []string{
		`{"currency": "USD", "destination": "acct-1", "amount_minor": 1000}`,
		`{"currency": "EUR", "metadata": {"order": 7}, "destination": "DE89370400440532013000", "amount_minor": 250}`,
		`{"metadata": {"event": "payout.created"}}`,
		`{"amount_minor": -0}`, `{"amount_minor": 1E2}`, `{"amount_minor": 00}`, `{"amount_minor": -}`,
		`{"currency": "\u00e9"}`, `{"CURRENCY": "USD"}`, `{"destination": "a", "destination": "b"}`,
		`{"amount_minor": 9223372036854775807}`, `{"amount_minor": 99999999999999999999}`,
		`{"currency": null}`, `{"currency": 5}`, `null`, `{`, `{}`, ` { } `,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var want payment.Payload
		wantErr := strictjson.Unmarshal(data, &want)
		got, err := payment.DecodePayload(data)
		if (err == nil) != (wantErr == nil) || (err != nil && !errors.Is(err, payment.ErrValidation)) {
			t.Fatalf("%q: error %v, the strict decoder's %v", data, err, wantErr)
		}
		if err == nil && !reflect.DeepEqual(got, want) {
			t.Fatalf("%q: %+v, the strict decoder's %+v", data, got, want)
		}
		if plain, ok := payment.DecodePlainPayload(data); ok && (wantErr != nil || !reflect.DeepEqual(plain, want)) {
			t.Fatalf("%q: read as plain %+v, the strict decoder's %+v (%v)", data, plain, want, wantErr)
		}
	})
}

// BenchmarkDecodePayload: a payment payload as PostgreSQL hands it back,
// read by DecodePayload and by encoding/json.
func BenchmarkDecodePayload(b *testing.B) {
	data := []byte(`{"currency": "USD", "destination": "acct-1", "amount_minor": 1000}`)
	b.Run("DecodePayload", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := payment.DecodePayload(data); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding/json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var p payment.Payload
			if err := json.Unmarshal(data, &p); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestDecodePayloadIsExact: a stored payload whose members are not
// exactly the payload's (another letter case, an unknown member, one named
// twice) is refused with a *ValidationError on the payload that names the
// member. encoding/json, which read what the fast path left to it, took
// "AMOUNT_minor" for amount_minor and the last of two amounts, so a row
// edited by hand could pay an amount no producer validated.
func TestDecodePayloadIsExact(t *testing.T) {
	t.Parallel()
	for in, member := range map[string]string{
		`{"AMOUNT_minor": 99999999, "currency": "USD", "destination": "acct-1"}`:        "AMOUNT_minor",
		`{"amount_minor": 100, "Currency": "USD", "destination": "acct-1"}`:             "Currency",
		`{"amount_minor": 100, "currency": "USD", "DESTINATION": "attacker"}`:           "DESTINATION",
		`{"amount_minor": 100, "currency": "USD", "Metadata": {"k": 1}}`:                "Metadata",
		`{"amount_minor": 100, "currency": "USD", "beneficiary": "x"}`:                  "beneficiary",
		`{"amount_minor": 100, "amount_minor": 99999999, "currency": "USD"}`:            "amount_minor",
		`{"amount_minor": 100, "metadata": {"k": 1}, "metadata": {"k": 2}}`:             "metadata",
		`{"metadata": {"k": "v"}, "currency": "USD", "amount_minor": 1, "Extra": true}`: "Extra",
	} {
		p, err := payment.DecodePayload([]byte(in))
		var verr *payment.ValidationError
		if !errors.As(err, &verr) || !errors.Is(err, payment.ErrValidation) || verr.Field != payment.FieldPayload ||
			!strings.Contains(verr.Message, `"`+member+`"`) {
			t.Errorf("%s: %+v, %v; want a ValidationError on the payload naming %q", in, p, err, member)
		}
	}
	// What PostgreSQL writes back, metadata and escapes included, still reads.
	p, err := payment.DecodePayload([]byte(`{"currency": "U\u0053D", "metadata": {"Order": 7, "order": 8}, "destination": "acct-1", "amount_minor": 1000}`))
	if err != nil || p.Currency != "USD" || p.AmountMinor != 1000 || string(p.Metadata) != `{"Order": 7, "order": 8}` {
		t.Errorf("a payload with metadata: %+v, %v", p, err)
	}
}
