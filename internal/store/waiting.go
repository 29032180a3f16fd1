package store

// With ordering on, a participant's pending rows other than its head wait
// with next_attempt_at = 'infinity'. A row that waits may have a retry
// time of its own, which its wait must not cut short: a retry recorded
// behind a dead letter an operator replayed, or a head waiting for its
// retry that a replay put behind the replayed one. pending.retry_at keeps
// that time while the row waits (migration 039); NULL on every other row.
// Every statement that makes a waiting row due sets it with dueAgainSQL,
// and the hand-off does not claim a row whose retry time is still ahead.

// dueAgainSQL is the SET list of an UPDATE of pending p that makes waiting
// rows due: at their retry time if it is still ahead, else now.
const dueAgainSQL = `next_attempt_at = CASE WHEN p.retry_at > now() THEN p.retry_at ELSE now() END, retry_at = NULL`

// retryAtBehindSQL is the retry_at of a retry written waiting behind a
// replay (it would have been due at due): its retry time, if still ahead.
func retryAtBehindSQL(behind, due string) string {
	return `CASE WHEN ` + behind + ` AND ` + due + ` > now() THEN ` + due + ` END`
}
