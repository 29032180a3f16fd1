package store

import "github.com/jackc/pgx/v5"

// genericPlansSQL makes the statements after it in the same implicit
// transaction (one pipelined batch) use their prepared statement's generic
// plan. Left to choose, PostgreSQL kept planning the claim and outcome
// statements afresh on most calls: their arrays' lengths make each custom
// plan look cheaper than the generic one, and planning them (a partitioned
// archive, a dozen CTEs) took 1 to 1.5 ms, more than running them. The
// generic plans are the ones the cost test bounds (TestHotPathCostIsPerBatch).
const genericPlansSQL = `SELECT set_config('plan_cache_mode', 'force_generic_plan', true)`

// queueGenericPlans queues genericPlansSQL at the head of b, unless db is a
// caller's transaction, whose later statements the setting would outlive
// into. It reports whether it did, so the reader skips that result.
func queueGenericPlans(b *pgx.Batch, db Querier) bool {
	if _, inTx := db.(pgx.Tx); inTx {
		return false
	}
	b.Queue(genericPlansSQL)
	return true
}

// skipGenericPlans reads the result of queueGenericPlans' statement.
func skipGenericPlans(br pgx.BatchResults, queued bool) error {
	if !queued {
		return nil
	}
	_, err := br.Exec()
	return err
}
