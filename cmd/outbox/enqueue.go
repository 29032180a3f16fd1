package main

import (
	"bufio"
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
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ledgerline/outbox/internal/strictjson"
	"github.com/ledgerline/outbox/payment"
	"github.com/ledgerline/outbox/pending"
	"github.com/ledgerline/outbox/poolconfig"
	"github.com/ledgerline/outbox/rails"
)

// maxLineBytes bounds one JSON input line at the default payload limit
// (its payload written out with every character escaped, and the
// envelope, fit); see lineLimit for a raised one.
const maxLineBytes = 1 << 20

// lineLimit bounds one JSON input line for producers whose payload limit
// is maxPayload: maxLineBytes, or room for a payload at the limit written
// with every character escaped (six bytes each) and its envelope, as
// rails.WebhookBodyLimit bounds a webhook body. At 1 MiB whatever the
// limit, a raised limit's large instructions could be enqueued from flags
// only.
func lineLimit(maxPayload int) int {
	return int(max(maxLineBytes, rails.WebhookBodyLimit(maxPayload)))
}

// inputLine is one instruction as JSON, the format of `outbox enqueue`
// stdin. It is decoded strictly (see internal/strictjson): a member named
// twice, a member whose letter case differs from these names, an unknown
// member, invalid UTF-8 or trailing data fail the line.
type inputLine struct {
	InstructionID  string          `json:"instruction_id"`
	ParticipantID  string          `json:"participant_id"`
	IdempotencyKey string          `json:"idempotency_key"`
	Rail           string          `json:"rail"`
	AmountMinor    json.RawMessage `json:"amount_minor"` // a JSON number, or a string holding one
	Currency       string          `json:"currency"`
	Destination    string          `json:"destination"`
	TenantID       string          `json:"tenant_id"`
	CorrelationID  string          `json:"correlation_id"`
	Metadata       json.RawMessage `json:"metadata"`
}

// instructionFlags are the flags that describe one instruction. They are
// read from the command line only, never from OUTBOX_* variables: an
// inherited OUTBOX_AMOUNT_MINOR must not supply an amount.
var instructionFlags = []string{"instruction-id", "participant-id", "idempotency-key", "rail", "amount-minor",
	"currency", "destination", "tenant-id", "correlation-id", "metadata"}

// Error codes of `outbox enqueue` output lines besides the rails taxonomy.
const (
	codeInvalidInput = "INVALID_INPUT"
	codeMismatch     = "IDEMPOTENCY_MISMATCH"
	// codeInstructionReused is an instruction id enqueued under a second
	// key (migration 030): refused for good, on the instruction id.
	codeInstructionReused = "INSTRUCTION_ID_REUSED"
	codeKeyRetired        = "KEY_RETIRED"
	// codeKeyWithoutInstruction is a key inserted outside an enqueue:
	// refused for good, until the owner looks at the row.
	codeKeyWithoutInstruction = "KEY_WITHOUT_INSTRUCTION"
	codeDatabaseError         = "DATABASE_ERROR"
	// codeReadOnly is a line the database refused as read-only (a
	// standby's connection, a read-only session): nothing was enqueued,
	// and the line goes through on the primary, under the same key.
	codeReadOnly = "READ_ONLY"
	// codePermissionDenied is a line the database refused for a privilege
	// the session's role lacks (42501, pending.ErrPermissionDenied: a
	// tenant it may not write for, a role without its grants): nothing
	// was enqueued, and sending it again as the same role fails alike; a
	// configuration to fix, not the database's trouble.
	codePermissionDenied = "PERMISSION_DENIED"
	// codeCommitUnknown is a line whose transaction may have committed
	// (its connection broke after the statements were sent) and whose
	// resends under the same keys all failed: send it again under the
	// same key, never a new one.
	codeCommitUnknown = "COMMIT_UNKNOWN"
)

type lineError struct {
	Code    string `json:"code"`
	Field   string `json:"field,omitempty"`
	Message string `json:"message"`
}

type lineResult struct {
	receipt *pending.Receipt
	err     *lineError
}

func (r lineResult) MarshalJSON() ([]byte, error) {
	if r.err != nil {
		return json.Marshal(struct {
			Error *lineError `json:"error"`
		}{r.err})
	}
	return json.Marshal(r.receipt)
}

func (l inputLine) instruction() (pending.Instruction, error) {
	if string(bytes.TrimSpace(l.Metadata)) == "null" {
		// null is the member left out, as for every other field: JSON
		// encoders write a nil map or raw message so.
		l.Metadata = nil
	}
	in := pending.Instruction{
		InstructionID: l.InstructionID, ParticipantID: l.ParticipantID, IdempotencyKey: l.IdempotencyKey,
		RailType: l.Rail, Currency: l.Currency, Destination: l.Destination,
		TenantID: l.TenantID, CorrelationID: l.CorrelationID, Metadata: l.Metadata,
	}
	amount, err := amountText(l.AmountMinor)
	if err != nil || amount == "" {
		return in, err
	}
	in.AmountMinor, err = payment.ParseAmountMinor(amount)
	return in, err
}

// amountText is the amount as written: a JSON number's text, or the
// content of a JSON string ("" when absent or null).
func amountText(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	switch {
	case len(raw) == 0 || string(raw) == "null":
		return "", nil
	case raw[0] == '"':
		var s string
		if err := strictjson.Unmarshal(raw, &s); err != nil {
			return "", err
		}
		return s, nil
	case raw[0] == '-' || raw[0] >= '0' && raw[0] <= '9':
		return string(raw), nil
	}
	return "", payment.Invalid(payment.FieldAmount, payment.ReasonInvalid, "amount_minor must be a number of minor units")
}

// classify turns an enqueue error into an output error object.
func classify(err error) *lineError {
	var verr *payment.ValidationError
	var merr *pending.MismatchError
	var jerr *strictjson.Error
	switch {
	case errors.As(err, &verr):
		return &lineError{Code: string(rails.CodeValidationFailed), Field: verr.Field, Message: verr.Message}
	case errors.Is(err, pending.ErrInstructionIDReused):
		// Before the mismatch: it is one too (errors.Is), but the key is
		// new; the instruction id is what was used again.
		return &lineError{Code: codeInstructionReused, Field: payment.FieldInstructionID, Message: err.Error()}
	case errors.As(err, &merr):
		return &lineError{Code: codeMismatch, Field: payment.FieldIdempotencyKey, Message: merr.Error()}
	case errors.Is(err, pending.ErrKeyRetired):
		// Refused for good, like a mismatch: a retry will not help, so it
		// must not read as the database's trouble.
		return &lineError{Code: codeKeyRetired, Field: payment.FieldIdempotencyKey, Message: err.Error()}
	case errors.Is(err, pending.ErrKeyWithoutInstruction):
		return &lineError{Code: codeKeyWithoutInstruction, Field: payment.FieldIdempotencyKey, Message: err.Error()}
	case errors.As(err, &jerr):
		return &lineError{Code: codeInvalidInput, Field: jerr.Name, Message: "not a valid instruction: " + jerr.Error()}
	case errors.Is(err, pending.ErrReadOnly):
		return &lineError{Code: codeReadOnly, Message: err.Error() + " (a standby, or a read-only session: send it again to the primary, under the same key)"}
	case errors.Is(err, pending.ErrPermissionDenied):
		return &lineError{Code: codePermissionDenied, Message: err.Error() + " (the session's role may not write this line: its tenant, or the role's grants; send it again under the same key as a role that may)"}
	default:
		return &lineError{Code: codeDatabaseError, Message: err.Error()}
	}
}

func runEnqueue(ctx context.Context, env *environment, args []string) error {
	fs := newFlagSet(env, "enqueue", "enqueue [flags]   (no instruction flags: JSON lines on stdin)")
	var db dbFlags
	db.register(fs, poolconfig.Producer())
	var line inputLine
	var amount, metadata string
	fs.StringVar(&line.InstructionID, "instruction-id", "", "instruction id")
	fs.StringVar(&line.ParticipantID, "participant-id", "", "participant id")
	fs.StringVar(&line.IdempotencyKey, "idempotency-key", "", "idempotency key")
	fs.StringVar(&line.Rail, "rail", "", "rail type (e.g. sandbox, event)")
	fs.StringVar(&amount, "amount-minor", "", "amount in minor units (cents)")
	fs.StringVar(&line.Currency, "currency", "", "ISO 4217 currency code")
	fs.StringVar(&line.Destination, "destination", "", "destination in the rail's format")
	fs.StringVar(&line.TenantID, "tenant-id", "", "tenant id (optional)")
	fs.StringVar(&line.CorrelationID, "correlation-id", "", "correlation id (optional)")
	fs.StringVar(&metadata, "metadata", "", "metadata JSON object (optional)")
	batch := fs.Int("batch", 0, fmt.Sprintf("stdin mode: enqueue N lines per transaction (0: each line its own transaction; at most %d)", pending.MaxBatchSize))
	maxPayload := fs.Int("max-payload-bytes", payment.DefaultMaxPayloadBytes, "largest accepted payload")
	railsConfig := fs.String("rails-config", "", "rail configuration file (as for relay): the rail types and validation profiles to accept; empty: sandbox and event")
	logFormat := fs.String("log-format", "text", "log format: text or json")
	commandLineOnly(fs, instructionFlags...)
	onCommandLine, err := parseFlags(fs, env, args)
	if err != nil {
		return err
	}
	// Only instruction flags select single mode (and they come from the
	// command line only).
	single := false
	for _, name := range instructionFlags {
		single = single || onCommandLine[name]
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected arguments %q", errUsage, fs.Args())
	}
	if *batch < 0 || *batch > pending.MaxBatchSize {
		// Negative is a flipped sign, not one line per transaction; past
		// the producer's limit every full batch would be refused.
		return fmt.Errorf("%w: --batch %d is out of range: 0 (each line its own transaction) to %d", errUsage, *batch, pending.MaxBatchSize)
	}
	log, err := newLogger(env.stderr, *logFormat, "warn")
	if err != nil {
		return err
	}
	var catalog payment.Catalog
	if *railsConfig != "" {
		cfg, err := rails.LoadConfig(*railsConfig)
		if err == nil {
			catalog, err = cfg.Catalog()
		}
		if err != nil {
			return fmt.Errorf("%w: rails configuration: %v", errUsage, err)
		}
	}
	producer, err := pending.NewProducer(pending.Config{Schema: db.schema, MaxPayloadBytes: *maxPayload, Rails: catalog})
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	pool, cleanup, err := db.connect(ctx, log, 4)
	if err != nil {
		return err
	}
	defer cleanup()

	e := &enqueuer{producer: producer, pool: pool, out: json.NewEncoder(env.stdout), log: log}
	if single {
		if amount != "" {
			line.AmountMinor, _ = json.Marshal(amount) // a JSON string: amountText reads it back as written
		}
		if metadata != "" {
			line.Metadata = json.RawMessage(metadata)
		}
		e.add(ctx, line, nil)
		e.flush(ctx)
	} else {
		if err := e.readLines(ctx, env.stdin, max(*batch, 1), lineLimit(*maxPayload)); err != nil {
			return err
		}
	}
	if e.failed > 0 {
		return exitError{code: 1}
	}
	return nil
}

// enqueuer turns input lines into output lines, in order, batching valid
// instructions into transactions.
type enqueuer struct {
	producer *pending.Producer
	pool     *pgxpool.Pool
	out      *json.Encoder
	log      *slog.Logger
	failed   int
	// send enqueues a batch; nil means enqueue (tests script the
	// database's answers with it).
	send func(ctx context.Context, ins []pending.Instruction) ([]pending.Receipt, error)

	results []lineResult // output for the current batch, in input order
	batch   []pending.Instruction
	slots   []int // index into results for each batch entry
}

// errInterrupted is returned (wrapped with the context's cause) when
// reading stdin stopped before its end: a script must not take a batch as
// done when part of it was never read.
var errInterrupted = errors.New("interrupted")

// readLines reads stdin line by line, enqueuing batches of batchSize, until
// its end or until ctx is done (an interrupt). An interrupt stops the
// reading at once, even while stdin is waiting for input, but not the
// database work: the batch held (lines already read, validated and
// answered for) is still enqueued, with its own deadline, and a write in
// progress is not cut off mid-commit, where whether it committed would be
// unknown.
func (e *enqueuer) readLines(ctx context.Context, r io.Reader, batchSize, maxLine int) error {
	work, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	br := bufio.NewReaderSize(r, 64<<10)
	type read struct {
		raw     []byte
		tooLong bool
		err     error
	}
	// The reader runs one line ahead at most; left blocked on stdin after
	// an interrupt, it ends with the process.
	reads := make(chan read)
	go func() {
		for {
			raw, tooLong, err := readLine(br, maxLine)
			select {
			case reads <- read{raw, tooLong, err}:
			case <-work.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	interrupted := func(lines int) error {
		// Lines already read have their output lines (those of the last
		// batch say whether it got in); the rest were never read.
		e.flushWithin(work)
		return fmt.Errorf("enqueue %w (%w) after reading %d input lines: the rest of stdin, if any, was not read and not enqueued",
			errInterrupted, context.Cause(ctx), lines)
	}
	lines := 0
	for {
		// An interrupt wins over a line that is ready.
		if ctx.Err() != nil {
			return interrupted(lines)
		}
		var rd read
		select {
		case <-ctx.Done():
			return interrupted(lines)
		case rd = <-reads:
		}
		if len(rd.raw) > 0 || rd.tooLong {
			lines++
		}
		if rd.tooLong || len(bytes.TrimSpace(rd.raw)) > 0 {
			var line inputLine
			var perr error
			if rd.tooLong {
				perr = fmt.Errorf("line is longer than %d bytes", maxLine)
			} else {
				perr = decodeLine(rd.raw, &line)
			}
			e.add(work, line, perr)
			if len(e.results) >= batchSize {
				e.flush(work)
			}
		}
		if rd.err == io.EOF {
			break
		}
		if rd.err != nil {
			e.flushWithin(work)
			return fmt.Errorf("read stdin: %w", rd.err)
		}
	}
	e.flush(work)
	return nil
}

// finishTimeout bounds the enqueue of the batch held when reading stops
// early (an interrupt, a read error).
const finishTimeout = 30 * time.Second

// flushWithin is flush with finishTimeout as its deadline.
func (e *enqueuer) flushWithin(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, finishTimeout)
	defer cancel()
	e.flush(ctx)
}

// readLine reads one line, keeping at most max bytes of it in memory: the
// rest of a longer line is read and discarded, and tooLong reports it.
func readLine(br *bufio.Reader, max int) (line []byte, tooLong bool, err error) {
	for {
		chunk, err := br.ReadSlice('\n')
		if !tooLong {
			if len(line)+len(chunk) > max {
				tooLong, line = true, nil
			} else {
				line = append(line, chunk...)
			}
		}
		if err != bufio.ErrBufferFull {
			return line, tooLong, err
		}
	}
}

// decodeLine decodes exactly one instruction object, strictly.
func decodeLine(raw []byte, line *inputLine) error {
	return strictjson.Unmarshal(raw, line)
}

// classifyInput describes a line that could not be read as an
// instruction.
func classifyInput(err error) *lineError {
	if le := classify(err); le.Code != codeDatabaseError {
		return le
	}
	return &lineError{Code: codeInvalidInput, Message: err.Error()}
}

// add validates one line; valid instructions wait for the next flush.
func (e *enqueuer) add(ctx context.Context, line inputLine, parseErr error) {
	if parseErr != nil {
		e.results = append(e.results, lineResult{err: classifyInput(parseErr)})
		return
	}
	in, err := line.instruction()
	if err == nil {
		err = e.producer.Validate(in)
	}
	if err != nil {
		e.results = append(e.results, lineResult{err: classify(err)})
		return
	}
	e.slots = append(e.slots, len(e.results))
	e.batch = append(e.batch, in)
	e.results = append(e.results, lineResult{})
}

// flush enqueues the pending batch in one transaction (a mismatching line
// is reported and the rest retried without it) and writes the output lines.
//
// A batch whose connection broke before the database answered may have
// committed: it is sent again under the same keys (resendable), and a
// key that committed answers with its original receipt, marked duplicate.
// Reported as failed, it would read as not enqueued, and a script that
// enqueued it again under a new key would pay twice. A serialization
// failure or deadlock is sent again too; any other failure is reported
// at once, for a batch of several lines after sending each on its own.
func (e *enqueuer) flush(ctx context.Context) {
	e.sendBatch(ctx, e.batch, e.slots)
	for _, r := range e.results {
		if r.err != nil {
			e.failed++
		}
		_ = e.out.Encode(r)
	}
	e.results, e.batch, e.slots = e.results[:0], e.batch[:0], e.slots[:0]
}

// sendBatch enqueues batch in one transaction and records each line's
// result in e.results at its slot.
func (e *enqueuer) sendBatch(ctx context.Context, batch []pending.Instruction, slots []int) {
	e.sendBatchAfter(ctx, batch, slots, nil)
}

// sendBatchAfter is sendBatch for a batch that an earlier send may have
// committed when unknown is not nil (its failure): a failure that follows
// is then reported as COMMIT_UNKNOWN, never as a plain database error.
func (e *enqueuer) sendBatchAfter(ctx context.Context, batch []pending.Instruction, slots []int, unknown error) {
	resent := 0
	for len(batch) > 0 {
		send := e.send
		if send == nil {
			send = e.enqueue
		}
		receipts, err := send(ctx, batch)
		why := resendable(ctx, err)
		if unknown == nil && mayHaveCommitted(err, why) {
			unknown = err
		}
		if why != "" && resent < transientResends {
			resent++
			e.log.Warn(why+": sending it again under the same keys",
				"instructions", len(batch), "attempt", resent+1, "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(time.Duration(resent) * 200 * time.Millisecond):
			}
			continue
		}
		var be *pending.BatchError
		if errors.As(err, &be) {
			e.results[slots[be.Index]].err = commitUnknown(classify(be.Err), unknown)
			batch = append(batch[:be.Index:be.Index], batch[be.Index+1:]...)
			slots = append(slots[:be.Index:be.Index], slots[be.Index+1:]...)
			continue
		}
		if err != nil && len(batch) > 1 && why == "" && ctx.Err() == nil && !errors.Is(err, pending.ErrSchemaBehind) {
			// The database refused the batch's statement as a whole, for
			// what may be one line's doing (a tenant the session may not
			// write for: 42501) without saying which: each line is sent
			// on its own, so that only the lines it is about fail. The
			// batch was rolled back; were it not, the same keys answer
			// with their receipts.
			refused := "the database refused the batch"
			if errors.Is(err, pending.ErrBatchTooLarge) {
				// Refused before anything was sent: its payloads together
				// are more than one batch takes, each alone is not.
				refused = "the batch is too large for one enqueue"
			}
			e.log.Warn(refused+": sending each of its lines on its own",
				"instructions", len(batch), "err", err)
			for i := range batch {
				e.sendBatchAfter(ctx, batch[i:i+1], slots[i:i+1], unknown)
			}
			return
		}
		for i, slot := range slots {
			if err != nil {
				e.results[slot].err = commitUnknown(classify(err), unknown)
			} else {
				e.results[slot].receipt = &receipts[i]
			}
		}
		return
	}
}

// mayHaveCommitted reports whether err, a send's failure that resendable
// gave why for, leaves it unknown whether the transaction committed: the
// connection broke or the server went away while the send used it. A
// connection that could not be opened committed nothing, and a refusal
// the database answered (class 40, 53300) was rolled back. Not
// pgconn.SafeToRetry: a COMMIT whose reply was cut (it had committed)
// came back as pgx's "conn closed", which it calls safe to retry.
func mayHaveCommitted(err error, why string) bool {
	if why == "" {
		return false
	}
	var connErr *pgconn.ConnectError
	if errors.As(err, &connErr) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return strings.HasPrefix(pgErr.Code, "08") || strings.HasPrefix(pgErr.Code, "57P")
	}
	return true
}

// commitUnknown turns le, the failure reported for a line, into
// COMMIT_UNKNOWN when an earlier send of the line may have committed
// (unknown, its failure) and le is not a refusal of the line itself: the
// resends that followed failed (the database still away, say, during a
// failover, or a standby reached that refuses writes) and settled nothing. Reported as DATABASE_ERROR (READ_ONLY, PERMISSION_DENIED), the line
// would read as not enqueued, and a caller that enqueued it again under a
// new key would pay it twice; under the same key a committed line answers
// with its receipt.
func commitUnknown(le *lineError, unknown error) *lineError {
	if unknown == nil || le.Code != codeDatabaseError && le.Code != codeReadOnly && le.Code != codePermissionDenied {
		return le
	}
	return &lineError{Code: codeCommitUnknown, Message: fmt.Sprintf(
		"the transaction may have committed (%v), and sending it again failed (%s): send the line again under the same idempotency key, which answers with the receipt if it did",
		unknown, le.Message)}
}

// transientResends is how many times flush sends a batch again after a
// transient failure: each attempt may take another connection the same
// failure broke (a pool's connections to a primary that failed over).
const transientResends = 3

// resendable says why sending a batch again under the same keys can help
// after err, its failure, or returns "" when it cannot (or we are
// stopping): then the line reports err at once, as resending would only
// fail the same way. Transient are:
//   - the connection broke or the server went away (SQLSTATE classes 08
//     and 57P, or no answer at all) before the answer arrived: whether the
//     transaction committed is unknown, and sending it again settles it
//     (docs/operations.md, "Failover");
//   - a serialization failure or deadlock (class 40), or too many
//     connections (53300): the transaction was rolled back, and another
//     try is the remedy PostgreSQL expects.
//
// Everything else the database or the store reports (a constraint, a
// missing relation, the store's own invariant errors) is not transient.
func resendable(ctx context.Context, err error) string {
	if err == nil || ctx.Err() != nil || classify(err).Code != codeDatabaseError || errors.Is(err, pending.ErrSchemaBehind) {
		return ""
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch code := pgErr.Code; {
		case strings.HasPrefix(code, "08"), strings.HasPrefix(code, "57P"):
			return "the server went away before it answered; the transaction may have committed"
		case strings.HasPrefix(code, "40"), code == "53300":
			return "the database refused the transaction for now (rolled back)"
		}
		return ""
	}
	if connectionLost(err) {
		return "the connection broke before the database answered; the transaction may have committed"
	}
	return ""
}

// connectionLost reports whether err, which the server did not send, is
// the connection failing: it could not be opened or used (nothing was
// sent), or it broke, timed out or closed while a statement was under
// way. Errors of the client's own making are not.
func connectionLost(err error) bool {
	var connErr *pgconn.ConnectError
	var netErr net.Error
	return pgconn.SafeToRetry(err) || pgconn.Timeout(err) || errors.As(err, &connErr) || errors.As(err, &netErr) ||
		errors.Is(err, pgconn.ErrConnClosed) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

func (e *enqueuer) enqueue(ctx context.Context, ins []pending.Instruction) ([]pending.Receipt, error) {
	if len(ins) == 1 {
		r, err := e.producer.Enqueue(ctx, e.pool, ins[0])
		if err != nil {
			return nil, &pending.BatchError{Index: 0, Err: err}
		}
		return []pending.Receipt{r}, nil
	}
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(ctx)
	receipts, err := e.producer.EnqueueBatch(ctx, tx, ins)
	if err != nil {
		return nil, err
	}
	return receipts, tx.Commit(ctx)
}
