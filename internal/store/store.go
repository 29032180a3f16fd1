// Package store is the one home of the outbox's SQL. Every state
// transition of an instruction is one function here, in a file of its
// own, next to the statement it runs:
//
//	enqueue.go      producer: idempotency key, sequence id, pending row
//	claim.go        relayer: pending -> in flight (+ DISPATCHING attempt)
//	record.go       relayer: in flight -> dispatched | pending (retry) | dead letter
//	handoff.go      relayer: in the outcome's transaction, the freed participants' next instructions (and refills) -> in flight
//	withdraw.go     relayer: a late terminal outcome withdraws the reaper's requeued copy
//	reap.go         reaper: expired in flight -> pending (+ ZOMBIE_REQUEUE)
//	replay.go       operator: dead letter -> pending (+ REPLAYED)
//	acknowledge.go  operator: dead letter marked handled
//	cancel.go       operator: pending -> cancelled (+ CANCELLED), never sent
//	pause.go        operator: a rail paused or resumed (claims leave it alone)
//
// and the reads beside them (pending.go, trail.go, deadletters.go,
// snapshot.go, verify.go), the adaptive NOTIFY registrations (idle.go),
// partition upkeep (partitions.go), the archive's checkpoints (chain.go)
// and its lifecycle: detach, key retirement, export (archive.go). The
// column lists of the tables are written once, in columns.go, and the
// retry-budget arithmetic once, in budget.go.
//
// Every transition is one statement (one implicit transaction) or, where
// it must see another transaction's commit, a fixed pair; none holds a
// transaction open across anything but the database. The exported packages
// are the API: pending (producers), engine (relayers), reaper, attempts
// (auditors and operators). They validate, decide and observe; this package
// only moves rows.
//
// It imports pgx and uuid and nothing of the outbox, so that a producer
// that enqueues links nothing more.
package store

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Querier runs statements; *pgxpool.Pool, *pgx.Conn and pgx.Tx satisfy it.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Batcher is a Querier that also pipelines statements and opens
// (sub)transactions: what an enqueue needs.
type Batcher interface {
	Querier
	Begin(ctx context.Context) (pgx.Tx, error)
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// TxBeginner opens transactions with options (a consistent snapshot for
// verification); *pgxpool.Pool and *pgx.Conn satisfy it.
type TxBeginner interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// Store holds the statements rendered for one schema. It is immutable and
// safe for concurrent use.
type Store struct {
	schema string
	sql    statements
	// checkpointBatch is how many checkpoints verify and the export read
	// at a time (0: defaultCheckpointBatch); tests make it small.
	checkpointBatch int
	// notThere, if set (tests only), runs after a look that found no dead
	// letter and before the look in flight that follows it: where an
	// outcome written meanwhile moves the instruction between the two.
	notThere func()
}

// New validates schema ("" means [DefaultSchema]) and renders every
// statement for it.
func New(schema string) (*Store, error) {
	if err := ValidateSchema(schema); err != nil {
		return nil, err
	}
	if schema == "" {
		schema = DefaultSchema
	}
	return &Store{schema: schema, sql: renderStatements(schema)}, nil
}

// Schema returns the schema the statements are rendered for.
func (s *Store) Schema() string { return s.schema }

// Qualify renders a query written with the {schema} placeholder for this
// store's schema (tests and tools that need one more query).
func (s *Store) Qualify(query string) string { return qualify(s.schema, query) }

func qualify(schema, query string) string { return strings.ReplaceAll(query, "{schema}", schema) }

// statements are every statement of the package, rendered once.
type statements struct {
	insertKeys, insertPending, lookupKeys string
	// The same three for one instruction (see single).
	insertKeyOne, insertPendingOne, lookupKeyOne           string
	claim, claimSuspects, suspectsDue, handoff             string
	handoffSuccessors, recordLate                          string
	handoffFenced, handoffFencedSuccessors                 string
	record, recordDispatched, withdraw, settlePoison       string
	lockParticipants, lockParticipantsLate                 string
	lostHandoffs, lostClaims                               string
	reap, reapLock                                         string
	replay, acknowledge, cancel                            string
	trailByOutbox, trailByInstruction                      string
	openDeadLetters, allDeadLetters                        string
	participantOpenDeadLetters, participantAllDeadLetters  string
	countOpenDeadLetters, countAllDeadLetters              string
	countParticipantOpenDeadLetters                        string
	countParticipantAllDeadLetters                         string
	listPending, listPendingByInstruction                  string
	listPendingByParticipant, listPendingByRail            string
	snapshot, idleRelayers, dueOlderThan, archiveHealth    string
	vacuumHorizon                                          string
	verifyCounts                                           string
	verifyChecks                                           []string
	registerIdle, unregisterIdle, forgetStaleIdle          string
	registerRun, refreshRun, endRun, forgetEndedRuns, runs string
	ensurePartitions                                       string
	takeCheckpoint, checkpoints                            string
	retireKeys                                             string
	keysRetired                                            string
	dropRetiredKeys                                        string
	partitions                                             string
	listQueued, listQueuedOf, listQueuedOfRail             string
	listInFlight, listInFlightOf, participant              string
	participantHead, lastError                             string
	railActivity, liveRelayers, deadLetter                 string
	verifyChains, verifyCheckpoints, verifyDigests         string
}

func renderStatements(schema string) statements {
	q := func(s string) string { return qualify(schema, s) }
	st := statements{
		insertKeys:              q(insertKeysSQL),
		insertPending:           q(insertPendingSQL),
		lookupKeys:              q(lookupKeysSQL),
		insertKeyOne:            q(insertKeyOneSQL),
		insertPendingOne:        q(insertPendingOneSQL),
		lookupKeyOne:            q(lookupKeyOneSQL),
		claim:                   q(claimSQL),
		claimSuspects:           q(claimSuspectsSQL),
		suspectsDue:             q(suspectsDueSQL),
		handoff:                 q(handoffSQL),
		handoffSuccessors:       q(handoffSuccessorsSQL),
		handoffFenced:           q(handoffFencedSQL),
		handoffFencedSuccessors: q(handoffFencedSuccessorsSQL),
		record:                  q(recordSQL),
		recordDispatched:        q(recordDispatchedSQL),
		recordLate:              q(recordLateSQL),
		withdraw:                q(withdrawSQL),
		settlePoison:            q(settlePoisonSQL),
		lockParticipants:        q(lockParticipantsSQL),
		lockParticipantsLate:    q(lockParticipantsLateSQL),
		lostHandoffs:            q(lostHandoffsSQL),
		lostClaims:              q(lostClaimsSQL),
		reap:                    q(reapSQL),
		reapLock:                q(reapLockSQL),
		replay:                  q(replaySQL),
		acknowledge:             q(acknowledgeSQL),
		cancel:                  q(cancelSQL),
		trailByOutbox:           q(trailSQL("outbox_id = $1")),
		// Through the keys' instruction index: the archive keeps no index
		// by instruction id (migration 005).
		trailByInstruction:              q(trailSQL("outbox_id IN (SELECT outbox_id FROM {schema}.idempotency_keys WHERE instruction_id = $1)")),
		openDeadLetters:                 q(openDeadLettersSQL),
		allDeadLetters:                  q(allDeadLettersSQL),
		participantOpenDeadLetters:      q(participantOpenDeadLettersSQL),
		participantAllDeadLetters:       q(participantAllDeadLettersSQL),
		countOpenDeadLetters:            q(countOpenDeadLettersSQL),
		countAllDeadLetters:             q(countAllDeadLettersSQL),
		countParticipantOpenDeadLetters: q(countParticipantOpenDeadLettersSQL),
		countParticipantAllDeadLetters:  q(countParticipantAllDeadLettersSQL),
		listPending:                     q(listPendingSQL),
		listPendingByInstruction:        q(listPendingByInstructionSQL),
		listPendingByParticipant:        q(listPendingByParticipantSQL),
		listPendingByRail:               q(listPendingByRailSQL),
		snapshot:                        q(snapshotSQL),
		idleRelayers:                    q(idleRelayersSQL),
		archiveHealth:                   q(archiveHealthSQL),
		vacuumHorizon:                   q(vacuumHorizonSQL),
		dueOlderThan:                    q(dueOlderThanSQL),
		verifyCounts:                    q(verifyCountsSQL),
		registerIdle:                    q(registerIdleSQL),
		unregisterIdle:                  q(unregisterIdleSQL),
		forgetStaleIdle:                 q(forgetStaleIdleSQL),
		registerRun:                     q(registerRunSQL),
		refreshRun:                      q(refreshRunSQL),
		endRun:                          q(endRunSQL),
		forgetEndedRuns:                 q(forgetEndedRunsSQL),
		runs:                            q(runsSQL),
		ensurePartitions:                q(ensurePartitionsSQL),
		takeCheckpoint:                  q(takeCheckpointSQL),
		retireKeys:                      q(retireKeysSQL),
		keysRetired:                     q(keysRetiredSQL),
		dropRetiredKeys:                 q(dropRetiredKeysSQL),
		partitions:                      q(partitionsSQL),
		listQueued:                      q(queuedPageSQL(queuedPendingColumns, "pending", false)),
		listQueuedOf:                    q(queuedPageSQL(queuedPendingColumns, "pending", true)),
		listQueuedOfRail:                q(listQueuedOfRailSQL),
		listInFlight:                    q(queuedPageSQL(queuedInFlightColumns, "inflight", false)),
		listInFlightOf:                  q(queuedPageSQL(queuedInFlightColumns, "inflight", true)),
		participant:                     q(participantSQL),
		participantHead:                 q(participantHeadSQL),
		lastError:                       q(lastErrorSQL),
		railActivity:                    q(railActivitySQL),
		liveRelayers:                    q(liveRelayersSQL),
		deadLetter:                      q(deadLetterSQL),
		checkpoints:                     q(checkpointsSQL),
		verifyChains:                    q(verifyChainsSQL),
		verifyCheckpoints:               q(verifyCheckpointsSQL),
		verifyDigests:                   q(verifyDigestsSQL),
	}
	for _, c := range checks {
		st.verifyChecks = append(st.verifyChecks, q(c.sql))
	}
	return st
}

// HotPath is the text of the statements every instruction passes through,
// for the benchmark's ceiling (pgbench runs them as they are) and for plan
// tests. Parameters are as the methods that run them bind them.
type HotPath struct {
	// Enqueue's three statements for one instruction (the common case:
	// one per business transaction), in order.
	InsertKey, InsertPending, LookupKey string
	// Claim's statement.
	Claim string
	// PlanSettings is what Record sends first, in the same pipeline
	// (generic plans, no JIT; see genericPlansSQL).
	PlanSettings string
	// Record's three statements after it, in order; RecordDispatched is
	// Record for outcomes that are all DISPATCHED, which Record sends
	// then.
	LockParticipants, Record, RecordDispatched, Handoff string
	// HandoffLate is the hand-off Record sends after the outcome statement
	// for late and repeated outcomes ([Store.RecordSQL]): Handoff, and a
	// look for freed participants that are busy again.
	HandoffLate string
	// HandoffAsOutcomes is Handoff (with its refill) with its result
	// folded into Record's arguments (as if every instruction it claimed
	// were dispatched at once) and left in the session's settings, which
	// CarriedArgument reads: a draining relayer's writes without the
	// relayer, each recording what the last one handed off.
	HandoffAsOutcomes string
	// HandoffSuccessorsAsOutcomes is HandoffAsOutcomes without the refill,
	// as a relayer whose claims come back short sends it.
	HandoffSuccessorsAsOutcomes string
}

// HotPath returns the hot-path statements for this store's schema.
func (s *Store) HotPath() HotPath {
	return HotPath{
		InsertKey: s.sql.insertKeyOne, InsertPending: s.sql.insertPendingOne, LookupKey: s.sql.lookupKeyOne,
		Claim: s.sql.claim, PlanSettings: genericPlansSQL,
		LockParticipants: s.sql.lockParticipants, Record: s.sql.record, RecordDispatched: s.sql.recordDispatched,
		Handoff: s.sql.handoffFenced, HandoffLate: s.sql.handoff,
		HandoffAsOutcomes:           qualify(s.schema, handoffAsOutcomesSQL),
		HandoffSuccessorsAsOutcomes: qualify(s.schema, handoffSuccessorsAsOutcomesSQL),
	}
}
