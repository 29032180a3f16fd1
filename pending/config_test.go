package pending_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/pending"
)

// TestNewProducerRefusesABadConfig: a configuration no enqueue could use
// is refused at NewProducer with ErrInvalidConfig, not discovered at the
// first payment. An empty catalog (a rails file that lost its rails, a
// filter that kept none) refused every instruction as an unknown rail; a
// rail without a profile panicked at enqueue; a negative
// MaxPayloadBytes silently meant the default.
func TestNewProducerRefusesABadConfig(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]pending.Config{
		"empty catalog":         {Rails: payment.Catalog{}},
		"rail without profile":  {Rails: payment.Catalog{"sandbox": payment.Generic{}, "psp": nil}},
		"negative payload size": {MaxPayloadBytes: -1},
		"invalid schema":        {Schema: "no such; schema"},
	} {
		if p, err := pending.NewProducer(cfg); !errors.Is(err, pending.ErrInvalidConfig) || p != nil {
			t.Errorf("%s: NewProducer = %v, %v; want an error wrapping ErrInvalidConfig", name, p, err)
		}
	}
	if _, err := pending.NewProducer(pending.Config{}); err != nil {
		t.Errorf("zero config: %v", err)
	}
}

// TestProducerKeepsItsCatalog: the producer is safe for concurrent use, so
// it cannot share a map its caller may change: rails removed from the
// caller's catalog after NewProducer stay known to the producer.
func TestProducerKeepsItsCatalog(t *testing.T) {
	t.Parallel()
	cat := payment.DefaultCatalog()
	p, err := pending.NewProducer(pending.Config{Rails: cat})
	if err != nil {
		t.Fatal(err)
	}
	clear(cat)
	if err := p.Validate(payout("p1", "k1")); err != nil {
		t.Errorf("after the caller cleared its catalog: %v", err)
	}
}

// TestMismatchMessages: ErrIdempotencyMismatch is also the error of a key
// under another instruction id and of an instruction id under another
// key, where no payload differs: its text must not say one does, and each
// detail must say which case it is.
func TestMismatchMessages(t *testing.T) {
	t.Parallel()
	if msg := pending.ErrIdempotencyMismatch.Error(); strings.Contains(msg, "payload") {
		t.Errorf("ErrIdempotencyMismatch says %q, though it is not only about payloads", msg)
	}
	other := (&pending.MismatchError{InstructionID: "i-2", IdempotencyKey: "k", Owner: "i-1"}).Error()
	if strings.Contains(other, "payload") || !strings.Contains(other, `"i-1"`) {
		t.Errorf("a key of another instruction: %q; want the owner named and no word of a payload", other)
	}
	payload := (&pending.MismatchError{InstructionID: "i-1", IdempotencyKey: "k"}).Error()
	if !strings.Contains(payload, "payload") {
		t.Errorf("a key enqueued with another payload: %q; want it to say so", payload)
	}
}
