// Package outboxtest helps a service's own tests, the way River's
// rivertest does: assert, inside the test's transaction, that the code
// under test enqueued an instruction with the expected fields
// ([RequireEnqueued], [RequireNotEnqueued]), or exactly these instructions
// for one participant, in sequence order ([RequireManyEnqueued]), and
// relay them against a fake transport to see what the rail would be sent
// and what was recorded: one pass ([RelayOnce]) or until nothing is due
// ([Drain]).
//
// Every helper takes the database handle the test already has (a pgx.Tx
// that is rolled back at the end, a *pgx.Conn or a *pgxpool.Pool), so
// assertions see the test's own uncommitted writes.
package outboxtest

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gofrs/uuid/v5"

	"github.com/ledgerline/outbox/engine"
	"github.com/ledgerline/outbox/internal/store"
	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/pending"
	"github.com/ledgerline/outbox/rails"
)

// DB is a database handle: pgx.Tx, *pgx.Conn and *pgxpool.Pool satisfy it.
type DB = store.Batcher

// Want describes an expected instruction. Empty and zero fields are not
// checked; InstructionID or IdempotencyKey narrow the search.
type Want struct {
	// Schema holding the outbox tables; "" means the default.
	Schema         string
	InstructionID  string
	ParticipantID  string
	IdempotencyKey string
	RailType       string
	TenantID       string
	CorrelationID  string
	AmountMinor    int64
	Currency       string
	Destination    string
	// Metadata, if set, must be the same JSON value as the instruction's
	// metadata (for an event rail, the event): compared as JSON, so key
	// order, spacing and how a number is written (1.5, 1.50, 15e-1) do not
	// matter.
	Metadata json.RawMessage
}

// Enqueued is a pending instruction as the outbox holds it: the
// instruction as the producer gave it (but Metadata as PostgreSQL's jsonb
// gives it back, keys reordered and spaced: compare it as JSON, not as
// text), with the outbox id and sequence id it was given.
type Enqueued struct {
	OutboxID   uuid.UUID
	SequenceID int64
	pending.Instruction
}

// RequireEnqueued fails the test unless exactly one pending instruction in
// db matches want, and returns it. Finding none, the failure shows the
// pending instructions want's instruction id, participant and rail
// select (the closest first) and how each differs from want.
func RequireEnqueued(ctx context.Context, tb testing.TB, db DB, want Want) Enqueued {
	tb.Helper()
	got, missed := find(ctx, tb, db, want)
	if len(got) != 1 {
		tb.Fatalf("outboxtest: want one pending instruction matching %s, found %d%s", describe(want), len(got), nearest(got, missed))
	}
	return got[0]
}

// RequireNotEnqueued fails the test if a pending instruction in db matches
// want.
func RequireNotEnqueued(ctx context.Context, tb testing.TB, db DB, want Want) {
	tb.Helper()
	if got, _ := find(ctx, tb, db, want); len(got) > 0 {
		tb.Fatalf("outboxtest: want no pending instruction matching %s, found %d (first: %s)", describe(want), len(got), describeEnqueued(got[0]))
	}
}

// Participant names one participant's queue for [RequireManyEnqueued].
type Participant struct {
	// Schema holding the outbox tables; "" means the default.
	Schema string
	// ParticipantID is the participant whose pending instructions are
	// compared (required).
	ParticipantID string
}

// RequireManyEnqueued fails the test unless the pending instructions of
// participant p in db are exactly wants, one each, in sequence order (the
// order the relayer sends them in), and returns them. No wants requires
// that none is pending. Each Want is compared as by [RequireEnqueued];
// its ParticipantID and Schema, if set, must be p's. The failure says,
// line by line, what was wanted and what was found.
func RequireManyEnqueued(ctx context.Context, tb testing.TB, db DB, p Participant, wants ...Want) []Enqueued {
	tb.Helper()
	if p.ParticipantID == "" {
		tb.Fatalf("outboxtest: RequireManyEnqueued: Participant.ParticipantID is required")
	}
	wantMetas := make([]any, len(wants))
	for i, w := range wants {
		switch {
		case w.ParticipantID != "" && w.ParticipantID != p.ParticipantID:
			tb.Fatalf("outboxtest: RequireManyEnqueued: Want #%d names participant %q, not %q", i+1, w.ParticipantID, p.ParticipantID)
		case w.Schema != "" && w.Schema != p.Schema:
			tb.Fatalf("outboxtest: RequireManyEnqueued: Want #%d names schema %q, not %q", i+1, w.Schema, p.Schema)
		}
		if len(w.Metadata) > 0 {
			var err error
			if wantMetas[i], err = decodeJSON(w.Metadata); err != nil {
				tb.Fatalf("outboxtest: Want #%d: Want.Metadata is not JSON: %v", i+1, err)
			}
		}
	}
	// Every pending instruction of the participant, by sequence id.
	got, _ := find(ctx, tb, db, Want{Schema: p.Schema, ParticipantID: p.ParticipantID})
	var lines []string
	failed := len(got) != len(wants)
	for i := range max(len(got), len(wants)) {
		switch {
		case i >= len(got):
			lines = append(lines, fmt.Sprintf("#%d: want %s, found nothing", i+1, describe(wants[i])))
		case i >= len(wants):
			lines = append(lines, fmt.Sprintf("#%d: want nothing, found %s", i+1, describeEnqueued(got[i])))
		default:
			if diffs := differences(tb, got[i], wants[i], wantMetas[i]); len(diffs) > 0 {
				failed = true
				lines = append(lines, fmt.Sprintf("#%d: %s (found %s)", i+1, strings.Join(diffs, "; "), describeEnqueued(got[i])))
			} else {
				lines = append(lines, fmt.Sprintf("#%d: as wanted, %s", i+1, describeEnqueued(got[i])))
			}
		}
	}
	if failed {
		tb.Fatalf("outboxtest: participant %q: want %d pending instructions in sequence order, found %d:\n\t%s",
			p.ParticipantID, len(wants), len(got), strings.Join(lines, "\n\t"))
	}
	return got
}

// miss is a pending instruction that did not match a Want, and how it
// differs from it.
type miss struct {
	e     Enqueued
	diffs []string
}

// find lists the pending instructions matching want, and those it compared
// with want (want's instruction id, participant and rail select them) that
// do not match, the fewest differences first.
func find(ctx context.Context, tb testing.TB, db DB, want Want) ([]Enqueued, []miss) {
	tb.Helper()
	st, err := store.New(want.Schema)
	if err != nil {
		tb.Fatalf("outboxtest: %v", err)
	}
	// No limit: an assertion that read only the first rows would miss an
	// instruction queued behind them, and RequireNotEnqueued would pass.
	rows, err := st.ListPending(ctx, db, store.PendingFilter{InstructionID: want.InstructionID,
		ParticipantID: want.ParticipantID, RailType: want.RailType, Limit: math.MaxInt})
	if err != nil {
		tb.Fatalf("outboxtest: %v", err)
	}
	var wantMeta any
	if len(want.Metadata) > 0 {
		if wantMeta, err = decodeJSON(want.Metadata); err != nil {
			tb.Fatalf("outboxtest: Want.Metadata is not JSON: %v", err)
		}
	}
	var (
		out    []Enqueued
		missed []miss
	)
	for _, r := range rows {
		var p payment.Payload
		if err := json.Unmarshal(r.Payload, &p); err != nil {
			tb.Fatalf("outboxtest: outbox %s: stored payload: %v", r.OutboxID, err)
		}
		e := Enqueued{OutboxID: r.OutboxID, SequenceID: r.SequenceID, Instruction: pending.Instruction{
			InstructionID: r.InstructionID, ParticipantID: r.ParticipantID, IdempotencyKey: r.IdempotencyKey,
			RailType: r.RailType, TenantID: r.TenantID, CorrelationID: r.CorrelationID,
			AmountMinor: p.AmountMinor, Currency: p.Currency, Destination: p.Destination, Metadata: p.Metadata}}
		diffs := differences(tb, e, want, wantMeta)
		if len(diffs) == 0 {
			out = append(out, e)
			continue
		}
		missed = append(missed, miss{e, diffs})
	}
	slices.SortStableFunc(missed, func(a, b miss) int { return len(a.diffs) - len(b.diffs) })
	return out, missed
}

// differences lists how e differs from w, one field each ("amount_minor
// 1250, want 1251"): empty when e matches w. wantMeta is w.Metadata
// decoded (nil: not checked).
func differences(tb testing.TB, e Enqueued, w Want, wantMeta any) []string {
	tb.Helper()
	var diffs []string
	text := func(name, got, want string) {
		if want != "" && got != want {
			diffs = append(diffs, fmt.Sprintf("%s %q, want %q", name, got, want))
		}
	}
	text("instruction_id", e.InstructionID, w.InstructionID)
	text("participant_id", e.ParticipantID, w.ParticipantID)
	text("idempotency_key", e.IdempotencyKey, w.IdempotencyKey)
	text("rail", e.RailType, w.RailType)
	text("tenant_id", e.TenantID, w.TenantID)
	text("correlation_id", e.CorrelationID, w.CorrelationID)
	if w.AmountMinor != 0 && e.AmountMinor != w.AmountMinor {
		diffs = append(diffs, fmt.Sprintf("amount_minor %d, want %d", e.AmountMinor, w.AmountMinor))
	}
	text("currency", e.Currency, w.Currency)
	text("destination", e.Destination, w.Destination)
	if wantMeta != nil {
		got, err := decodeJSON(e.Metadata)
		if err != nil {
			tb.Fatalf("outboxtest: outbox %s: stored metadata: %v", e.OutboxID, err)
		}
		if !sameJSON(got, wantMeta) {
			diffs = append(diffs, fmt.Sprintf("metadata %s, want %s", cmp.Or(string(e.Metadata), "none"), w.Metadata))
		}
	}
	return diffs
}

// shownMisses is how many of the pending instructions that do not match a
// failure shows: enough for the one the test meant, few enough to read.
const shownMisses = 5

// nearest says, for a failure that found no match, which pending
// instructions were compared and how the closest differ.
func nearest(got []Enqueued, missed []miss) string {
	switch {
	case len(got) > 0:
		return ""
	case len(missed) == 0:
		return ": none is pending"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "; of the %d pending it was compared with, the closest:", len(missed))
	for _, m := range missed[:min(len(missed), shownMisses)] {
		fmt.Fprintf(&b, "\n\t%s: %s", describeEnqueued(m.e), strings.Join(m.diffs, "; "))
	}
	if len(missed) > shownMisses {
		fmt.Fprintf(&b, "\n\t(and %d more)", len(missed)-shownMisses)
	}
	return b.String()
}

// describeEnqueued names a pending instruction and its fields, as
// describe names a Want's.
func describeEnqueued(e Enqueued) string {
	return fmt.Sprintf("outbox %s sequence %d %s", e.OutboxID, e.SequenceID, describe(Want{
		InstructionID: e.InstructionID, ParticipantID: e.ParticipantID, IdempotencyKey: e.IdempotencyKey,
		RailType: e.RailType, TenantID: e.TenantID, CorrelationID: e.CorrelationID, AmountMinor: e.AmountMinor,
		Currency: e.Currency, Destination: e.Destination, Metadata: e.Metadata}))
}

func describe(w Want) string {
	var parts []string
	add := func(name, v string) {
		if v != "" {
			parts = append(parts, fmt.Sprintf("%s=%q", name, v))
		}
	}
	add("instruction_id", w.InstructionID)
	add("participant_id", w.ParticipantID)
	add("idempotency_key", w.IdempotencyKey)
	add("rail", w.RailType)
	add("tenant_id", w.TenantID)
	add("correlation_id", w.CorrelationID)
	if w.AmountMinor != 0 {
		parts = append(parts, fmt.Sprintf("amount_minor=%d", w.AmountMinor))
	}
	add("currency", w.Currency)
	add("destination", w.Destination)
	if len(w.Metadata) > 0 {
		parts = append(parts, "metadata="+string(w.Metadata))
	}
	if len(parts) == 0 {
		return "anything"
	}
	return "{" + strings.Join(parts, " ") + "}"
}

// decodeJSON decodes one JSON value, numbers as json.Number; absent (no
// metadata) is nil.
func decodeJSON(raw []byte) (any, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if dec.More() {
		return nil, fmt.Errorf("more than one JSON value in %q", raw)
	}
	return v, nil
}

// sameJSON reports whether two decoded JSON values are equal, numbers by
// value: jsonb does not give a number back as it was written.
func sameJSON(a, b any) bool {
	switch a := a.(type) {
	case map[string]any:
		b, ok := b.(map[string]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for k, v := range a {
			w, ok := b[k]
			if !ok || !sameJSON(v, w) {
				return false
			}
		}
		return true
	case []any:
		b, ok := b.([]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for i := range a {
			if !sameJSON(a[i], b[i]) {
				return false
			}
		}
		return true
	case json.Number:
		b, ok := b.(json.Number)
		if !ok {
			return false
		}
		x, okA := new(big.Rat).SetString(string(a))
		y, okB := new(big.Rat).SetString(string(b))
		return okA && okB && x.Cmp(y) == 0
	default:
		return a == b // string, bool or nil
	}
}

// Relay configures [RelayOnce].
type Relay struct {
	// Schema holding the outbox tables; "" means the default.
	Schema string
	// Transport receives every instruction of the pass (a fake of the
	// program's rail: a func, a rails.Sandbox, ...).
	Transport rails.Transport
	// Codes classifies the transport's answers; nil means the transport's
	// own table (rails.CodeProvider) or, failing that, "OK" as dispatched.
	Codes rails.CodeTable
	// Catalog gives the rail types to claim and how each validates; nil
	// means payment.DefaultCatalog (sandbox and event).
	Catalog payment.Catalog
}

// TransportFunc adapts a function to rails.Transport: the fake rail of a
// test. Its Result.Code is looked up in Relay.Codes; an error stands for
// no answer at all, classified as rails.CodeTable.Decide says (wrapping
// rails.ErrUnavailable: not sent; anything else: may have been sent, so
// retried under the same key).
type TransportFunc func(ctx context.Context, ins payment.Instruction) (rails.Result, error)

// Send implements rails.Transport.
func (f TransportFunc) Send(ctx context.Context, ins payment.Instruction) (rails.Result, error) {
	return f(ctx, ins)
}

// RelayOnce makes one relay pass in db, as a relayer would (with the
// schema's ordering setting: on unless migrations.SetOrdered turned it
// off): it claims what is due, sends each instruction to r.Transport and
// records the outcomes, all inside db (the test's transaction); a retry
// waits at least an hour ([engine.MaxMinRetryDelay]). It returns
// the recorded outcomes, in claim order. A second call sees what the first
// left: with ordering on, one pass dispatches at most one instruction per
// participant ([Drain] makes passes until nothing is due).
func RelayOnce(ctx context.Context, tb testing.TB, db DB, r Relay) []engine.Recorded {
	tb.Helper()
	catalog := r.Catalog
	if catalog == nil {
		catalog = payment.DefaultCatalog()
	}
	codes := r.Codes
	if cp, ok := r.Transport.(rails.CodeProvider); ok && codes == nil {
		codes = cp.Codes()
	}
	if codes == nil {
		codes = rails.CodeTable{"OK": {Outcome: rails.Dispatched}}
	}
	var opts []rails.Options
	for railType, profile := range catalog {
		opts = append(opts, rails.Options{Type: railType, Profile: profile, Transport: r.Transport, Codes: codes,
			Timeout: 30 * time.Second, Breaker: rails.BreakerOptions{Disabled: true}})
	}
	set, err := rails.NewSet(opts...)
	if err != nil {
		tb.Fatalf("outboxtest: %v", err)
	}
	// Retries wait the longest floor there is (an hour): a pass never
	// makes its own retries due again, so a test sees each retried
	// instruction once however long its Drain takes and whatever the
	// jitter drew (on a pool each pass reads a new now()).
	relayer, err := engine.New(nil, engine.Config{Schema: r.Schema, Rails: set, RelayerID: "outboxtest",
		MinRetryDelay: engine.MaxMinRetryDelay})
	if err != nil {
		tb.Fatalf("outboxtest: %v", err)
	}
	recorded, err := relayer.RelayOnce(ctx, db)
	if err != nil {
		tb.Fatalf("outboxtest: %v", err)
	}
	return recorded
}

// Drain makes relay passes (see [RelayOnce]) in db until one finds nothing
// due, and returns the outcomes of all of them, pass after pass. With
// ordering on, a pass sends at most one instruction per participant, so
// Drain is what sends a participant's whole queue, in sequence order. An
// instruction that gets a retryable answer goes back to pending with a
// backoff of at least an hour ([engine.MaxMinRetryDelay], where a relayer
// draws from zero up); Drain does not wait for it, so it is still pending
// when Drain returns, sent once (its outcome is in the result, with Result
// "retried").
func Drain(ctx context.Context, tb testing.TB, db DB, r Relay) []engine.Recorded {
	tb.Helper()
	var all []engine.Recorded
	for {
		// Each pass records at least one outcome, and an instruction has at
		// most MaxAttempts of them: the loop ends.
		recorded := RelayOnce(ctx, tb, db, r)
		if len(recorded) == 0 {
			return all
		}
		all = append(all, recorded...)
	}
}
