// Package attempts is the auditors' and operators' view of the outbox: the
// append-only archive (one row per state change of an instruction), the
// invariants checked by query, the dead letters with replay and
// acknowledgement, the operators' cancellations of pending instructions and
// pauses of rails, and a snapshot of the queue.
//
// The database rejects UPDATE, DELETE and TRUNCATE on the archive; old
// months are detached, never dropped ([Archive.Detach]). Relayers write
// the archive (package engine); this package reads it, and changes dead
// letters, pending instructions (cancel) and rail pauses only through the
// transitions that record who did it.
package attempts

import (
	"context"
	"io"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"

	"github.com/ledgerline/outbox/internal/store"
)

// State is the state an archive row records.
type State = store.State

// The states of an archive row.
const (
	// Dispatching: claimed by a relayer, about to be sent.
	Dispatching = store.Dispatching
	// Dispatched: the rail accepted it (terminal).
	Dispatched = store.Dispatched
	// Retryable: this attempt failed; the instruction is pending again.
	Retryable = store.Retryable
	// Failed: terminal failure; the instruction is a dead letter.
	Failed = store.Failed
	// ZombieRequeue: the relayer's lease expired; the reaper requeued it.
	ZombieRequeue = store.ZombieRequeue
	// Replayed: an operator sent a dead letter back to pending.
	Replayed = store.Replayed
	// Acknowledged: an operator accepted a dead letter's failure.
	Acknowledged = store.Acknowledged
	// Cancelled: an operator cancelled it while pending; it was never sent.
	Cancelled = store.Cancelled
)

// ErrOperatorAction is returned by Replay, Acknowledge, Cancel, PauseRail
// and ResumeRail without an operator's name or a reason (both are archived
// with the action), or with one holding a control or format character
// (payment.ControlRune: a line break, a bidi override), or with a name
// longer than MaxOperatorNameBytes or a reason longer than
// MaxReasonBytes. The database's functions refuse the same (migration
// 051), for a caller that runs them without this package.
var ErrOperatorAction = store.ErrOperatorAction

// MaxOperatorNameBytes and MaxReasonBytes bound an operator action's name
// and reason, in bytes of UTF-8: both are archived with the action, for
// good, and shown wherever it is read.
const (
	MaxOperatorNameBytes = store.MaxOperatorNameBytes
	MaxReasonBytes       = store.MaxReasonBytes
)

// ErrRailMayStillAct is returned by Cancel for an instruction whose rail
// call a relayer's stop cut off (CUT_OFF_AT_STOP), while the rail may
// still be acting on it; the error is a *RailMayStillActError, which
// says until when.
var ErrRailMayStillAct = store.ErrRailMayStillAct

// RailMayStillActError is Cancel's refusal of a cut-off instruction: Until
// is when the cancel may be tried again.
type RailMayStillActError = store.RailMayStillActError

// ErrCancelInFlight is returned by Cancel for an instruction in flight: a
// relayer claimed it and its rail call may be under way, so nothing was
// done. The error is a *CancelInFlightError naming the outbox id.
var ErrCancelInFlight = store.ErrCancelInFlight

// ErrDeadLetterInFlight is a replay or acknowledgement of an instruction
// that is not a dead letter but in flight (Archive.DeadLetterOrInFlight):
// nothing done.
var ErrDeadLetterInFlight = store.ErrDeadLetterInFlight

// CancelInFlightError is Cancel's refusal of an instruction in flight.
type CancelInFlightError = store.CancelInFlightError

// Attempt is one archive row.
type Attempt = store.Attempt

// DeadLetter is an instruction that failed terminally.
type DeadLetter = store.DeadLetter

// Snapshot is the operational state of the queue at one instant, read from
// the small hot tables only (cheap enough to scrape every few seconds).
type Snapshot = store.Snapshot

// Report is the result of [Archive.Verify]; Violation one broken invariant.
type (
	Report    = store.Report
	Violation = store.Violation
)

// Checkpoint is one period of the archive, digested and chained to the
// checkpoint before it (docs/audit.md).
type Checkpoint = store.Checkpoint

// DefaultCheckpointSettle is how far behind the clock a checkpoint's
// period ends by default.
const DefaultCheckpointSettle = store.DefaultCheckpointSettle

// WriteCheckpoints writes checkpoints as JSON lines, between a line giving
// the export's format and an end line giving their number and the last
// one's hash: the export an auditor keeps outside the database.
func WriteCheckpoints(w io.Writer, cps []Checkpoint) error { return store.WriteCheckpoints(w, cps) }

// ErrCheckpointsExport is returned by [ReadCheckpoints] for an export
// that is not whole (cut short, or lines added or removed).
var ErrCheckpointsExport = store.ErrCheckpointsExport

// ReadCheckpoints reads an export written by [WriteCheckpoints] (or one
// of an earlier build, which has no first and end lines).
func ReadCheckpoints(r io.Reader) ([]Checkpoint, error) { return store.ReadCheckpoints(r) }

// CheckpointsReader reads an export a checkpoint at a time, checking it as
// [ReadCheckpoints] does; it is the VerifyOptions.CheckpointsFrom of an
// export too large to hold (half a million checkpoints a year).
type CheckpointsReader = store.CheckpointsReader

// NewCheckpointsReader reads the export in r.
func NewCheckpointsReader(r io.Reader) *CheckpointsReader { return store.NewCheckpointsReader(r) }

// CheckpointSource hands out an export's checkpoints in order
// (VerifyOptions.CheckpointsFrom).
type CheckpointSource = store.CheckpointSource

// VerifyOptions tune [Archive.Verify].
type VerifyOptions = store.VerifyOptions

// DefaultVerifyWorkers is the VerifyOptions.Workers that `outbox audit
// verify` uses, and the admin API's verify on its audit pool: the checks
// of a verify take about as long as its longest one on a standby with
// that many cores free.
const DefaultVerifyWorkers = store.DefaultVerifyWorkers

// DB is what the reads and operator actions run on; *pgxpool.Pool,
// *pgx.Conn and pgx.Tx satisfy it.
type DB = store.Batcher

// TxBeginner starts transactions; *pgxpool.Pool and *pgx.Conn satisfy it.
type TxBeginner = store.TxBeginner

// Partition is one range (a month) of the archive, attached or detached.
type Partition = store.Partition

// ErrArchiveLifecycle is returned for a detach or export that cannot be
// done as asked; nothing is changed.
var ErrArchiveLifecycle = store.ErrArchiveLifecycle

// ErrPartitionMissing is what partition upkeep (the relayers' reapers,
// logged as a failed pass) returns when a month it keeps could not be
// created because the default partition holds rows of that month.
var ErrPartitionMissing = store.ErrPartitionMissing

// Archive reads the archive of one schema.
type Archive struct {
	store *store.Store
}

// New returns an Archive for schema ("" means the default).
func New(schema string) (*Archive, error) {
	s, err := store.New(schema)
	if err != nil {
		return nil, err
	}
	return &Archive{store: s}, nil
}

// Trail returns every attempt row of an instruction, oldest first, all
// held at once (TrailAfter reads it a page at a time).
func (a *Archive) Trail(ctx context.Context, db DB, outboxID uuid.UUID) ([]Attempt, error) {
	return a.store.Trail(ctx, db, outboxID)
}

// TrailByInstruction returns every attempt row of a producer's instruction
// id (all outbox ids it was enqueued under), oldest first.
func (a *Archive) TrailByInstruction(ctx context.Context, db DB, instructionID string) ([]Attempt, error) {
	return a.store.TrailByInstruction(ctx, db, instructionID)
}

// TrailAfter is the page of [Archive.Trail] that follows after, the last
// row of the previous page (nil for the first page), at most limit rows.
// An instruction retried through a long outage has thousands of rows
// (CIRCUIT_OPEN, RELEASED and CUT_OFF_AT_STOP use up no retry); a page
// holds only its own.
func (a *Archive) TrailAfter(ctx context.Context, db DB, outboxID uuid.UUID, after *Attempt, limit int) ([]Attempt, error) {
	return a.store.TrailAfter(ctx, db, outboxID, attemptCursor(after), limit)
}

// TrailByInstructionAfter is the page of [Archive.TrailByInstruction]
// that follows after, as [Archive.TrailAfter].
func (a *Archive) TrailByInstructionAfter(ctx context.Context, db DB, instructionID string, after *Attempt, limit int) ([]Attempt, error) {
	return a.store.TrailByInstructionAfter(ctx, db, instructionID, attemptCursor(after), limit)
}

// attemptCursor is the keyset position of a trail's row (nil: before the
// first).
func attemptCursor(a *Attempt) store.Cursor {
	if a == nil {
		return store.Cursor{}
	}
	return store.Cursor{At: a.CreatedAt, ID: a.AttemptID}
}

// DeadLetters lists dead letters, oldest failure first; acknowledged ones
// only when all is true.
func (a *Archive) DeadLetters(ctx context.Context, db DB, all bool, limit int) ([]DeadLetter, error) {
	return a.store.DeadLetters(ctx, db, all, limit)
}

// DeadLettersAfter is the page of [Archive.DeadLetters] that follows after,
// the last dead letter of the previous page (nil for the first page). Each
// page reads only its own rows, so a caller can walk any number of dead
// letters page by page.
func (a *Archive) DeadLettersAfter(ctx context.Context, db DB, all bool, after *DeadLetter, limit int) ([]DeadLetter, error) {
	var c store.Cursor
	if after != nil {
		c = store.Cursor{At: after.FailedAt, ID: after.OutboxID}
	}
	return a.store.DeadLettersAfter(ctx, db, all, c, limit)
}

// DeadLetterOrInFlight is DeadLetter and, when there is no dead letter,
// whether the instruction is in flight (a relayer claimed it), among the
// rows the reader's tenant scope lets it read: what an operator's replay
// or acknowledgement acts on, or tells. One whose failure committed
// between the two looks is read as the dead letter it became.
func (a *Archive) DeadLetterOrInFlight(ctx context.Context, db DB, outboxID uuid.UUID) (*DeadLetter, bool, error) {
	return a.store.DeadLetterOrInFlight(ctx, db, outboxID)
}

// DeadLetter returns the dead letter of an outbox id, or nil if there is
// none.
func (a *Archive) DeadLetter(ctx context.Context, db DB, outboxID uuid.UUID) (*DeadLetter, error) {
	return a.store.DeadLetter(ctx, db, outboxID)
}

// OutcomeUnknownReplay is what a replay of a dead letter marked outcome
// unknown tells the operator.
const OutcomeUnknownReplay = "the last attempt's outcome is unknown (the rail may have acted): the replay reuses the instruction's idempotency key, so a rail that did act answers it as a duplicate instead of paying twice"

// Replay sends a dead letter back to pending with the same outbox and
// sequence id and a fresh retry budget, and archives a REPLAYED row naming
// the operator and the reason. With ordering on it becomes its participant's next
// instruction again. It reports whether the dead letter existed; of an
// instruction in flight it returns ErrDeadLetterInFlight, nothing done.
func (a *Archive) Replay(ctx context.Context, db DB, outboxID uuid.UUID, operator, reason string) (bool, error) {
	return a.store.Replay(ctx, db, outboxID, operator, reason)
}

// ErrDeadLetterChanged is returned by ReplayAsRead and AcknowledgeAsRead
// when someone replayed or acknowledged the dead letter since it was read
// (it may have failed again under the same outbox id): nothing was done.
var ErrDeadLetterChanged = store.ErrDeadLetterChanged

// ErrCommitUnknown is returned by ReplayAsRead, AcknowledgeAsRead,
// Cancel, PauseRail, ResumeRail and Detach when the connection broke once the action's transaction was under way
// and it could not be settled whether it committed: it may have been
// done. Read the instruction's trail before acting on it again (a dead
// letter listed again may be a new failure).
var ErrCommitUnknown = store.ErrCommitUnknown

// ErrActionNotDone is returned by ReplayAsRead, AcknowledgeAsRead,
// Cancel, PauseRail, ResumeRail and Detach when the connection broke before the action committed and the database
// shows it was not done: nothing was done, and it can be run again.
var ErrActionNotDone = store.ErrActionNotDone

// ReplayAsRead is Replay of the dead letter dl as [Archive.DeadLetter]
// read it: only if nobody replayed or acknowledged it since, else
// [ErrDeadLetterChanged] and nothing done. What was reported from the
// read (whether the rail may have acted) is then about the failure
// replayed, not one that came after another operator's replay.
func (a *Archive) ReplayAsRead(ctx context.Context, db TxBeginner, dl DeadLetter, operator, reason string) (bool, error) {
	return a.store.ReplayAsRead(ctx, db, dl, operator, reason)
}

// AcknowledgeAsRead is Acknowledge of the dead letter dl as
// [Archive.DeadLetter] read it, as [Archive.ReplayAsRead].
func (a *Archive) AcknowledgeAsRead(ctx context.Context, db TxBeginner, dl DeadLetter, operator, reason string) (bool, error) {
	return a.store.AcknowledgeAsRead(ctx, db, dl, operator, reason)
}

// Acknowledge marks a dead letter as handled by an operator (it stays in
// the table until [Archive.Detach] detaches the month that acknowledged
// it, and leaves with its key) and archives an ACKNOWLEDGED
// row naming the operator and the reason. It reports whether an
// unacknowledged dead letter existed; of an instruction in flight it
// returns ErrDeadLetterInFlight, nothing done.
func (a *Archive) Acknowledge(ctx context.Context, db DB, outboxID uuid.UUID, operator, reason string) (bool, error) {
	return a.store.Acknowledge(ctx, db, outboxID, operator, reason)
}

// RailPause is a pause of dispatch to a rail in force; RailPauseEvent one
// line of the append-only record of pauses and resumes.
type (
	RailPause      = store.RailPause
	RailPauseEvent = store.RailPauseEvent
)

// AllRails is the rail type that pauses every rail.
const AllRails = store.AllRails

// Quiet is what may still reach a paused rail (see [Archive.RailQuiet]).
type Quiet = store.Quiet

// ErrRailType is returned by PauseRail and ResumeRail without a rail type,
// and by PauseRail for a rail type no instruction may name (more than 200
// bytes, a control or format character).
var ErrRailType = store.ErrRailType

// ErrNotQuiet is returned by RailQuiet when its context ends first.
var ErrNotQuiet = store.ErrNotQuiet

// PauseRail stops every relayer from claiming instructions of railType
// (AllRails: of every rail) until [Archive.ResumeRail], and records who and
// why. Instructions already in flight finish; the paused rail's
// instructions stay pending (and, with ordering on, so do the later ones of
// their participants). It reports false if the rail was already paused.
func (a *Archive) PauseRail(ctx context.Context, db DB, railType, operator, reason string) (bool, error) {
	return a.store.PauseRail(ctx, db, railType, operator, reason)
}

// ResumeRail ends a pause, records who and why, and wakes idle relayers.
// It reports false if the rail was not paused.
func (a *Archive) ResumeRail(ctx context.Context, db DB, railType, operator, reason string) (bool, error) {
	return a.store.ResumeRail(ctx, db, railType, operator, reason)
}

// RailPauses returns the pauses in force.
func (a *Archive) RailPauses(ctx context.Context, db DB) ([]RailPause, error) {
	return a.store.RailPauses(ctx, db)
}

// RailPauseEvents returns the newest limit pauses and resumes, newest first.
func (a *Archive) RailPauseEvents(ctx context.Context, db DB, limit int) ([]RailPauseEvent, error) {
	return a.store.RailPauseEvents(ctx, db, limit)
}

// RailHasPending reports whether any instruction of railType (of any rail
// for [AllRails]) is pending, in every tenant. After a pause that does
// not wait for [Archive.RailQuiet], false most often means a misspelt
// rail type.
func (a *Archive) RailHasPending(ctx context.Context, db TxBeginner, railType string) (bool, error) {
	return a.store.RailHasPending(ctx, db, railType)
}

// RailQuiet waits, after a pause, until nothing more can reach the rail:
// no transaction that began before the pause is still open and none of the
// rail's instructions is in flight. It returns [ErrNotQuiet] (and what it
// last saw) when ctx ends first; the pause stays in force either way.
func (a *Archive) RailQuiet(ctx context.Context, db TxBeginner, railType string) (Quiet, error) {
	return a.store.RailQuiet(ctx, db, railType, 0)
}

// Cancel removes a pending instruction so that it is never sent (a payment
// recalled before it leaves, or one the rail already made that would be
// sent again), and archives a CANCELLED row naming the operator and the
// reason. It reports false for an instruction that is settled or
// unknown, and refuses one in flight (its rail call may be under way)
// with a *CancelInFlightError (errors.Is ErrCancelInFlight), nothing
// written. An
// instruction whose rail call a relayer's stop cut off is refused with a
// *RailMayStillActError (errors.Is ErrRailMayStillAct) until that claim's
// lease has ended, and nothing is written. With ordering on, the
// participant's next instruction becomes due.
func (a *Archive) Cancel(ctx context.Context, db DB, outboxID uuid.UUID, operator, reason string) (bool, error) {
	return a.store.Cancel(ctx, db, outboxID, operator, reason)
}

// Snapshot reads the queue's operational state.
func (a *Archive) Snapshot(ctx context.Context, db DB) (Snapshot, error) {
	return a.store.Snapshot(ctx, db)
}

// Verify checks the invariants (docs/architecture.md) in one REPEATABLE
// READ snapshot, so a running system is checked at one instant: every
// committed enqueue in exactly one place, gap-free sequences, one identity
// per key, ordering (with opts.Ordered), complete attempt trails, and the
// archive as it was written (invariant 7: every instruction's hash chain,
// every checkpoint's digest, and, with opts.Checkpoints, an export of the
// checkpoints kept elsewhere). Invariant 6 (atomic transitions) is what keeps
// 1-5 true across crashes; crash tests check it by calling Verify after a
// crash.
func (a *Archive) Verify(ctx context.Context, db TxBeginner, opts VerifyOptions) (Report, error) {
	return a.store.Verify(ctx, db, opts)
}

// TakeCheckpoint appends the next checkpoint of the archive: from the end
// of the last one to settle before now (0 means
// [DefaultCheckpointSettle]), cut at a month's end and, since migration
// 043, at a bounded number of rows (see [Archive.TakeCheckpoints],
// which takes the ones after it too). It returns nil when there is
// nothing to checkpoint yet. Relayers' reapers take one at most
// every reaper.Config.CheckpointInterval (a minute by default); db must be
// in READ COMMITTED mode (the default).
func (a *Archive) TakeCheckpoint(ctx context.Context, db DB, settle time.Duration) (*Checkpoint, error) {
	return a.store.TakeCheckpoint(ctx, db, settle, 0)
}

// TakeCheckpoints appends the archive's next checkpoints up to settle
// before now (0 means [DefaultCheckpointSettle]) and returns them, oldest
// first: one, unless it was cut at a month's end or at the most rows one
// checkpoint digests (migration 043: the session's
// outbox.checkpoint_max_rows, 1,000,000 by default), as after a long time
// without a checkpoint; then the next, each in a statement of its own. On
// an error it returns those taken before it.
func (a *Archive) TakeCheckpoints(ctx context.Context, db DB, settle time.Duration) ([]Checkpoint, error) {
	var taken []Checkpoint
	for {
		cp, more, err := a.store.TakeCheckpointStep(ctx, db, settle, 0)
		if err != nil || cp == nil {
			return taken, err
		}
		taken = append(taken, *cp)
		if !more {
			return taken, nil
		}
	}
}

// Checkpoints returns every checkpoint, oldest first, all held at once:
// half a million a year. ExportCheckpoints writes the export without
// holding them.
func (a *Archive) Checkpoints(ctx context.Context, db DB) ([]Checkpoint, error) {
	return a.store.Checkpoints(ctx, db)
}

// ExportCheckpoints writes every checkpoint to w as the export an auditor
// keeps outside the database (WriteCheckpoints' format, read back by
// ReadCheckpoints), reading them 10,000 at a time.
func (a *Archive) ExportCheckpoints(ctx context.Context, db DB, w io.Writer) error {
	return a.store.ExportCheckpoints(ctx, db, w)
}

// Partitions lists the archive's partitions, attached and detached, oldest
// first; with exact, each one's rows are counted (a read of the whole
// archive: run it on a replica) instead of estimated.
func (a *Archive) Partitions(ctx context.Context, db DB, exact bool) ([]Partition, error) {
	return a.store.Partitions(ctx, db, exact)
}

// Detach moves every attached partition that ends at or before `before`
// out of the table relayers write to, then retires the idempotency keys of
// the instructions that ended in those partitions into their compact form
// (refused forever, but without their original receipt); a dead letter
// acknowledged in one of them leaves dead_letters with its key. Each
// detached month's keys are retired in one pass, recorded when it ends
// (Partition.KeysRetired), so a run reads only the months whose pass has
// not finished. No archive row is deleted: detached months stay in the
// database, append-only, and are still verified and shown in trails. It
// refuses months the checkpoints do not cover yet and gives up on a
// partition whose lock it cannot get within lockTimeout rather than stall
// relayers. It needs the schema's owner. A month's move whose connection
// broke is settled on another connection (store.DetachArchive): listed if
// it moved, else ErrActionNotDone or ErrCommitUnknown, with the months
// moved before it.
func (a *Archive) Detach(ctx context.Context, db DB, before time.Time, lockTimeout time.Duration) (detached []string, retired int64, err error) {
	detached, err = a.store.DetachArchive(ctx, db, before, lockTimeout)
	if err != nil {
		return detached, 0, err
	}
	// Every detached partition whose pass has not finished, not only
	// today's: a run cut short between the detach and the retirement is
	// finished by the next.
	retired, err = a.store.RetireDetachedKeys(ctx, db, 0)
	return detached, retired, err
}

// MovedMonth is one month MoveDefault gave a partition of its own.
type MovedMonth = store.MovedMonth

// MoveDefault gives every month whose rows are in the archive's default
// partition (written while no upkeep had created their month, which then
// could not be created: ErrPartitionMissing) a partition of its own, and
// moves those rows into it, in one transaction: no row changes, so hashes,
// chains and checkpoints verify as before, and the months can then be
// detached, exported and have their keys retired like any other. It waits
// at most lockTimeout for the default partition's lock; relayers writing
// into other months do not wait for it. It needs the schema's owner (or a
// superuser).
func (a *Archive) MoveDefault(ctx context.Context, db TxBeginner, lockTimeout time.Duration) ([]MovedMonth, error) {
	return a.store.MoveDefaultRows(ctx, db, lockTimeout)
}

// Export writes one archive partition to w as CSV (a header line, then the
// rows in (created_at, attempt_id) order) and returns its row count.
func (a *Archive) Export(ctx context.Context, conn *pgx.Conn, partition string, w io.Writer) (int64, error) {
	return a.store.ExportPartition(ctx, conn, partition, w)
}
