package store

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// The archive's tamper evidence (migration 007, docs/audit.md): a hash
// chain per instruction, and checkpoints that digest every row of a period
// and are chained to each other. This file holds the checkpointing and the
// verifier. The verifier trusts nothing the schema's owner could redefine:
// it rebuilds each row's canonical encoding with PostgreSQL's built-ins
// (chainEncodingSQL, the same encoding as the migration's attempt_hash) and
// hashes it itself. The encoding's text is UTF-8 because every session
// that writes or verifies uses client_encoding UTF8 (pgx does).

// Checkpoint is one period of the archive, digested.
type Checkpoint struct {
	PeriodStart time.Time `json:"period_start"`
	PeriodEnd   time.Time `json:"period_end"`
	Rows        int64     `json:"rows"`
	Digest      HexBytes  `json:"digest"`    // sha256 of the period's row hashes, in (created_at, attempt_id) order
	PrevHash    HexBytes  `json:"prev_hash"` // the previous checkpoint's hash; empty for the first
	Hash        HexBytes  `json:"hash"`
}

// HexBytes is a hash, written as hex in JSON.
type HexBytes []byte

// MarshalJSON writes b as a hex string.
func (b HexBytes) MarshalJSON() ([]byte, error) { return json.Marshal(hex.EncodeToString(b)) }

// UnmarshalJSON reads a hex string.
func (b *HexBytes) UnmarshalJSON(data []byte) error {
	var s string
	if err := json.Unmarshal(data, &s); err != nil {
		return err
	}
	v, err := hex.DecodeString(s)
	if err != nil {
		return err
	}
	*b = v
	return nil
}

// DefaultCheckpointSettle is how far behind the clock a checkpoint's period
// ends: a row is stamped with the clock a moment before its transaction
// has an id the checkpoint could wait for.
const DefaultCheckpointSettle = 5 * time.Second

// TakeCheckpoint appends the next checkpoint, from the end of the last one
// to settle before now (cut at a month's end, so that a checkpoint covers
// one partition, and since migration 043 at a bounded number of rows: see
// TakeCheckpointStep), unless that period is shorter than minPeriod (and
// was not cut so). It first waits for the transactions running when it
// started, so no row of the period commits after it. It returns the new
// checkpoint, or nil when there is no period to close. Concurrent callers
// serialize in the database; the relayer's checkpointer calls it every
// interval. db must be in READ COMMITTED mode (the default).
func (s *Store) TakeCheckpoint(ctx context.Context, db Querier, settle, minPeriod time.Duration) (*Checkpoint, error) {
	cp, _, err := s.TakeCheckpointStep(ctx, db, settle, minPeriod)
	return cp, err
}

// TakeCheckpointStep is TakeCheckpoint that also reports whether the
// checkpoint ended before settle before now: cut at a month's end, or,
// since migration 043, at the most rows one checkpoint digests
// (outbox.checkpoint_max_rows). Then the next is due at once: after
// hours without a checkpoint, a checkpointer calls it again while more is
// true, and closes the backlog in steps of bounded size.
func (s *Store) TakeCheckpointStep(ctx context.Context, db Querier, settle, minPeriod time.Duration) (cp *Checkpoint, more bool, err error) {
	if settle <= 0 {
		settle = DefaultCheckpointSettle
	}
	rows, err := db.Query(ctx, s.sql.takeCheckpoint, settle.Microseconds(), max(minPeriod, 0).Microseconds())
	if err != nil {
		return nil, false, fmt.Errorf("checkpoint: %w", err)
	}
	cps, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Checkpoint, error) {
		return readCheckpoint(row, &more)
	})
	if err != nil {
		return nil, false, fmt.Errorf("checkpoint: %w", err)
	}
	if len(cps) == 0 {
		return nil, false, nil
	}
	return &cps[0], more, nil
}

// takeCheckpointSQL asks for a period up to settle ($1) before now, of
// at least $2, and says whether the one taken ends before that.
const takeCheckpointSQL = `
WITH asked AS (SELECT clock_timestamp() - $1::bigint * interval '1 microsecond' AS period_end)
SELECT c.period_start, c.period_end, c.row_count, c.digest, c.prev_hash, c.hash, c.period_end < asked.period_end
FROM asked, {schema}.take_checkpoint(asked.period_end, interval '30 seconds', $2::bigint * interval '1 microsecond') c`

// Checkpoints returns every checkpoint, oldest first, all held at once
// (ExportCheckpoints writes the export without holding them).
func (s *Store) Checkpoints(ctx context.Context, db Querier) ([]Checkpoint, error) {
	rows, err := db.Query(ctx, s.sql.checkpoints)
	if err != nil {
		return nil, fmt.Errorf("checkpoints: %w", err)
	}
	cps, err := pgx.CollectRows(rows, scanCheckpoint)
	if err != nil {
		return nil, fmt.Errorf("checkpoints: %w", err)
	}
	return cps, nil
}

// ExportCheckpoints writes every checkpoint to w as the export
// (WriteCheckpoints' format), oldest first, reading them 10,000 at a time:
// one is taken a minute, so Checkpoints, which holds them all, holds half
// a million a year. Checkpoints are only ever appended after the last, so
// the batches, each its own statement, read every checkpoint once.
func (s *Store) ExportCheckpoints(ctx context.Context, db Querier, w io.Writer) error {
	batch := s.checkpointsPerBatch()
	enc := json.NewEncoder(w)
	if err := enc.Encode(exportHeader{Format: checkpointsExportFormat}); err != nil {
		return fmt.Errorf("checkpoints export: %w", err)
	}
	var end exportEnd
	after := pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
	for {
		cps, _, err := s.checkpointBatchAfter(ctx, db, after, batch)
		if err != nil {
			return fmt.Errorf("checkpoints: %w", err)
		}
		for _, c := range cps {
			if err := enc.Encode(c); err != nil {
				return fmt.Errorf("checkpoints export: %w", err)
			}
		}
		end.End.Checkpoints += len(cps)
		if len(cps) > 0 {
			last := cps[len(cps)-1]
			end.End.LastHash, after = last.Hash, pgtype.Timestamptz{Time: last.PeriodStart, Valid: true}
		}
		if len(cps) < batch {
			break
		}
	}
	if err := enc.Encode(end); err != nil {
		return fmt.Errorf("checkpoints export: %w", err)
	}
	return nil
}

const checkpointsSQL = `
SELECT period_start, period_end, row_count, digest, prev_hash, hash
FROM {schema}.checkpoints ORDER BY period_start`

func scanCheckpoint(row pgx.CollectableRow) (Checkpoint, error) { return readCheckpoint(row) }

// readCheckpoint scans a checkpoint's columns, then extra columns into
// extra.
func readCheckpoint(row interface{ Scan(...any) error }, extra ...any) (Checkpoint, error) {
	var c Checkpoint
	var digest, prev, hash []byte
	err := row.Scan(append([]any{&c.PeriodStart, &c.PeriodEnd, &c.Rows, &digest, &prev, &hash}, extra...)...)
	c.Digest, c.PrevHash, c.Hash = digest, prev, hash
	c.PeriodStart, c.PeriodEnd = c.PeriodStart.UTC(), c.PeriodEnd.UTC()
	return c, err
}

// ErrCheckpointsExport is returned by ReadCheckpoints for an export that
// is not whole: a line that is not a checkpoint, or an export of this
// format cut short (its end line missing or not matching what precedes
// it). Nothing is compared against such an export.
var ErrCheckpointsExport = errors.New("checkpoints export not whole")

// The export's first line says its format, and its last line how many
// checkpoints it holds and the last one's hash: an export cut short at a
// line's end is otherwise a valid, shorter export, and an auditor would
// compare fewer checkpoints than they keep without knowing it.
type (
	exportHeader struct {
		Format int `json:"outbox_checkpoints_export"`
	}
	exportEnd struct {
		End struct {
			Checkpoints int      `json:"checkpoints"`
			LastHash    HexBytes `json:"last_hash"`
		} `json:"end_of_export"`
	}
)

// checkpointsExportFormat is the export format WriteCheckpoints writes.
const checkpointsExportFormat = 1

// WriteCheckpoints writes checkpoints as the export: JSON lines, a
// checkpoint each, between a line giving the format and an end line
// giving their number and the last one's hash (ReadCheckpoints).
func WriteCheckpoints(w io.Writer, cps []Checkpoint) error {
	enc := json.NewEncoder(w)
	if err := enc.Encode(exportHeader{Format: checkpointsExportFormat}); err != nil {
		return err
	}
	for _, c := range cps {
		if err := enc.Encode(c); err != nil {
			return err
		}
	}
	var end exportEnd
	end.End.Checkpoints = len(cps)
	if len(cps) > 0 {
		end.End.LastHash = cps[len(cps)-1].Hash
	}
	return enc.Encode(end)
}

// ReadCheckpoints reads an export written by WriteCheckpoints, and one of
// an earlier build (checkpoint lines alone, with no first and end lines:
// such an export cut short cannot be told from a whole one). An export
// that starts with the format line must end with its end line, matching
// the checkpoints between: otherwise it was cut short, or lines were
// added or removed, and ReadCheckpoints returns ErrCheckpointsExport.
// It holds every checkpoint; CheckpointsReader reads one at a time.
func ReadCheckpoints(r io.Reader) ([]Checkpoint, error) {
	var cps []Checkpoint
	cr := NewCheckpointsReader(r)
	for {
		c, ok, err := cr.Next()
		if err != nil {
			return nil, err
		}
		if !ok {
			return cps, nil
		}
		cps = append(cps, c)
	}
}

// CheckpointsReader reads an export a checkpoint at a time, checking it as
// ReadCheckpoints does: an export of years is millions of checkpoints,
// which verify compares with the database's as it reads both, in order
// (VerifyOptions.CheckpointsFrom), holding neither whole.
type CheckpointsReader struct {
	sc          *bufio.Scanner
	line, count int
	// seenLine: a line other than a blank one was read (the format line
	// must be the first such).
	seenLine, formatted, ended, eof bool
	last                            HexBytes
}

// NewCheckpointsReader reads the export in r.
func NewCheckpointsReader(r io.Reader) *CheckpointsReader {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	return &CheckpointsReader{sc: sc}
}

// Next returns the export's next checkpoint, or false at its end, once
// the export was read whole and found whole; an export that is not is
// ErrCheckpointsExport.
func (cr *CheckpointsReader) Next() (Checkpoint, bool, error) {
	for !cr.eof && cr.sc.Scan() {
		cr.line++
		n := cr.line
		line := bytes.TrimSpace(cr.sc.Bytes())
		if len(line) == 0 {
			continue
		}
		if cr.ended {
			return Checkpoint{}, false, fmt.Errorf("%w: line %d follows the end line", ErrCheckpointsExport, n)
		}
		first := !cr.seenLine
		var probe map[string]json.RawMessage
		if err := json.Unmarshal(line, &probe); err != nil {
			return Checkpoint{}, false, fmt.Errorf("%w: line %d: %v", ErrCheckpointsExport, n, err)
		}
		switch {
		case probe["outbox_checkpoints_export"] != nil:
			var h exportHeader
			if err := strictJSON(line, &h); err != nil || !first || h.Format != checkpointsExportFormat {
				return Checkpoint{}, false, fmt.Errorf("%w: line %d: not the first line of an export of format %d (%s)", ErrCheckpointsExport, n, checkpointsExportFormat, line)
			}
			cr.formatted = true
		case probe["end_of_export"] != nil:
			var e exportEnd
			if err := strictJSON(line, &e); err != nil || !cr.formatted {
				return Checkpoint{}, false, fmt.Errorf("%w: line %d: an end line %s", ErrCheckpointsExport, n, line)
			}
			if e.End.Checkpoints != cr.count || !bytes.Equal(e.End.LastHash, cr.last) {
				return Checkpoint{}, false, fmt.Errorf("%w: the end line says %d checkpoints, the last with hash %x; the export holds %d, the last with hash %x",
					ErrCheckpointsExport, e.End.Checkpoints, []byte(e.End.LastHash), cr.count, []byte(cr.last))
			}
			cr.ended = true
		default:
			var c Checkpoint
			if err := strictJSON(line, &c); err != nil {
				return Checkpoint{}, false, fmt.Errorf("%w: checkpoints line %d: %v", ErrCheckpointsExport, n, err)
			}
			cr.count++
			cr.last = c.Hash
			cr.seenLine = true
			return c, true, nil
		}
		cr.seenLine = true
	}
	if !cr.eof {
		cr.eof = true
		if err := cr.sc.Err(); err != nil {
			return Checkpoint{}, false, fmt.Errorf("checkpoints: %w", err)
		}
		if cr.formatted && !cr.ended {
			return Checkpoint{}, false, fmt.Errorf("%w: no end line after %d checkpoints: the export was cut short", ErrCheckpointsExport, cr.count)
		}
	}
	return Checkpoint{}, false, nil
}

// strictJSON decodes one JSON value into v, refusing unknown fields.
func strictJSON(line []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

// chainEncodingSQL is the canonical encoding of the archive row a, as the
// migration's attempt_hash builds it before hashing (the same columns, in
// the same order, of the same types).
const chainEncodingSQL = `record_send(ROW('outbox.attempts/1'::text, a.attempt_id, a.outbox_id, a.instruction_id,
  a.participant_id, a.sequence_id, a.idempotency_key, a.rail_type, a.tenant_id, a.correlation_id, a.payload, a.attempt_no,
  a.state, a.relayer_id, a.claim_attempt_id, a.claimed_at, a.completed_at, a.next_attempt_at, a.rail_reference,
  a.rail_code, a.error_code, a.error_message, a.latency_ms, a.late, a.created_at))`

// verifyChainsSQL reads every chained row (and every row since chaining
// began, hash or not) an instruction at a time.
const verifyChainsSQL = `
SELECT a.outbox_id, a.attempt_id, a.prev_hash, a.hash, ` + chainEncodingSQL + `
FROM {schema}.archive a
WHERE a.hash IS NOT NULL OR a.created_at >= (SELECT chained_since FROM {schema}.settings)
ORDER BY a.outbox_id, a.created_at, a.attempt_id`

// verifyCheckpointsSQL reads the checkpoints with their canonical
// encodings (the migration's checkpoint_hash, built-ins only).
const verifyCheckpointsSQL = `
SELECT period_start, period_end, row_count, digest, prev_hash, hash,
       record_send(ROW('outbox.checkpoints/1'::text, period_start, period_end, row_count, digest))
FROM {schema}.checkpoints WHERE period_start > $1 ORDER BY period_start LIMIT $2`

// verifyDigestsSQL reads the row hashes of the checkpointed periods, in
// digest order.
const verifyDigestsSQL = `
SELECT created_at, hash FROM {schema}.archive
WHERE created_at >= $1 AND created_at < $2
ORDER BY created_at, attempt_id`

// chainHash is sha256(prev || encoding): what attempt_hash and
// checkpoint_hash compute.
func chainHash(prev, encoding []byte) []byte {
	h := sha256.New()
	h.Write(prev)
	h.Write(encoding)
	return h.Sum(nil)
}

// tamperInvariant numbers the tamper-evidence checks in Report.Violations
// (docs/architecture.md, invariant 7).
const tamperInvariant = 7

// verifyChains checks every instruction's chain: each row matches its
// hash, the first row starts the chain, every other row follows a row of
// the same instruction that is still in the archive.
func (s *Store) verifyChains(ctx context.Context, tx pgx.Tx, r *Report, examples int) error {
	rows, err := tx.Query(ctx, s.sql.verifyChains)
	if err != nil {
		return err
	}
	defer rows.Close()
	v := newBoundedViolations(examples, "row hashes", "chain links")
	add := v.add
	var (
		current        uuid.UUID
		seen           = map[[32]byte]bool{}
		started        bool
		outbox, id     uuid.UUID
		prev, h, canon []byte
	)
	for rows.Next() {
		if err := rows.Scan(scanUUID(&outbox), scanUUID(&id), &prev, &h, &canon); err != nil {
			return err
		}
		if outbox != current {
			current, started = outbox, false
			clear(seen)
		}
		r.Chained++
		if h == nil {
			add("row hashes", fmt.Sprintf("outbox %s: attempt %s has no hash", outbox, id))
			continue
		}
		if !bytes.Equal(chainHash(prev, canon), h) {
			add("row hashes", fmt.Sprintf("outbox %s: attempt %s does not match its hash (changed after it was written)", outbox, id))
		}
		switch {
		case prev == nil && started:
			add("chain links", fmt.Sprintf("outbox %s: attempt %s starts a second chain", outbox, id))
		case prev != nil && (len(prev) != sha256.Size || !seen[[32]byte(prev)]):
			add("chain links", fmt.Sprintf("outbox %s: attempt %s follows a row that is not in the archive", outbox, id))
		}
		started = true
		if len(h) == sha256.Size {
			seen[[32]byte(h)] = true
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	v.flush(r)
	return nil
}

// defaultCheckpointBatch is how many checkpoints verify holds at a time:
// one is taken a minute, half a million a year, which held all at once
// came to hundreds of MB in the process verifying (a relayer, for the
// console's verify).
const defaultCheckpointBatch = 10_000

// verifyCheckpoints checks the checkpoints' own chain and contiguity,
// recomputes every period's digest from the archive, and compares them
// with an exported copy when one is given. It reads the checkpoints a
// batch at a time, in order: only the last one read carries over.
func (s *Store) verifyCheckpoints(ctx context.Context, tx pgx.Tx, r *Report, exported []Checkpoint, from CheckpointSource, examples int) error {
	v := newBoundedViolations(examples, "checkpoint chain", "checkpoint digests", "exported checkpoints")
	defer v.flush(r)
	add := v.add
	batch := s.checkpointsPerBatch()
	// The export is merged with the database's checkpoints, both in order
	// of their starts: export holds the next exported checkpoint not yet
	// compared, the only one held.
	if exported != nil {
		from = sortedCheckpoints(exported)
	}
	export := exportCursor{from: from, r: r}
	if err := export.advance(); err != nil {
		return err
	}
	notInDatabase := func() error {
		add("exported checkpoints", fmt.Sprintf("checkpoint %s of the export is not in the database", stamp(export.next.PeriodStart)))
		return export.advance()
	}
	var last *Checkpoint
	after := pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
	for {
		cps, encodings, err := s.checkpointBatchAfter(ctx, tx, after, batch)
		if err != nil {
			return err
		}
		r.Checkpoints += len(cps)
		for i, c := range cps {
			var prevHash []byte
			if last != nil {
				prevHash = last.Hash
				if !c.PeriodStart.Equal(last.PeriodEnd) {
					add("checkpoint chain", fmt.Sprintf("checkpoint %s: the previous one ends at %s (a checkpoint is missing)",
						stamp(c.PeriodStart), stamp(last.PeriodEnd)))
				}
			}
			if !bytes.Equal(c.PrevHash, prevHash) {
				add("checkpoint chain", fmt.Sprintf("checkpoint %s does not follow the checkpoint before it", stamp(c.PeriodStart)))
			}
			if !bytes.Equal(chainHash(c.PrevHash, encodings[i]), c.Hash) {
				add("checkpoint chain", fmt.Sprintf("checkpoint %s does not match its hash (changed after it was written)", stamp(c.PeriodStart)))
			}
			for export.next != nil && export.next.PeriodStart.Before(c.PeriodStart) {
				if err := notInDatabase(); err != nil {
					return err
				}
			}
			for export.next != nil && export.next.PeriodStart.Equal(c.PeriodStart) {
				e := export.next
				if !c.PeriodEnd.Equal(e.PeriodEnd) || c.Rows != e.Rows || !bytes.Equal(c.Digest, e.Digest) ||
					!bytes.Equal(c.PrevHash, e.PrevHash) || !bytes.Equal(c.Hash, e.Hash) {
					add("exported checkpoints", fmt.Sprintf("checkpoint %s differs from the export (export: %d rows, digest %x; database: %d rows, digest %x)",
						stamp(e.PeriodStart), e.Rows, []byte(e.Digest)[:min(len(e.Digest), 8)], c.Rows, []byte(c.Digest)[:min(len(c.Digest), 8)]))
				}
				if err := export.advance(); err != nil {
					return err
				}
			}
			last = &cps[i]
		}
		if len(cps) > 0 {
			if err := s.verifyDigests(ctx, tx, cps, add); err != nil {
				return err
			}
		}
		if len(cps) < batch {
			break
		}
		after = pgtype.Timestamptz{Time: last.PeriodStart, Valid: true}
	}
	for export.next != nil {
		if err := notInDatabase(); err != nil {
			return err
		}
	}
	return nil
}

// exportCursor walks an export in order of its checkpoints' starts,
// counting them in r.ExportedCheckpoints.
type exportCursor struct {
	from CheckpointSource // nil: no export
	r    *Report
	next *Checkpoint // nil at the end
	prev time.Time   // the last start handed out
}

// advance moves next to the export's next checkpoint. One that starts
// before the last is refused: the merge with the database's checkpoints
// needs the export's order, which WriteCheckpoints writes.
func (e *exportCursor) advance() error {
	e.next = nil
	if e.from == nil {
		return nil
	}
	c, ok, err := e.from.Next()
	if err != nil || !ok {
		return err
	}
	if e.r.ExportedCheckpoints > 0 && c.PeriodStart.Before(e.prev) {
		return fmt.Errorf("%w: checkpoint %s follows checkpoint %s: the export is not in order", ErrCheckpointsExport, stamp(c.PeriodStart), stamp(e.prev))
	}
	e.r.ExportedCheckpoints++
	e.prev, e.next = c.PeriodStart, &c
	return nil
}

// sortedCheckpoints hands out a copy of cps in order of their starts (a
// caller's slice need not be in order).
func sortedCheckpoints(cps []Checkpoint) CheckpointSource {
	sorted := slices.Clone(cps)
	slices.SortStableFunc(sorted, func(a, b Checkpoint) int { return a.PeriodStart.Compare(b.PeriodStart) })
	return &sliceSource{cps: sorted}
}

// sliceSource is a CheckpointSource over a slice.
type sliceSource struct{ cps []Checkpoint }

func (s *sliceSource) Next() (Checkpoint, bool, error) {
	if len(s.cps) == 0 {
		return Checkpoint{}, false, nil
	}
	c := s.cps[0]
	s.cps = s.cps[1:]
	return c, true, nil
}

// boundedViolations keeps the first examples violations of each of its
// checks and counts the rest: a month of checkpoints tampered with is
// 43,200 of them, which held and sent whole through the API would be
// megabytes in the relayer verifying for the console. flush reports them
// in its checks' order whatever the order they came in, so the report does
// not depend on how verify batched its reads.
type boundedViolations struct {
	examples int
	checks   []string
	held     map[string][]string
	counts   map[string]int
}

func newBoundedViolations(examples int, checks ...string) *boundedViolations {
	return &boundedViolations{examples: examples, checks: checks, held: map[string][]string{}, counts: map[string]int{}}
}

func (b *boundedViolations) add(check, detail string) {
	if b.counts[check]++; b.counts[check] <= b.examples {
		b.held[check] = append(b.held[check], detail)
	}
}

// flush appends the examples of every check to r, each check's followed
// by "and N more" when it had more.
func (b *boundedViolations) flush(r *Report) {
	for _, check := range b.checks {
		for _, d := range b.held[check] {
			r.Violations = append(r.Violations, Violation{Invariant: tamperInvariant, Check: check, Detail: d})
		}
		if n := b.counts[check]; n > b.examples {
			r.Violations = append(r.Violations, Violation{Invariant: tamperInvariant, Check: check,
				Detail: fmt.Sprintf("and %d more", n-b.examples)})
		}
	}
}

// checkpointsPerBatch is how many checkpoints a verify or an export reads
// at a time.
func (s *Store) checkpointsPerBatch() int {
	if s.checkpointBatch > 0 {
		return s.checkpointBatch
	}
	return defaultCheckpointBatch
}

// checkpointBatchAfter reads up to n checkpoints starting after after, in
// order, with their canonical encodings (what verify hashes; an export
// leaves them).
func (s *Store) checkpointBatchAfter(ctx context.Context, db Querier, after pgtype.Timestamptz, n int) ([]Checkpoint, [][]byte, error) {
	rows, err := db.Query(ctx, s.sql.verifyCheckpoints, after, n)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	var cps []Checkpoint
	var encodings [][]byte
	for rows.Next() {
		var enc []byte
		c, err := readCheckpoint(rows, &enc)
		if err != nil {
			return nil, nil, err
		}
		cps = append(cps, c)
		encodings = append(encodings, enc)
	}
	return cps, encodings, rows.Err()
}

// verifyDigests recomputes the digest of every checkpointed period in one
// pass over the archive in digest order.
func (s *Store) verifyDigests(ctx context.Context, tx pgx.Tx, cps []Checkpoint, add func(check, detail string)) error {
	rows, err := tx.Query(ctx, s.sql.verifyDigests, cps[0].PeriodStart, cps[len(cps)-1].PeriodEnd)
	if err != nil {
		return err
	}
	defer rows.Close()
	i := 0
	digest, n := sha256.New(), int64(0)
	closePeriod := func() {
		c := cps[i]
		if got := digest.Sum(nil); n != c.Rows || !bytes.Equal(got, c.Digest) {
			add("checkpoint digests", fmt.Sprintf("checkpoint %s to %s: %d rows in the archive, %d when it was taken: rows were changed, deleted or added since",
				stamp(c.PeriodStart), stamp(c.PeriodEnd), n, c.Rows))
		}
		i++
		digest.Reset()
		n = 0
	}
	var at time.Time
	var h []byte
	for rows.Next() {
		if err := rows.Scan(&at, &h); err != nil {
			return err
		}
		for i < len(cps) && !at.Before(cps[i].PeriodEnd) {
			closePeriod()
		}
		if i == len(cps) || at.Before(cps[i].PeriodStart) {
			continue // in a gap between checkpoints, reported above
		}
		digest.Write(h)
		n++
	}
	if err := rows.Err(); err != nil {
		return err
	}
	for i < len(cps) {
		closePeriod()
	}
	return nil
}

// stamp formats a checkpoint's time for reports.
func stamp(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000000Z") }
