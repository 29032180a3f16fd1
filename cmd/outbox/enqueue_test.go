package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ledgerline/outbox/pending"
)

// TestEnqueueRefusesAmbiguousLines: a line that names a field twice, in
// the same or another letter case, or a field in another case than the
// documented one, is refused naming the field, and writes nothing;
// encoding/json took the last occurrence case-insensitively, so a gateway
// that checked the first approved a different payment from the one queued.
// Good lines around it are enqueued.
func TestEnqueueRefusesAmbiguousLines(t *testing.T) {
	t.Parallel()
	attack := `{"instruction_id":"ins-a","participant_id":"p1","idempotency_key":"k-a","rail":"sandbox",` +
		`"amount_minor":100,"currency":"USD","destination":"acct-1","AMOUNT_MINOR":99999999,"Destination":"attacker-acct"}`
	twice := `{"instruction_id":"ins-b","instruction_id":"ins-c","participant_id":"p1","idempotency_key":"k-b",` +
		`"rail":"sandbox","amount_minor":100,"currency":"USD","destination":"acct-1"}`
	cased := `{"Instruction_ID":"ins-d","participant_id":"p1","idempotency_key":"k-d","rail":"sandbox",` +
		`"amount_minor":100,"currency":"USD","destination":"acct-1"}`
	input := strings.Join([]string{inputJSON("p1", "k1", "100"), attack, twice, cased, inputJSON("p1", "k2", "200")}, "\n")
	for _, args := range [][]string{nil, {"--batch", "10"}} {
		b := setupCLI(t)
		r := b.cli(t, input, "enqueue", args...)
		requireExit(t, r, 1)
		checkEnqueueOutput(t, r.stdout, []wantLine{
			wantReceipt(1), wantInvalidInput("AMOUNT_MINOR"), wantInvalidInput("instruction_id"),
			wantInvalidInput("Instruction_ID"), wantReceipt(2),
		})
		if n := b.count(t, "idempotency_keys"); n != 2 {
			t.Fatalf("%v: %d instructions enqueued, want the 2 good ones", args, n)
		}
		var attacker int
		if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox.pending
			WHERE payload->>'destination' = 'attacker-acct' OR (payload->>'amount_minor')::bigint = 99999999`).Scan(&attacker); err != nil {
			t.Fatal(err)
		}
		if attacker != 0 {
			t.Fatalf("%v: the attacker's amount or destination was queued", args)
		}
	}
}

// TestEnqueueRefusesInvalidUTF8: two keys that differ only in invalid
// bytes are two different instructions. Replacing the bytes with U+FFFD
// made the second a "duplicate" of the first, and it was never paid; now
// both are refused as invalid input, nothing written.
func TestEnqueueRefusesInvalidUTF8(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	line := func(key string) string {
		return `{"instruction_id":"ins-` + key + `","participant_id":"p1","idempotency_key":"` + key +
			`","rail":"sandbox","amount_minor":100,"currency":"USD","destination":"acct-1"}`
	}
	metaBad := `{"instruction_id":"ins-m","participant_id":"p1","idempotency_key":"k-m","rail":"sandbox",` +
		`"amount_minor":100,"currency":"USD","destination":"acct-1","metadata":{"note":"` + "caf\xe9" + `"}}`
	input := strings.Join([]string{line("key-\xff"), line("key-\xfe"), metaBad, line(`key-\udcff`)}, "\n")
	r := b.cli(t, input, "enqueue")
	requireExit(t, r, 1)
	checkEnqueueOutput(t, r.stdout, []wantLine{
		wantInvalidInput("instruction_id"), wantInvalidInput("instruction_id"), // the first bad field of the line
		wantInvalidInput("note"), wantInvalidInput("instruction_id"),
	})
	if n := b.count(t, "idempotency_keys"); n != 0 {
		t.Fatalf("%d instructions enqueued from invalid UTF-8, want none", n)
	}
	// The flag path refuses it too, by the same rule.
	r = b.cli(t, "", "enqueue", "--instruction-id", "ins-f", "--participant-id", "p1", "--idempotency-key", "key-\xff",
		"--rail", "sandbox", "--amount-minor", "100", "--currency", "USD", "--destination", "acct-1")
	requireExit(t, r, 1)
	checkEnqueueOutput(t, r.stdout, []wantLine{wantValidation("idempotency_key")})
}

// TestEnqueueNULMetadataDoesNotSinkItsBatch: a \u0000 in metadata is
// refused up front, as a validation error of that line; the good lines of
// the same --batch are enqueued (PostgreSQL used to refuse the whole batch).
func TestEnqueueNULMetadataDoesNotSinkItsBatch(t *testing.T) {
	t.Parallel()
	badMetadataDoesNotSinkItsBatch(t, map[string]any{"note": "a\x00b"})
}

// badMetadataDoesNotSinkItsBatch enqueues a --batch of 10 lines whose
// sixth carries metadata, which must be refused up front as that line's
// validation error while the 9 good lines are enqueued.
func badMetadataDoesNotSinkItsBatch(t *testing.T, metadata map[string]any) {
	t.Helper()
	b := setupCLI(t)
	var lines []string
	for i, key := range []string{"k1", "k2", "k3", "k4", "k5", "k-bad", "k6", "k7", "k8", "k9"} {
		if key == "k-bad" {
			lines = append(lines, inputJSON("p1", key, "100", "metadata", metadata))
			continue
		}
		lines = append(lines, inputJSON("p"+string(rune('a'+i)), key, "100"))
	}
	r := b.cli(t, strings.Join(lines, "\n"), "enqueue", "--batch", "10")
	requireExit(t, r, 1)
	want := make([]wantLine, 10)
	for i := range want {
		want[i] = wantReceipt(1)
	}
	want[5] = wantValidation("metadata")
	checkEnqueueOutput(t, r.stdout, want)
	if n := b.count(t, "idempotency_keys"); n != 9 {
		t.Fatalf("%d instructions enqueued, want the 9 good ones", n)
	}
}

// TestEnqueueIgnoresInstructionEnv: per-instruction fields never come from
// the environment: an inherited OUTBOX_AMOUNT_MINOR or
// OUTBOX_DESTINATION supplies nothing, on stdin or with flags.
func TestEnqueueIgnoresInstructionEnv(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	vars := map[string]string{"OUTBOX_DATABASE_URL": b.url, "OUTBOX_AMOUNT_MINOR": "99999999",
		"OUTBOX_DESTINATION": "attacker-acct", "OUTBOX_CURRENCY": "EUR"}
	r := invokeCLI(t, vars, inputJSON("p1", "k1", "", "amount_minor", nil)+"\n", "enqueue")
	requireExit(t, r, 1)
	checkEnqueueOutput(t, r.stdout, []wantLine{wantValidation("amount_minor")})

	r = invokeCLI(t, vars, "", "enqueue", "--instruction-id", "ins-2", "--participant-id", "p1",
		"--idempotency-key", "k2", "--rail", "sandbox", "--currency", "USD")
	requireExit(t, r, 1)
	checkEnqueueOutput(t, r.stdout, []wantLine{wantValidation("amount_minor")})
	if n := b.count(t, "idempotency_keys"); n != 0 {
		t.Fatalf("%d instructions enqueued with values from the environment", n)
	}

	help := invokeCLI(t, nil, "", "enqueue", "--help")
	if !strings.Contains(help.stderr, "--amount-minor  [command line only]") || !strings.Contains(help.stderr, "--database-url  [OUTBOX_DATABASE_URL]") {
		t.Errorf("help does not say which flags are command line only:\n%s", help.stderr)
	}
}

// cancelOnWrite cancels a context at its first write (the first output
// line of `outbox enqueue`), as a SIGTERM arriving at that moment would.
type cancelOnWrite struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	cancel context.CancelFunc
}

func (w *cancelOnWrite) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.cancel()
	return w.buf.Write(p)
}

// TestEnqueueInterruptedSaysInputWasNotRead guards scripts such as
// `outbox enqueue < batch.jsonl && mark-done`: interrupted part way
// through, enqueue stopped reading stdin and exited 0, so the lines it
// never read were taken as done. It must exit non-zero and say on stderr
// that the rest of stdin was not read and not enqueued.
func TestEnqueueInterruptedSaysInputWasNotRead(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	lines := []string{inputJSON("p1", "k1", "100"), inputJSON("p2", "k2", "200"), inputJSON("p3", "k3", "300")}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	out := &cancelOnWrite{cancel: cancel}
	var stderr bytes.Buffer
	env := &environment{stdin: strings.NewReader(strings.Join(lines, "\n") + "\n"), stdout: out, stderr: &stderr,
		getenv: func(string) string { return "" }}
	err := run(ctx, env, []string{"enqueue", "--database-url", b.url})
	if !errors.Is(err, errInterrupted) || !errors.Is(err, context.Canceled) {
		t.Errorf("run = %v, want errInterrupted wrapping context.Canceled", err)
	}
	code := exitCode(env, err)
	n := b.count(t, "idempotency_keys")
	if code == 0 || n != 1 {
		t.Fatalf("exit %d with %d of %d lines enqueued (stdout %q, stderr %q): want exit non-zero with just the first line in",
			code, n, len(lines), out.buf.String(), stderr.String())
	}
	if msg := stderr.String(); !strings.Contains(msg, "after reading 1 input lines") || !strings.Contains(msg, "not read and not enqueued") {
		t.Errorf("stderr does not say what was left unread: %q", msg)
	}
}

// TestClassifyRetiredKey: a key retired with its archive months is refused
// forever, as the key's own answer, not the database's trouble: it was
// reported as DATABASE_ERROR, which invites a retry that cannot succeed.
func TestClassifyRetiredKey(t *testing.T) {
	t.Parallel()
	for _, err := range []error{
		&pending.RetiredError{InstructionID: "ins-1", IdempotencyKey: "k1"},
		fmt.Errorf("enqueue: %w: key_retired_race", pending.ErrKeyRetired),
	} {
		got := classify(err)
		if got.Code != "KEY_RETIRED" || got.Field != "idempotency_key" || got.Message != err.Error() {
			t.Errorf("%v: %+v, want KEY_RETIRED on idempotency_key", err, got)
		}
	}
	if got := classify(errors.New("connection refused")); got.Code != "DATABASE_ERROR" {
		t.Errorf("a database error: %+v", got)
	}
}

// TestClassifyKeyWithoutInstruction: a key inserted outside an enqueue
// is refused for good, on the key, and not sent again; it was a
// DATABASE_ERROR (or a mismatch naming an instruction never enqueued).
func TestClassifyKeyWithoutInstruction(t *testing.T) {
	t.Parallel()
	err := &pending.BatchError{Index: 0, Err: &pending.KeyWithoutInstructionError{InstructionID: "ins-1", IdempotencyKey: "k1"}}
	got := classify(err)
	if got.Code != "KEY_WITHOUT_INSTRUCTION" || got.Field != "idempotency_key" || got.Message != err.Error() {
		t.Errorf("%v: %+v, want KEY_WITHOUT_INSTRUCTION on idempotency_key", err, got)
	}
	if why := resendable(context.Background(), err); why != "" {
		t.Errorf("%v is sent again (%s), want it reported at once", err, why)
	}
}

// TestEnqueueInterruptedWhileWaitingForInput: an interrupt while stdin is
// open but sends nothing stops enqueue at once (it waited for the next
// line, and if stdin then closed, exited 0 as if nothing had happened),
// and the batch it holds is still enqueued (the interrupt cancelled its
// write: every line of it failed with DATABASE_ERROR "context canceled").
func TestEnqueueInterruptedWhileWaitingForInput(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	held := []string{inputJSON("p1", "k1", "100"), inputJSON("p2", "k2", "200"), inputJSON("p3", "k3", "300")}
	// stdin gives the three lines, then, asked for more, interrupts and
	// waits: by then each line was handed on and taken into the batch.
	stdin := &interruptingReader{data: []byte(strings.Join(held, "\n") + "\n"), interrupt: cancel, block: make(chan struct{})}
	defer close(stdin.block)
	var stdout, stderr bytes.Buffer
	env := &environment{stdin: stdin, stdout: &stdout, stderr: &stderr, getenv: func(string) string { return "" }}
	done := make(chan error, 1)
	go func() { done <- run(ctx, env, []string{"enqueue", "--database-url", b.url, "--batch", "5"}) }()
	var err error
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("enqueue did not stop on the interrupt while waiting for input")
	}
	if !errors.Is(err, errInterrupted) || exitCode(env, err) == 0 {
		t.Fatalf("run = %v (exit %d), want interrupted, non-zero", err, exitCode(env, err))
	}
	if n := b.count(t, "pending"); n != 3 {
		t.Fatalf("%d of the 3 held lines enqueued (stdout %q, stderr %q)", n, stdout.String(), stderr.String())
	}
	checkEnqueueOutput(t, stdout.String(), []wantLine{wantReceipt(1), wantReceipt(1), wantReceipt(1)})
	if msg := stderr.String() + err.Error(); !strings.Contains(msg, "after reading 3 input lines") {
		t.Errorf("the interrupt does not say how many lines were read: %q", msg)
	}
}

// interruptingReader returns data, then, on the next read, calls interrupt
// and blocks until block is closed: a terminal or a pipe that stays open.
type interruptingReader struct {
	data      []byte
	interrupt func()
	block     chan struct{}
}

func (r *interruptingReader) Read(p []byte) (int, error) {
	if len(r.data) > 0 {
		n := copy(p, r.data)
		r.data = r.data[n:]
		return n, nil
	}
	r.interrupt()
	<-r.block
	return 0, io.EOF
}

// TestEnqueueNullMetadataIsNone: a line's null is the field left out, for
// metadata as for every other optional field; a JSON encoder writes a nil
// map or raw message as null, and such lines were refused as
// VALIDATION_FAILED on metadata. The line is the instruction without
// metadata: the same line without the member is its duplicate.
func TestEnqueueNullMetadataIsNone(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	withNull := strings.TrimSuffix(inputJSON("p1", "k1", "100"), "}") + `,"metadata":null,"tenant_id":null,"correlation_id":null}`
	input := strings.Join([]string{withNull, inputJSON("p1", "k1", "100"), inputJSON("p1", "k2", "200")}, "\n")
	r := b.cli(t, input, "enqueue", "--batch", "3")
	requireExit(t, r, 0)
	checkEnqueueOutput(t, r.stdout, []wantLine{wantReceipt(1), wantDup(0, 1), wantReceipt(2)})
	var meta bool
	if err := b.pool.QueryRow(b.ctx, `SELECT payload ? 'metadata' FROM outbox.pending WHERE idempotency_key = 'k1'`).Scan(&meta); err != nil {
		t.Fatal(err)
	}
	if meta {
		t.Error("the null metadata was stored")
	}
	// An event rail, whose metadata is the event, still needs one.
	event := `{"instruction_id":"ins-e","participant_id":"p2","idempotency_key":"k-e","rail":"event","metadata":null}`
	r = b.cli(t, event, "enqueue")
	requireExit(t, r, 1)
	checkEnqueueOutput(t, r.stdout, []wantLine{wantValidation("metadata")})
}

// TestEnqueueLineEndings: lines ending in CRLF, and a last line without a
// newline, are read as the others; a line that begins with a byte order
// mark is not JSON and fails alone as INVALID_INPUT, writing nothing.
func TestEnqueueLineEndings(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	input := "\ufeff" + inputJSON("p1", "k-bom", "100") + "\r\n" + inputJSON("p1", "k1", "100") + "\r\n\r\n" +
		inputJSON("p1", "k2", "200")
	r := b.cli(t, input, "enqueue", "--batch", "3")
	requireExit(t, r, 1)
	checkEnqueueOutput(t, r.stdout, []wantLine{wantInvalidInput(""), wantReceipt(1), wantReceipt(2)})
	if n := b.count(t, "idempotency_keys"); n != 2 {
		t.Errorf("%d instructions enqueued, want the 2 good ones", n)
	}
}

// TestEnqueueBatchFlagOutOfRange: --batch past pending.MaxBatchSize could
// only fill batches EnqueueBatch refuses, and a negative one (a flipped
// sign) silently meant one line per transaction: both are usage errors,
// exit 2 naming the flag, before anything is read or written.
func TestEnqueueBatchFlagOutOfRange(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	for _, v := range []string{"-5", strconv.Itoa(pending.MaxBatchSize + 1)} {
		r := b.cli(t, inputJSON("p-batch", "k-batch"+v, "100")+"\n", "enqueue", "--batch", v)
		if r.code != 2 || !strings.Contains(r.stderr, "--batch") || r.stdout != "" {
			t.Errorf("enqueue --batch %s: want exit 2 naming --batch, got %s", v, r)
		}
	}
	var n int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox.pending`).Scan(&n); err != nil || n != 0 {
		t.Errorf("refused commands enqueued %d (%v)", n, err)
	}
	r := b.cli(t, inputJSON("p-batch", "k-batch-max", "100")+"\n", "enqueue", "--batch", strconv.Itoa(pending.MaxBatchSize))
	requireExit(t, r, 0)
}

// TestEnqueueStdinTakesALineAtARaisedPayloadLimit: a stdin line was
// refused past 1 MiB whatever --max-payload-bytes said, so a producer
// whose limit was raised past it could enqueue its large instructions
// from flags only: "line is longer than 1048576 bytes". A line is now
// taken up to what a payload at the limit can take written out (every
// character escaped, as rails.WebhookBodyLimit counts a webhook body).
func TestEnqueueStdinTakesALineAtARaisedPayloadLimit(t *testing.T) {
	t.Parallel()
	b := setupCLI(t)
	const limit = 2 << 20
	line := inputJSON("p-big", "k-big", "100", "metadata", map[string]any{"note": strings.Repeat("a", 3<<19)}) // 1.5 MiB
	r := b.cli(t, line+"\n", "enqueue", "--max-payload-bytes", strconv.Itoa(limit))
	requireExit(t, r, 0)
	var n int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM outbox.pending WHERE idempotency_key = 'k-big'`).Scan(&n); err != nil || n != 1 {
		t.Errorf("the 1.5 MiB line under a 2 MiB limit: %d enqueued (%v); output %s", n, err, r)
	}
}
