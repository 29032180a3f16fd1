package store

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// genericPlansSQL makes the statements after it in the same implicit
// transaction (one pipelined batch) use their prepared statement's generic
// plan. Left to choose, PostgreSQL kept planning the claim and outcome
// statements afresh on most calls: their arrays' lengths make each custom
// plan look cheaper than the generic one, and planning them (a partitioned
// archive, a dozen CTEs) took 1 to 1.5 ms, more than running them. The
// generic plans are the ones the cost test bounds (TestHotPathCostIsPerBatch).
//
// It also turns JIT compilation off for them. A generic plan does not know
// its batch size (a parameter), and costs its LIMITs at a tenth of the
// table: the hand-off's generic plan came to 200,000-240,000 in some
// drains, over jit_above_cost (100,000), and PostgreSQL then compiled it
// with LLVM at every execution, about 100 ms of processor each time, for
// a statement that runs in one or two: 2,300-3,200 msgs/s instead of
// 25,000-29,000 in 4 of 14 unordered drains (perf: llvm:: and malloc
// frames in the backends). No statement here reads enough rows to gain
// from JIT.
const genericPlansSQL = `SELECT set_config('plan_cache_mode', 'force_generic_plan', true), set_config('jit', 'off', true)`

// claimPlansSQL is genericPlansSQL for a claim, which also plans without
// bitmap scans. With few due instructions in pending's statistics (a queue
// at a steady rate), the generic claim read a rail's due range with a
// bitmap scan and a sort. A bitmap scan never marks the index entries of
// deleted rows dead, as an ordered index scan does when it meets them, so
// every claim walked every entry deleted since the last vacuum: claims of
// 4 to 17 ms at 1,000/s, and an enqueue-to-rail-call p50 of 3.2-4.9 ms in
// some runs instead of 2.1-2.4 (TestClaimReadsTheDueIndexInOrder). Only the
// claim: the outcome batch's statements with bitmap scans off made ordered
// drains about a tenth slower (20,600-21,800 msgs/s against 23,500-24,900,
// interleaved), and its refill reads the due range only while draining,
// when the plan is the ordered one anyway.
const claimPlansSQL = genericPlansSQL + `, set_config('enable_bitmapscan', 'off', true)`

// queueGenericPlans queues settings (genericPlansSQL or claimPlansSQL) at
// the head of b, unless db is a caller's transaction, whose later
// statements the settings would outlive into. It reports whether it did,
// so the reader skips that result.
func queueGenericPlans(b *pgx.Batch, db Querier, settings string) bool {
	if inCallersTx(db) {
		return false
	}
	b.Queue(settings)
	return true
}

// inCallersTx reports whether db is a caller's transaction, which the
// store's statements must neither outlive in settings nor abort.
func inCallersTx(db Querier) bool {
	_, ok := db.(pgx.Tx)
	return ok
}

// skipGenericPlans reads the result of queueGenericPlans' statement.
func skipGenericPlans(br pgx.BatchResults, queued bool) error {
	if !queued {
		return nil
	}
	_, err := br.Exec()
	return err
}

// noJITSQL turns JIT compilation off for the statements after it in the
// same implicit transaction, for the operators' reads of the archive's
// recent rows (queryNoJIT). Their plans cost every attached month's
// partition (pruned only when they run, now() being known then), so as
// the months add up they cross jit_above_cost and PostgreSQL compiled
// them with LLVM at every read: 185-218 ms of a 160-500 ms overview read
// that touched a few hundred buffers, every 5 s while a console is open.
const noJITSQL = `SELECT set_config('jit', 'off', true)`

// queryNoJIT is db.Query(sql, args...) planned without JIT (noJITSQL), in
// one pipelined batch. In a caller's transaction, which the setting would
// outlive into, or on a db that cannot pipeline, it is db.Query.
func queryNoJIT(ctx context.Context, db Querier, sql string, args ...any) (pgx.Rows, error) {
	b, ok := db.(Batcher)
	if !ok || inCallersTx(db) {
		return db.Query(ctx, sql, args...)
	}
	batch := &pgx.Batch{}
	batch.Queue(noJITSQL)
	batch.Queue(sql, args...)
	br := b.SendBatch(ctx, batch)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return nil, err
	}
	rows, err := br.Query()
	if err != nil {
		_ = br.Close()
		return nil, err
	}
	return &batchRows{Rows: rows, br: br}, nil
}

// batchRows are the rows of a batch's last statement: closing them also
// ends the batch, which frees its connection.
type batchRows struct {
	pgx.Rows
	br  pgx.BatchResults
	err error
}

func (r *batchRows) Close() {
	r.Rows.Close()
	if r.br != nil {
		if err := r.br.Close(); err != nil && r.err == nil {
			r.err = err
		}
		r.br = nil
	}
}

func (r *batchRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.err
}
