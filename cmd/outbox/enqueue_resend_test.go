package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"syscall"
	"testing"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ledgerline/outbox/pending"
)

// scriptedEnqueuer is an enqueuer whose database answers with errs, one
// per call, then with receipts; calls counts the sends.
func scriptedEnqueuer(t *testing.T, out io.Writer, calls *int, errs ...error) *enqueuer {
	t.Helper()
	producer, err := pending.NewProducer(pending.Config{})
	if err != nil {
		t.Fatal(err)
	}
	e := &enqueuer{producer: producer, out: json.NewEncoder(out), log: slog.New(slog.DiscardHandler)}
	e.send = func(_ context.Context, ins []pending.Instruction) ([]pending.Receipt, error) {
		*calls++
		if *calls <= len(errs) {
			if len(ins) == 1 { // as enqueuer.enqueue reports a single line's error
				return nil, &pending.BatchError{Index: 0, Err: errs[*calls-1]}
			}
			return nil, errs[*calls-1]
		}
		rs := make([]pending.Receipt, len(ins))
		for i := range rs {
			rs[i] = pending.Receipt{OutboxID: uuid.Must(uuid.NewV4()), SequenceID: 1}
		}
		return rs, nil
	}
	return e
}

// TestEnqueueResendsOnlyTransientErrors: `outbox enqueue` sends a batch
// again only when the database's failure may pass: a connection that
// broke (the outcome is unknown), the server shutting down, a
// serialization failure or deadlock (rolled back, so sending again is the
// fix). Any other DATABASE_ERROR, such as the store's own "idempotency
// key not found after insert" or a constraint violation, is reported at
// once: it was sent again three times, failing the same way each time,
// while the log said the transaction "may have committed". (A batch of
// several lines refused so is sent line by line, each line once, so that
// a line's refusal fails that line only.)
func TestEnqueueResendsOnlyTransientErrors(t *testing.T) {
	t.Parallel()
	cut := &pgconnLikeError{err: io.ErrUnexpectedEOF}
	reset := &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
	for _, tt := range []struct {
		name  string
		err   error
		sends int // how many times the batch is sent
		ok    bool
	}{
		{"store invariant", errors.New("enqueue: instruction 0: idempotency key not found after insert"), 1, false},
		{"unique violation", &pgconn.PgError{Code: "23505", Message: "duplicate key"}, 1, false},
		{"check violation", &pgconn.PgError{Code: "23514", Message: "check"}, 1, false},
		{"undefined table", &pgconn.PgError{Code: "42P01", Message: "relation does not exist"}, 1, false},
		{"reply cut", fmt.Errorf("commit: %w", cut), 2, true},
		{"connection reset", fmt.Errorf("commit: %w", reset), 2, true},
		{"conn closed", fmt.Errorf("begin: %w", pgconn.ErrConnClosed), 2, true},
		{"admin shutdown", &pgconn.PgError{Code: "57P01", Message: "terminating connection due to administrator command"}, 2, true},
		{"connection failure", &pgconn.PgError{Code: "08006", Message: "connection failure"}, 2, true},
		{"serialization failure", &pgconn.PgError{Code: "40001", Message: "could not serialize access"}, 2, true},
		{"deadlock", &pgconn.PgError{Code: "40P01", Message: "deadlock detected"}, 2, true},
	} {
		for _, lines := range []int{1, 2} {
			var out bytes.Buffer
			calls := 0
			script := []error{tt.err}
			if !tt.ok { // failing every time: only the count of sends differs
				script = []error{tt.err, tt.err, tt.err, tt.err, tt.err}
			}
			e := scriptedEnqueuer(t, &out, &calls, script...)
			for i := range lines {
				e.add(t.Context(), inputLineOf(t, fmt.Sprintf("k%d", i)), nil)
			}
			e.flush(t.Context())
			want := tt.sends
			if !tt.ok && lines > 1 {
				want += lines // then each line on its own, once
			}
			if calls != want {
				t.Errorf("%s, %d lines: sent %d times, want %d", tt.name, lines, calls, want)
			}
			got := stdoutLines(t, out.String())
			if len(got) != lines {
				t.Fatalf("%s: %d output lines for %d input lines: %s", tt.name, len(got), lines, out.String())
			}
			for _, l := range got {
				dl := decodeEnqueueLine(t, l)
				switch {
				case tt.ok && !dl.receipt:
					t.Errorf("%s, %d lines: %s, want a receipt", tt.name, lines, l)
				case !tt.ok && (dl.receipt || dl.code != codeDatabaseError || !strings.Contains(l, "SQLSTATE") && !strings.Contains(l, "not found after insert")):
					t.Errorf("%s, %d lines: %s, want DATABASE_ERROR with the database's message", tt.name, lines, l)
				}
			}
		}
	}
}

// pgconnLikeError is how pgconn reports a reply it could not read (its
// own type is unexported): not safe to retry, as the query was sent.
type pgconnLikeError struct{ err error }

func (e *pgconnLikeError) Error() string     { return "failed to receive message: " + e.err.Error() }
func (e *pgconnLikeError) Unwrap() error     { return e.err }
func (e *pgconnLikeError) SafeToRetry() bool { return false }

// inputLineOf is a valid sandbox instruction under key.
func inputLineOf(t *testing.T, key string) inputLine {
	t.Helper()
	var l inputLine
	if err := decodeLine([]byte(inputJSON("p-"+key, key, "100")), &l); err != nil {
		t.Fatal(err)
	}
	return l
}

// TestEnqueueBatchTooLargeIsSentLineByLine: a --batch whose payloads
// pass pending.MaxBatchPayloadBytes is refused by the producer before
// anything is sent; each of its lines is then sent on its own and
// enqueued, and the log says why, not that the database refused it.
func TestEnqueueBatchTooLargeIsSentLineByLine(t *testing.T) {
	t.Parallel()
	var out, log bytes.Buffer
	calls := 0
	e := scriptedEnqueuer(t, &out, &calls, &pending.BatchTooLargeError{Instructions: 2, PayloadBytes: pending.MaxBatchPayloadBytes + 1,
		MaxInstructions: pending.MaxBatchSize, MaxPayloadBytes: pending.MaxBatchPayloadBytes})
	e.log = slog.New(slog.NewTextHandler(&log, nil))
	for i := range 2 {
		e.add(t.Context(), inputLineOf(t, fmt.Sprintf("k%d", i)), nil)
	}
	e.flush(t.Context())
	if calls != 3 {
		t.Errorf("sent %d times, want the batch once and each line once", calls)
	}
	for _, l := range stdoutLines(t, out.String()) {
		if !decodeEnqueueLine(t, l).receipt {
			t.Errorf("%s, want a receipt", l)
		}
	}
	if strings.Contains(log.String(), "database refused") || !strings.Contains(log.String(), "too large") {
		t.Errorf("log %q: want it to say the batch was too large, not that the database refused it", log.String())
	}
}
