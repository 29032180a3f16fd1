package store

import (
	"context"
	"fmt"
	"regexp"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Report is the result of [Store.Verify].
type Report struct {
	Instructions int64 // committed enqueues (idempotency keys)
	Pending      int64
	InFlight     int64
	DeadLetters  int64
	Dispatched   int64 // instructions with a DISPATCHED attempt
	Cancelled    int64 // instructions an operator cancelled while pending
	// DispatchedTwice counts instructions the rail was asked to pay more
	// than once and said yes to more than once (legitimate only after a late
	// completion raced a requeued copy; the idempotency key makes the rail
	// pay once).
	DispatchedTwice int64
	Attempts        int64
	// Chained is the number of archive rows whose hash chain was checked
	// (rows archived before migration 007 carry none).
	Chained int64
	// Checkpoints is the number of checkpoints whose digests were
	// recomputed; ExportedCheckpoints the number compared with an export.
	Checkpoints         int
	ExportedCheckpoints int
	Violations          []Violation
	// Standby says the snapshot was a hot standby's. On the primary it held
	// back vacuum for Duration (docs/operations.md, "A held vacuum
	// horizon").
	Standby  bool
	Duration time.Duration // from the snapshot's start to the last check
}

// OK reports whether no invariant was violated.
func (r Report) OK() bool { return len(r.Violations) == 0 }

// Violation is one broken invariant, numbered as in docs/architecture.md.
type Violation struct {
	Invariant int
	Check     string
	Detail    string
}

// String is the violation as one line: its invariant, check and detail.
func (v Violation) String() string {
	return fmt.Sprintf("invariant %d (%s): %s", v.Invariant, v.Check, v.Detail)
}

// VerifyOptions tune [Store.Verify].
type VerifyOptions struct {
	// Ordered checks invariant 4 over the whole history (set when
	// ordering was on since the first instruction). The checks of the
	// present state under ordering (queued counts, one head per
	// participant) run whenever the database has ordering on.
	Ordered bool
	// Examples caps the violations reported per check (default 10). The
	// chain and checkpoint checks then add one "and N more" (a dropped
	// month is tens of thousands of them, which the report would
	// otherwise hold, and the admin API send, whole); the checks of
	// invariants 1 to 5, which stop reading there, one "and more".
	Examples int
	// Checkpoints, when not nil, is an export of the checkpoints kept
	// outside the database (ReadCheckpoints): each must still be in the
	// database unchanged.
	Checkpoints []Checkpoint
	// CheckpointsFrom, when not nil and Checkpoints is, hands out such an
	// export a checkpoint at a time, in order (a *CheckpointsReader):
	// verify compares each with the database's as it reads them, without
	// holding the export.
	CheckpointsFrom CheckpointSource
	// Workers is how many connections read at once (default 1). With
	// more, the checks run side by side in transactions that share the
	// first one's snapshot (pg_export_snapshot), so the report is still of
	// one instant; it takes effect when Verify is given a pool (a
	// *pgx.Conn or a pgx.Tx has one connection), which needs that many
	// connections free to use them all. The report is the same whatever
	// the number; the time is about that of the longest check (the
	// chains), instead of the sum of all of them.
	Workers int
}

// CheckpointSource hands out an export's checkpoints one at a time, in
// order of their periods' starts; false at the end.
type CheckpointSource interface {
	Next() (Checkpoint, bool, error)
}

// DefaultVerifyWorkers is the Workers of the CLI's and the admin API's
// verify (see VerifyOptions.Workers).
const DefaultVerifyWorkers = 4

// check is one invariant query; every row it returns is a violation,
// described by its single text column.
type check struct {
	invariant int
	name      string
	sql       string
	ordered   bool // only with VerifyOptions.Ordered
}

var checks = []check{
	// Two places are legitimate in one case only: a relayer recorded a late
	// DISPATCHED after its lease was reaped, and the requeued copy is still
	// pending or in flight (it will be dispatched again under the same key).
	{1, "exactly one place", `
		SELECT format('outbox %s: pending=%s inflight=%s dead=%s dispatched=%s cancelled=%s', k.outbox_id,
		              p.outbox_id IS NOT NULL, f.outbox_id IS NOT NULL, d.outbox_id IS NOT NULL, coalesce(a.dispatched, false),
		              coalesce(a.cancelled, false))
		FROM {schema}.idempotency_keys k
		LEFT JOIN {schema}.pending p USING (outbox_id)
		LEFT JOIN {schema}.inflight f USING (outbox_id)
		LEFT JOIN {schema}.dead_letters d USING (outbox_id)
		LEFT JOIN (SELECT outbox_id, bool_or(state = 'DISPATCHED') AS dispatched,
		                  bool_or(late AND state = 'DISPATCHED') AS late_dispatched, bool_or(state = 'CANCELLED') AS cancelled
		           FROM {schema}.archive GROUP BY outbox_id) a USING (outbox_id)
		WHERE (p.outbox_id IS NOT NULL)::int + (f.outbox_id IS NOT NULL)::int + (d.outbox_id IS NOT NULL)::int
		      + coalesce(a.dispatched, false)::int + coalesce(a.cancelled, false)::int
		      NOT IN (1, CASE WHEN coalesce(a.late_dispatched, false) AND d.outbox_id IS NULL THEN 2 ELSE 1 END)
		  -- A key live beside its digest is retired (its acknowledged dead
		  -- letter already gone): it goes once older snapshots are over
		  -- (archive.go).
		  AND NOT EXISTS (SELECT 1 FROM {schema}.retired_keys r WHERE r.outbox_id = k.outbox_id)`, false},
	{1, "no orphans", `
		SELECT format('%s row %s has no idempotency key', t, outbox_id) FROM (
		  SELECT 'pending' AS t, outbox_id FROM {schema}.pending
		  UNION ALL SELECT 'inflight', outbox_id FROM {schema}.inflight
		  UNION ALL SELECT 'dead_letters', outbox_id FROM {schema}.dead_letters
		  UNION ALL SELECT DISTINCT 'attempts', outbox_id FROM {schema}.archive) x
		WHERE NOT EXISTS (SELECT 1 FROM {schema}.idempotency_keys k WHERE k.outbox_id = x.outbox_id)
		  AND NOT EXISTS (SELECT 1 FROM {schema}.retired_keys r WHERE r.outbox_id = x.outbox_id)`, false},
	// A retired key is counted unless it is still live beside its digest
	// (a retirement waits for older snapshots before the key goes:
	// archive.go).
	{2, "gap-free sequences", `
		SELECT format('participant %s: allocated %s, committed %s distinct %s, range %s..%s', s.participant_id,
		              s.next_sequence_id - 1, count(k.sequence_id), count(DISTINCT k.sequence_id), min(k.sequence_id), max(k.sequence_id))
		FROM {schema}.sequences s
		LEFT JOIN (SELECT participant_id, sequence_id FROM {schema}.idempotency_keys
		           UNION ALL SELECT participant_id, sequence_id FROM {schema}.retired_keys r
		           WHERE NOT EXISTS (SELECT 1 FROM {schema}.idempotency_keys l WHERE l.outbox_id = r.outbox_id)) k USING (participant_id)
		GROUP BY s.participant_id, s.next_sequence_id
		HAVING count(k.*) <> s.next_sequence_id - 1 OR count(DISTINCT k.sequence_id) <> s.next_sequence_id - 1
		    OR coalesce(min(k.sequence_id), 1) <> 1 OR coalesce(max(k.sequence_id), 0) <> s.next_sequence_id - 1
		UNION ALL
		SELECT format('participant %s has keys but no sequence row', k.participant_id)
		FROM (SELECT participant_id FROM {schema}.idempotency_keys
		      UNION ALL SELECT participant_id FROM {schema}.retired_keys) k
		LEFT JOIN {schema}.sequences s USING (participant_id)
		WHERE s.participant_id IS NULL`, false},
	{3, "one key one identity", `
		SELECT format('%s row of outbox %s disagrees with its key (instruction/participant/sequence/key)', t, x.outbox_id) FROM (
		  SELECT 'pending' AS t, outbox_id, instruction_id, participant_id, sequence_id, idempotency_key FROM {schema}.pending
		  UNION ALL SELECT 'inflight', outbox_id, instruction_id, participant_id, sequence_id, idempotency_key FROM {schema}.inflight
		  UNION ALL SELECT 'dead_letters', outbox_id, instruction_id, participant_id, sequence_id, idempotency_key FROM {schema}.dead_letters
		  UNION ALL SELECT DISTINCT 'attempts', outbox_id, instruction_id, participant_id, sequence_id, idempotency_key FROM {schema}.archive) x
		JOIN {schema}.idempotency_keys k USING (outbox_id)
		WHERE (k.instruction_id, k.participant_id, k.sequence_id, k.idempotency_key)
		      IS DISTINCT FROM (x.instruction_id, x.participant_id, x.sequence_id, x.idempotency_key)`, false},
	{4, "one in flight per participant", `
		SELECT format('participant %s has %s instructions in flight', participant_id, count(*))
		FROM {schema}.inflight GROUP BY participant_id HAVING count(*) > 1`, true},
	// With ordering on (the settings table), the participants' queued
	// counts are exact, and a participant's pending rows may only be due
	// at its head: the lowest sequence, when nothing of it is in flight. A
	// head that waits with nothing in flight would never be dispatched: a
	// stranded participant. These two check the present state under the
	// database's own mode, so they run without VerifyOptions.Ordered too
	// (which asks for the whole history's order).
	{4, "queued counts", `
		SELECT format('participant %s: queued %s, pending and in flight %s', s.participant_id, s.queued, coalesce(c.n, 0))
		FROM {schema}.sequences s
		LEFT JOIN (SELECT participant_id, count(*) AS n
		           FROM (SELECT participant_id FROM {schema}.pending UNION ALL SELECT participant_id FROM {schema}.inflight) x
		           GROUP BY participant_id) c USING (participant_id)
		WHERE s.queued <> coalesce(c.n, 0) AND ` + orderedSQL, false},
	{4, "one head per participant", `
		SELECT format('participant %s: sequence %s is %s', participant_id, sequence_id,
		              CASE WHEN live THEN 'due-able but not the head' ELSE 'the head but waits: the participant is stranded' END)
		FROM (SELECT p.participant_id, p.sequence_id, p.next_attempt_at <> 'infinity' AS live,
		             p.sequence_id = min(p.sequence_id) OVER (PARTITION BY p.participant_id)
		             AND NOT EXISTS (SELECT 1 FROM {schema}.inflight i WHERE i.participant_id = p.participant_id AND i.ordered) AS head
		      FROM {schema}.pending p) x
		WHERE live <> head AND ` + orderedSQL, false},
	{4, "dispatch order", `
		WITH claims AS (
		  SELECT participant_id, sequence_id, min(created_at) AS first_claim
		  FROM {schema}.archive WHERE state = 'DISPATCHING' GROUP BY 1, 2
		), terminal AS (
		  SELECT participant_id, sequence_id, min(created_at) AS terminal_at
		  FROM {schema}.archive WHERE state IN ('DISPATCHED', 'FAILED', 'CANCELLED') GROUP BY 1, 2
		)
		SELECT format('participant %s: sequence %s claimed at %s, before sequence %s ended (%s)', c.participant_id,
		              c.sequence_id, c.first_claim, c.sequence_id - 1, coalesce(t.terminal_at::text, 'never'))
		FROM claims c
		LEFT JOIN terminal t ON t.participant_id = c.participant_id AND t.sequence_id = c.sequence_id - 1
		WHERE c.sequence_id > 1 AND (t.terminal_at IS NULL OR t.terminal_at > c.first_claim)`, true},
	// A claim is closed by exactly one on-time row (its outcome or the
	// reaper's: a ZOMBIE_REQUEUE, or for a poison instruction a FAILED
	// row with error code ZOMBIE_LIMIT); a late outcome is legitimate only
	// after the reaper's, and at most once (the relayer of a poisoned
	// claim may have been only slow, and its outcome comes late as any
	// other's).
	{5, "every claim closed once", `
		WITH closers AS (
		  SELECT claim_attempt_id, count(*) FILTER (WHERE NOT late) AS n, count(*) FILTER (WHERE late) AS n_late,
		         count(*) FILTER (WHERE (state = 'ZOMBIE_REQUEUE' OR state = 'FAILED' AND error_code = 'ZOMBIE_LIMIT') AND NOT late) AS n_zombie
		  FROM {schema}.archive WHERE state <> 'DISPATCHING' AND claim_attempt_id IS NOT NULL GROUP BY 1
		)
		SELECT format('outbox %s attempt %s (DISPATCHING): %s closing rows, %s late, %s closed by the reaper, in flight now: %s',
		              d.outbox_id, d.attempt_id, coalesce(c.n, 0), coalesce(c.n_late, 0), coalesce(c.n_zombie, 0),
		              f.attempt_id IS NOT NULL)
		FROM {schema}.archive d
		LEFT JOIN closers c ON c.claim_attempt_id = d.attempt_id
		LEFT JOIN {schema}.inflight f ON f.attempt_id = d.attempt_id
		WHERE d.state = 'DISPATCHING'
		  AND (coalesce(c.n, 0) <> CASE WHEN f.attempt_id IS NULL THEN 1 ELSE 0 END
		       OR coalesce(c.n_late, 0) > coalesce(c.n_zombie, 0))`, false},
	// A claim after a retry comes no earlier than the retry time that
	// attempt recorded (the claim's time is the database's now(), which
	// every gate compares the due time with). Late outcomes record none
	// and are left out. Checked for claims since migration 039, before
	// which a hand-off could claim a retry that had waited behind a
	// replay at once (waiting.go); on a schema before 039 (no such
	// setting: read from the row as JSON), for none.
	{5, "no claim before its retry time", `
		SELECT format('outbox %s: attempt %s claimed at %s, before %s, the retry time its attempt %s recorded',
		              outbox_id, attempt_id, claimed_at, prev_retry_at, prev_attempt_id)
		FROM (SELECT a.outbox_id, a.attempt_id, a.state, a.claimed_at,
		             lag(a.state) OVER w AS prev_state, lag(a.next_attempt_at) OVER w AS prev_retry_at,
		             lag(a.attempt_id) OVER w AS prev_attempt_id
		      FROM {schema}.archive a WHERE NOT a.late
		      WINDOW w AS (PARTITION BY a.outbox_id ORDER BY a.created_at, a.attempt_id)) x
		WHERE x.state = 'DISPATCHING' AND x.prev_state = 'RETRYABLE' AND x.prev_retry_at > x.claimed_at
		  AND x.claimed_at >= (SELECT coalesce((to_jsonb(s) ->> 'retry_times_kept_since')::timestamptz, 'infinity')
		                       FROM {schema}.settings s)`, false},
	// The primary key is (attempt_id, created_at), as partitioning
	// requires, so it does not stop one attempt being archived twice.
	{5, "attempt ids unique", `
		SELECT format('attempt %s is archived %s times', attempt_id, count(*))
		FROM {schema}.archive GROUP BY attempt_id HAVING count(*) > 1`, false},
	{5, "closers match a claim", `
		SELECT format('outbox %s: %s attempt %s closes no DISPATCHING attempt #%s of it', a.outbox_id, a.state, a.attempt_id, a.attempt_no)
		FROM {schema}.archive a
		LEFT JOIN {schema}.archive d ON d.attempt_id = a.claim_attempt_id AND d.state = 'DISPATCHING'
		     AND d.outbox_id = a.outbox_id AND d.attempt_no = a.attempt_no
		WHERE a.state IN ('DISPATCHED', 'RETRYABLE', 'FAILED', 'ZOMBIE_REQUEUE') AND d.attempt_id IS NULL`, false},
	// Late outcomes carry their claim's number and may land after a newer
	// claim; "closers match a claim" checks them instead. A replay (of a
	// dead letter) starts a fresh budget at attempt 0.
	{5, "attempt numbers never go back", `
		SELECT format('outbox %s: attempt_no %s after %s', outbox_id, attempt_no, prev)
		FROM (SELECT outbox_id, attempt_no, state, lag(attempt_no) OVER (PARTITION BY outbox_id ORDER BY created_at, attempt_id) AS prev
		      FROM {schema}.archive WHERE NOT late) x
		WHERE attempt_no < prev AND state <> 'REPLAYED'`, false},
	// Invariant 7, the archive is as it was written, is checked mostly
	// outside SQL (chain.go); this part checks the hot rows' heads: the
	// last row of an instruction's chain is named by its pending,
	// in-flight or dead-letter row, so deleting it does not go unseen.
	{7, "chain heads", `
		SELECT format('%s row of outbox %s: %s', t, x.outbox_id,
		              CASE WHEN x.chain_head IS NULL THEN 'has no chain head, but its instruction has chained archive rows'
		                   ELSE 'its chain head is not in the archive' END)
		FROM (SELECT 'pending' AS t, outbox_id, chain_head FROM {schema}.pending
		      UNION ALL SELECT 'inflight', outbox_id, chain_head FROM {schema}.inflight
		      UNION ALL SELECT 'dead_letters', outbox_id, chain_head FROM {schema}.dead_letters) x
		WHERE CASE WHEN x.chain_head IS NULL
		           THEN EXISTS (SELECT 1 FROM {schema}.archive a WHERE a.outbox_id = x.outbox_id AND a.hash IS NOT NULL)
		           ELSE NOT EXISTS (SELECT 1 FROM {schema}.archive a WHERE a.outbox_id = x.outbox_id AND a.hash = x.chain_head) END`, false},
	{5, "in-flight rows have their claim", `
		SELECT format('inflight outbox %s: attempt %s has no DISPATCHING row', f.outbox_id, f.attempt_id)
		FROM {schema}.inflight f
		WHERE NOT EXISTS (SELECT 1 FROM {schema}.archive a WHERE a.attempt_id = f.attempt_id AND a.state = 'DISPATCHING')`, false},
}

// beginVerify opens Verify's transaction: one read-only snapshot, planned
// for whole-table reads. Planned from statistics that are stale (queue
// tables last analyzed empty, an archive analyzed at a tenth of its size),
// a check became nested loops over thousands of rows each side: seconds to
// minutes, on a busy database. A merge join can do the same: "dispatch
// order" was merged on the participant alone (its rows already sorted
// that way), the predecessor's sequence left to a join filter, so each
// participant's sequences were compared with each other (7.4 s after a
// drain of 50,000 instructions over 10 participants, 0.1 s hashed). A hash
// join hashes on every equality of the join and reads each side once
// whatever the statistics say. With a snapshot id (pg_export_snapshot of
// the first transaction), the transaction reads that snapshot instead of
// taking its own.
func beginVerify(ctx context.Context, db TxBeginner, snapshot string) (pgx.Tx, error) {
	tx, err := db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, err
	}
	if snapshot != "" {
		// A utility statement takes no parameters; the id is the
		// server's own, checked to be one before it is quoted.
		if !snapshotID.MatchString(snapshot) {
			_ = tx.Rollback(ctx)
			return nil, fmt.Errorf("not a snapshot id: %q", snapshot)
		}
		if _, err := tx.Exec(ctx, "SET TRANSACTION SNAPSHOT '"+snapshot+"'"); err != nil {
			_ = tx.Rollback(ctx)
			return nil, err
		}
	}
	if _, err := tx.Exec(ctx, "SET LOCAL enable_nestloop = off; SET LOCAL enable_mergejoin = off"); err != nil {
		_ = tx.Rollback(ctx)
		return nil, err
	}
	// The violations' details write times (and hashes) as text: in UTC
	// and ISO form, as the exports do, not in the verifying session's
	// zone and style ("IST", which PostgreSQL reads as Israel's; a date a
	// day or a month off in Pacific/Kiritimati), so that every auditor's
	// report of one archive reads the same.
	if _, err := tx.Exec(ctx, exportSettingsSQL); err != nil {
		_ = tx.Rollback(ctx)
		return nil, err
	}
	return tx, nil
}

// snapshotID is what pg_export_snapshot returns ("00000003-0000001B-1").
var snapshotID = regexp.MustCompile(`^[0-9A-Fa-f]+(-[0-9A-Fa-f]+)+$`)

// VerifyPlans returns the plan (EXPLAIN, FORMAT JSON) of every check, as
// Verify's transaction plans them, for plan tests.
func (s *Store) VerifyPlans(ctx context.Context, db TxBeginner) ([][]byte, error) {
	tx, err := beginVerify(ctx, db, "")
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(ctx)
	var plans [][]byte
	for _, q := range s.sql.verifyChecks {
		var plan []byte
		if err := tx.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+q).Scan(&plan); err != nil {
			return nil, fmt.Errorf("explain %q: %w", q, err)
		}
		plans = append(plans, plan)
	}
	return plans, nil
}

const verifyCountsSQL = `
SELECT (SELECT count(*) FROM {schema}.idempotency_keys),
       (SELECT count(*) FROM {schema}.pending),
       (SELECT count(*) FROM {schema}.inflight),
       (SELECT count(*) FROM {schema}.dead_letters),
       (SELECT count(DISTINCT outbox_id) FROM {schema}.archive WHERE state = 'DISPATCHED'),
       (SELECT count(DISTINCT outbox_id) FROM {schema}.archive WHERE state = 'CANCELLED'),
       (SELECT count(*) FROM (SELECT 1 FROM {schema}.archive WHERE state = 'DISPATCHED'
                              GROUP BY outbox_id HAVING count(*) > 1) x),
       (SELECT count(*) FROM {schema}.archive),
       pg_is_in_recovery()`

// Verify checks the invariants 1 to 5 by query, in one REPEATABLE READ
// snapshot (so a running system is checked at one instant): every committed
// enqueue in exactly one place, gap-free sequences, one identity per key,
// ordering (with opts.Ordered), and complete attempt trails. Invariant 6
// (atomic transitions) is what keeps 1-5 true across crashes; crash tests
// check it by calling Verify after a crash.
func (s *Store) Verify(ctx context.Context, db TxBeginner, opts VerifyOptions) (Report, error) {
	if opts.Examples <= 0 {
		opts.Examples = 10
	}
	start := time.Now()
	tx, err := beginVerify(ctx, db, "")
	if err != nil {
		return Report{}, fmt.Errorf("verify: %w", err)
	}
	defer tx.Rollback(ctx)

	tasks := s.verifyTasks(opts)
	parts := make([]Report, len(tasks))
	if err := runVerifyTasks(ctx, db, tx, opts.Workers, tasks, parts); err != nil {
		return Report{}, err
	}
	var r Report
	for _, p := range parts {
		r.add(p)
	}
	r.Duration = time.Since(start)
	return r, nil
}

// verifyTask is one part of Verify: it reads in tx and fills its own
// report.
type verifyTask struct {
	name string
	run  func(ctx context.Context, tx pgx.Tx, r *Report) error
}

// verifyTasks are Verify's parts in report order: the counts, each check,
// the chains, the checkpoints.
func (s *Store) verifyTasks(opts VerifyOptions) []verifyTask {
	tasks := []verifyTask{{"counts", func(ctx context.Context, tx pgx.Tx, r *Report) error {
		return tx.QueryRow(ctx, s.sql.verifyCounts).Scan(&r.Instructions, &r.Pending, &r.InFlight, &r.DeadLetters,
			&r.Dispatched, &r.Cancelled, &r.DispatchedTwice, &r.Attempts, &r.Standby)
	}}}
	for i, c := range checks {
		if c.ordered && !opts.Ordered {
			continue
		}
		// One row more than the examples tells that there are more,
		// without reading them all to count them.
		q := s.sql.verifyChecks[i] + fmt.Sprintf(" LIMIT %d", opts.Examples+1)
		tasks = append(tasks, verifyTask{fmt.Sprintf("%q", c.name), func(ctx context.Context, tx pgx.Tx, r *Report) error {
			rows, err := tx.Query(ctx, q)
			if err != nil {
				return err
			}
			details, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if len(details) > opts.Examples {
				details = append(details[:opts.Examples], fmt.Sprintf("and more: only the first %d are listed", opts.Examples))
			}
			for _, d := range details {
				r.Violations = append(r.Violations, Violation{Invariant: c.invariant, Check: c.name, Detail: d})
			}
			return err
		}})
	}
	return append(tasks,
		verifyTask{"chains", func(ctx context.Context, tx pgx.Tx, r *Report) error {
			return s.verifyChains(ctx, tx, r, opts.Examples)
		}},
		verifyTask{"checkpoints", func(ctx context.Context, tx pgx.Tx, r *Report) error {
			return s.verifyCheckpoints(ctx, tx, r, opts.Checkpoints, opts.CheckpointsFrom, opts.Examples)
		}})
}

// add merges a task's report into r: each figure is one task's.
func (r *Report) add(p Report) {
	r.Instructions += p.Instructions
	r.Pending += p.Pending
	r.InFlight += p.InFlight
	r.DeadLetters += p.DeadLetters
	r.Dispatched += p.Dispatched
	r.Cancelled += p.Cancelled
	r.DispatchedTwice += p.DispatchedTwice
	r.Attempts += p.Attempts
	r.Chained += p.Chained
	r.Checkpoints += p.Checkpoints
	r.ExportedCheckpoints += p.ExportedCheckpoints
	r.Violations = append(r.Violations, p.Violations...)
	r.Standby = r.Standby || p.Standby
}

// runVerifyTasks runs tasks, task i filling parts[i]: all in tx, or, with
// workers > 1 and a db that opens each transaction on a connection of its
// own (a pool), also in up to workers-1 more transactions that import tx's
// snapshot, each taking the next task as it finishes one (the longest, the
// chains and the checkpoints, first). It stays clear of pgxpool and
// x/sync, which producers, who link this package, do not need.
func runVerifyTasks(ctx context.Context, db TxBeginner, tx pgx.Tx, workers int, tasks []verifyTask, parts []Report) error {
	if workers <= 1 || sharesOneConnection(db) {
		for i, t := range tasks {
			if err := t.run(ctx, tx, &parts[i]); err != nil {
				return fmt.Errorf("verify %s: %w", t.name, err)
			}
		}
		return nil
	}
	var snapshot string
	if err := tx.QueryRow(ctx, "SELECT pg_export_snapshot()").Scan(&snapshot); err != nil {
		return fmt.Errorf("verify: export the snapshot: %w", err)
	}
	next := make(chan int, len(tasks))
	for i := len(tasks) - 1; i >= 0; i-- {
		next <- i
	}
	close(next)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg       sync.WaitGroup
		failOnce sync.Once
		failed   error
	)
	fail := func(err error) {
		failOnce.Do(func() { failed = err; cancel() })
	}
	work := func(tx pgx.Tx) {
		for i := range next {
			if err := tasks[i].run(wctx, tx, &parts[i]); err != nil {
				fail(fmt.Errorf("verify %s: %w", tasks[i].name, err))
				return
			}
		}
	}
	// A worker still waiting for a connection when the first transaction
	// has taken the last task gives up: the pool may be busy (a pool
	// smaller than workers), and nothing is left for it to do.
	starting, stopStarting := context.WithCancel(wctx)
	defer stopStarting()
	for range workers - 1 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			wtx, err := beginVerify(starting, db, snapshot)
			if err != nil {
				if starting.Err() == nil || wctx.Err() != nil {
					fail(fmt.Errorf("verify: import the snapshot: %w", err))
				}
				return
			}
			defer wtx.Rollback(context.WithoutCancel(ctx))
			work(wtx)
		}()
	}
	work(tx)
	stopStarting()
	wg.Wait()
	return failed
}

// sharesOneConnection reports whether db runs every transaction on one
// connection (a *pgx.Conn, or a transaction's savepoints), where Verify's
// workers cannot read side by side.
func sharesOneConnection(db TxBeginner) bool {
	switch db.(type) {
	case *pgx.Conn, pgx.Tx:
		return true
	}
	return false
}
