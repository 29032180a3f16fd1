package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/gofrs/uuid/v5"
	"github.com/jackc/pgx/v5"
)

// Partition is one month (or other range) of the archive: attached (where
// relayers write), detached (moved out by DetachArchive, still in the
// database and read by verify and trails), or the default partition.
type Partition struct {
	Name     string
	State    string    // "attached", "detached" or "default"
	From, To time.Time // the range of created_at it holds (zero for the default)
	// Rows is an estimate (the planner's statistics; -1 before the first
	// ANALYZE) unless the listing was exact.
	Rows  int64
	Bytes int64 // table and indexes
	// KeysRetired is when the keys of the instructions that ended in this
	// detached partition were retired (zero: not yet), and RetiredKeys how
	// many that pass moved (see RetireDetachedKeys).
	KeysRetired time.Time
	RetiredKeys int64
}

// ErrArchiveLifecycle is returned for a detach or export that cannot be
// done as asked (a month not yet over, not anchored by a checkpoint, an
// unknown partition). Nothing is changed.
var ErrArchiveLifecycle = errors.New("archive lifecycle")

const partitionsSQL = `
SELECT c.relname,
       CASE WHEN c.relpartbound IS NOT NULL AND pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT' THEN 'default'
            WHEN p.relname = 'attempts' THEN 'attached' ELSE 'detached' END,
       substring(pg_get_expr(c.relpartbound, c.oid) FROM 'FROM \(''([^'']+)''\)')::timestamptz,
       substring(pg_get_expr(c.relpartbound, c.oid) FROM 'TO \(''([^'']+)''\)')::timestamptz,
       c.reltuples::bigint, pg_total_relation_size(c.oid), r.finished_at, coalesce(r.retired_keys, 0)
FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid
JOIN pg_class p ON p.oid = i.inhparent
JOIN pg_namespace n ON n.oid = p.relnamespace
LEFT JOIN {schema}.key_retirements r ON r.partition_name = c.relname AND p.relname = 'attempts_detached'
WHERE n.nspname = $1 AND p.relname IN ('attempts', 'attempts_detached')
ORDER BY 3 NULLS FIRST, 1`

// Partitions lists the archive's partitions, oldest first. With exact, Rows
// is a count (a read of every partition: run it on a replica) of the rows
// the reader's tenant setting lets it read (see partitionRows).
//
// The bounds are read back from the catalog's text of them, which the
// session's DateStyle and TimeZone write: in any style but ISO with the
// zone's abbreviation, which PostgreSQL may read as another zone's ("IST"
// as Israel's, "CST" as America's), and every month was then listed hours
// off its true bounds, which the detach moved it under and an export read
// it by. So the listing runs in a transaction of its own with the
// settings of exportSettingsSQL (inside db's transaction, if db is one,
// they last until it ends); a db that cannot open one must be in an ISO
// DateStyle, whose offsets are numbers.
func (s *Store) Partitions(ctx context.Context, db Querier, exact bool) ([]Partition, error) {
	b, ok := db.(interface {
		Begin(ctx context.Context) (pgx.Tx, error)
	})
	if !ok {
		var style string
		if err := db.QueryRow(ctx, `SELECT current_setting('DateStyle')`).Scan(&style); err != nil {
			return nil, fmt.Errorf("archive partitions: %w", err)
		}
		if !strings.HasPrefix(style, "ISO") {
			return nil, fmt.Errorf("%w: archive partitions: the session's DateStyle is %q, whose times name their zone by an abbreviation that may be read as another zone's: use ISO",
				ErrArchiveLifecycle, style)
		}
		return s.partitions(ctx, db, exact)
	}
	var out []Partition
	err := pgx.BeginFunc(ctx, b, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, exportSettingsSQL); err != nil {
			return fmt.Errorf("archive partitions: %w", err)
		}
		var err error
		out, err = s.partitions(ctx, tx, exact)
		return err
	})
	return out, err
}

// partitions is Partitions on a session whose settings write the bounds
// in a form read back as the same instants.
func (s *Store) partitions(ctx context.Context, db Querier, exact bool) ([]Partition, error) {
	rows, err := db.Query(ctx, s.sql.partitions, s.schema)
	if err != nil {
		return nil, fmt.Errorf("archive partitions: %w", err)
	}
	var out []Partition
	for rows.Next() {
		var p Partition
		var from, to, retired *time.Time
		if err := rows.Scan(&p.Name, &p.State, &from, &to, &p.Rows, &p.Bytes, &retired, &p.RetiredKeys); err != nil {
			rows.Close()
			return nil, fmt.Errorf("archive partitions: %w", err)
		}
		if from != nil && to != nil {
			p.From, p.To = from.UTC(), to.UTC()
		}
		if retired != nil {
			p.KeysRetired = retired.UTC()
		}
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("archive partitions: %w", err)
	}
	if exact {
		for i := range out {
			if err := db.QueryRow(ctx, "SELECT count(*) "+s.partitionRows(out[i], out)).Scan(&out[i].Rows); err != nil {
				return nil, fmt.Errorf("archive partitions: count %s: %w", out[i].Name, err)
			}
		}
	}
	return out, nil
}

// table is a table of the schema as a quoted identifier.
func (s *Store) table(name string) string { return pgx.Identifier{s.schema, name}.Sanitize() }

// partitionRows is the FROM and WHERE of a query of partition p's rows,
// read through its parent (attempts, or attempts_detached for a detached
// month; parts is the whole listing, p among it). Row-level security by
// tenant is on the parents, and PostgreSQL applies a parent's policies
// only to queries that name the parent: a partition named directly would
// show a reader scoped to one tenant every tenant's rows, so nobody but
// the owner may read one (migration 027). The partition's bounds let the
// planner read that partition alone (for the default partition: outside
// every attached month's bounds); tableoid keeps to it if the partitions
// changed since the listing.
func (s *Store) partitionRows(p Partition, parts []Partition) string {
	parent := "attempts"
	if p.State == "detached" {
		parent = "attempts_detached"
	}
	q := fmt.Sprintf("FROM %s WHERE tableoid = '%s'::regclass", s.table(parent), strings.ReplaceAll(s.table(p.Name), "'", "''"))
	switch {
	case p.State == "default":
		for _, o := range parts {
			if o.State == "attached" && !o.From.IsZero() && !o.To.IsZero() {
				q += fmt.Sprintf(" AND NOT (created_at >= %s AND created_at < %s)", quoteTime(o.From), quoteTime(o.To))
			}
		}
	case !p.From.IsZero() && !p.To.IsZero():
		q += fmt.Sprintf(" AND created_at >= %s AND created_at < %s", quoteTime(p.From), quoteTime(p.To))
	}
	return q
}

// DetachArchive moves every attached partition that ends at or before
// `before` (not in the future; the CLI takes a month) out
// of attempts into attempts_detached, and returns their names. Nothing is
// deleted: the rows stay in the database, append-only, in the archive view
// that verify and trails read. It refuses months that the checkpoints do
// not cover yet (the checkpoints are what make a later loss of the
// detached table detectable), and waits at most lockTimeout for the
// archive's lock on each partition (a long reader on the primary would
// otherwise queue every relayer's writes behind the detach), failing
// rather than stalling the relayers.
//
// Each partition first gets a validated CHECK constraint equal to its
// bounds (read without blocking writers), so the move itself is one short
// transaction that re-attaches without scanning.
//
// On a db that opens transactions of its own (a pool), a connection that
// breaks during a month's move is settled on another connection: a month
// that moved is listed and the next ones are moved; one that did not
// stops it with ErrActionNotDone (run it again), and one that cannot be
// told with ErrCommitUnknown (`outbox archive list` shows where it is).
// The months listed before either were moved.
func (s *Store) DetachArchive(ctx context.Context, db Batcher, before time.Time, lockTimeout time.Duration) ([]string, error) {
	var now, covered time.Time
	if err := db.QueryRow(ctx, `SELECT now(), coalesce((SELECT max(period_end) FROM `+s.table("checkpoints")+`), 'epoch')`).
		Scan(&now, &covered); err != nil {
		return nil, fmt.Errorf("detach archive: %w", err)
	}
	if before.After(now) {
		return nil, fmt.Errorf("%w: cannot detach up to %s: that is in the future (relayers still write there)",
			ErrArchiveLifecycle, before.UTC().Format(time.RFC3339))
	}
	parts, err := s.Partitions(ctx, db, false)
	if err != nil {
		return nil, err
	}
	var detached []string
	for _, p := range parts {
		if p.State != "attached" || p.To.After(before) {
			continue
		}
		if covered.Before(p.To) {
			return detached, fmt.Errorf("%w: %s ends at %s, but the checkpoints cover the archive only up to %s: take a checkpoint first (outbox audit checkpoint)",
				ErrArchiveLifecycle, p.Name, p.To.Format(time.RFC3339), covered.UTC().Format(time.RFC3339))
		}
		if err := s.detachPartition(ctx, db, p, lockTimeout); err != nil {
			return detached, err
		}
		detached = append(detached, p.Name)
	}
	return detached, nil
}

// detachPartition moves one partition (see DetachArchive).
func (s *Store) detachPartition(ctx context.Context, db Batcher, p Partition, lockTimeout time.Duration) error {
	name, check := s.table(p.Name), pgx.Identifier{p.Name + "_bounds"}.Sanitize()
	from, to := quoteTime(p.From), quoteTime(p.To)
	// The bounds as a constraint: added NOT VALID (a moment's lock), then
	// validated under a lock that lets reads and the other partitions'
	// writes go on.
	var exists bool
	if err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_constraint WHERE conrelid = $1::regclass AND conname = $2)`,
		name, p.Name+"_bounds").Scan(&exists); err != nil {
		return fmt.Errorf("detach %s: %w", p.Name, err)
	}
	if !exists {
		if _, err := db.Exec(ctx, fmt.Sprintf(`ALTER TABLE %s ADD CONSTRAINT %s CHECK (created_at >= %s AND created_at < %s) NOT VALID`,
			name, check, from, to)); err != nil {
			return fmt.Errorf("detach %s: bounds: %w", p.Name, err)
		}
	}
	if _, err := db.Exec(ctx, fmt.Sprintf(`ALTER TABLE %s VALIDATE CONSTRAINT %s`, name, check)); err != nil {
		return fmt.Errorf("detach %s: validate bounds: %w", p.Name, err)
	}
	move := func(tx Querier) (bool, error) {
		if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", max(1, lockTimeout.Milliseconds()))); err != nil {
			return false, err
		}
		if _, err := tx.Exec(ctx, fmt.Sprintf(`ALTER TABLE %s DETACH PARTITION %s`, s.table("attempts"), name)); err != nil {
			return false, fmt.Errorf("detach %s: %w", p.Name, err)
		}
		if _, err := tx.Exec(ctx, fmt.Sprintf(`ALTER TABLE %s ATTACH PARTITION %s FOR VALUES FROM (%s) TO (%s)`,
			s.table("attempts_detached"), name, from, to)); err != nil {
			return false, fmt.Errorf("detach %s: attach to attempts_detached: %w", p.Name, err)
		}
		// Read through attempts_detached only, under its tenant policy, as
		// it was through attempts (migration 027): a grant made on the
		// month meanwhile goes with the move.
		if _, err := tx.Exec(ctx, fmt.Sprintf(`SELECT %s.seal_archive_partition($1::regclass)`, pgx.Identifier{s.schema}.Sanitize()), name); err != nil {
			return false, fmt.Errorf("detach %s: seal: %w", p.Name, err)
		}
		return true, nil
	}
	if _, inTx := db.(pgx.Tx); inTx {
		return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			_, err := move(tx)
			return err
		})
	}
	// A connection that breaks once the move is under way leaves it
	// unknown whether it committed; reported as a failure, a month that
	// moved was left out of the list of those detached. Settled on another
	// connection as the operator actions are (settledAction): the month
	// is under attempts_detached (done) or still under attempts (not done).
	_, err := s.settledAction(ctx, db, move, func(q Querier, _ actionSession) (bool, error) {
		var parent string
		if err := q.QueryRow(ctx, partitionParentSQL, name).Scan(&parent); err != nil {
			return false, err
		}
		switch parent {
		case "attempts_detached":
			return true, nil
		case "attempts":
			return false, nil
		}
		return false, fmt.Errorf("%s is a partition of %s", p.Name, parent)
	})
	if errors.Is(err, ErrCommitUnknown) || errors.Is(err, ErrActionNotDone) {
		return fmt.Errorf("detach %s: %w", p.Name, err)
	}
	return err
}

// partitionParentSQL names the table the archive partition $1 (a
// qualified name) is a partition of.
const partitionParentSQL = `SELECT p.relname FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhparent WHERE i.inhrelid = $1::regclass`

// quoteTime is a timestamptz literal for DDL, which takes no parameters.
// The value comes from the catalog, never from input.
func quoteTime(t time.Time) string {
	return "'" + t.UTC().Format("2006-01-02 15:04:05.999999Z07:00") + "'"
}

// retireKeysSQL writes the compact form (migration 011) of the keys of
// the next $2 instructions that ended in an archive partition (%[1]s), in
// outbox id order after $1 (its outbox id index), and returns the last
// outbox id it looked at and the batch's outbox ids; the keys themselves
// stay live until dropRetiredKeysSQL removes them (see retireKeys). An
// instruction ended there if the partition holds its DISPATCHED or
// CANCELLED row (both final: a cancelled instruction is never sent, and
// its key only answers a duplicate), and it is then neither pending, in
// flight nor a dead letter (a late outcome's requeued copy, a replay under
// its key); or if its dead letter was acknowledged there and nothing
// happened to it since (the dead letter's chain head is that ACKNOWLEDGED
// row): the dead letter then leaves dead_letters in the same statement
// that retires its key, so that it can no longer be replayed. Its history
// stays in the archive, and dead_letters holds what an operator has still
// to look at plus what was acknowledged within the attached months. A
// digest already written (a run cut short before its keys went) is left
// as it is.
//
// Once a digest is committed every enqueue of its key is refused:
// insertKeysSQL skips it, and the lookup reports it retired while the key
// is still live beside it (the caller's transaction stays usable). A replay of
// the dead letter that comes after waits on its row lock and then finds
// it gone, like one of a dead letter that never was. One that came first
// (its statement's snapshot is older than this one's, or it had not
// committed yet) moved the instruction back to pending: the delete,
// having waited for it, finds the dead letter gone, and the key is not
// retired (a key is retired only with the dead letter it came with, never
// without it), or the instruction would be pending with its key retired.
//
// Each key is found by its outbox id (a LATERAL lookup per instruction,
// the queue checked the same way) and deleted by row id. Joined to the
// batch as a whole, the keys table and the queue were hashed whole for
// every batch (the planner's choice for 10,000 rows, until the keys table
// is many times larger than a batch): at 1,000,000 keys, 256 ms a batch
// against 138 ms by key, and more with every key enqueued since. An
// instruction's rows are read whole (the page ends at a row, not at an
// instruction).
//
// Its third column counts the batch's instructions whose key is already
// gone, retired since the last pass that finished (key_retirements): the
// keys a run of this pass that was cut short (killed after it removed
// them, before the pass was recorded) had retired. The pass counts them
// with the keys it moves itself; before, the run that finished the pass
// recorded only its own, and `archive list` showed a month whose keys had
// all been retired with 0. Digests written by an earlier month's pass
// are older than its record, so they are not counted again. The digest
// is looked up only for an instruction whose key is gone, by its archive
// row's identity.
const retireKeysSQL = `
WITH ids AS (
  SELECT DISTINCT outbox_id FROM (
    SELECT outbox_id FROM %[1]s WHERE outbox_id > $1 AND state IN ('DISPATCHED', 'CANCELLED', 'ACKNOWLEDGED')
    ORDER BY outbox_id LIMIT $2) x
), done AS (
  SELECT i.outbox_id, e.final, e.acks FROM ids i
  CROSS JOIN LATERAL (
    SELECT bool_or(a.state <> 'ACKNOWLEDGED') AS final, array_agg(a.hash) FILTER (WHERE a.state = 'ACKNOWLEDGED') AS acks
    FROM %[1]s a WHERE a.outbox_id = i.outbox_id AND a.state IN ('DISPATCHED', 'CANCELLED', 'ACKNOWLEDGED')) e
), targets AS (
  SELECT d.outbox_id, k.row, k.dead FROM done d
  CROSS JOIN LATERAL (
    SELECT k.ctid AS row, dl.ctid AS dead FROM {schema}.idempotency_keys k
    LEFT JOIN {schema}.dead_letters dl ON dl.outbox_id = k.outbox_id
    WHERE k.outbox_id = d.outbox_id
      AND NOT EXISTS (SELECT 1 FROM {schema}.pending p WHERE p.outbox_id = k.outbox_id)
      AND NOT EXISTS (SELECT 1 FROM {schema}.inflight f WHERE f.outbox_id = k.outbox_id)
      AND CASE WHEN dl.outbox_id IS NULL THEN d.final
               ELSE dl.acknowledged_at IS NOT NULL AND dl.chain_head = ANY (d.acks) END
    LIMIT 1) k
), settled AS (
  DELETE FROM {schema}.dead_letters dl WHERE dl.ctid = ANY (ARRAY(SELECT dead FROM targets WHERE dead IS NOT NULL))
  RETURNING dl.outbox_id
), retired AS (
  INSERT INTO {schema}.retired_keys (digest, outbox_id, tenant_id, participant_id, sequence_id, created_at)
  SELECT {schema}.key_digest(k.tenant_id, k.instruction_id, k.idempotency_key), k.outbox_id, nullif(k.tenant_id, ''),
         k.participant_id, k.sequence_id, k.created_at
  FROM {schema}.idempotency_keys k
  WHERE k.ctid = ANY (ARRAY(SELECT row FROM targets WHERE dead IS NULL OR outbox_id IN (SELECT outbox_id FROM settled)))
  ON CONFLICT (digest) DO NOTHING
), gone AS (
  SELECT count(*) AS n FROM ids i
  LEFT JOIN LATERAL (SELECT 1 AS live FROM {schema}.idempotency_keys k WHERE k.outbox_id = i.outbox_id LIMIT 1) l ON true
  CROSS JOIN LATERAL (
    SELECT 1 FROM %[1]s a
    JOIN {schema}.retired_keys r ON r.digest = {schema}.key_digest(coalesce(a.tenant_id, ''), a.instruction_id, a.idempotency_key)
    WHERE a.outbox_id = i.outbox_id AND r.outbox_id = i.outbox_id
      AND r.retired_at >= (SELECT coalesce(max(finished_at), '-infinity') FROM {schema}.key_retirements)
    LIMIT 1) g
  WHERE l.live IS NULL
)
SELECT (SELECT outbox_id FROM ids ORDER BY outbox_id DESC LIMIT 1), ARRAY(SELECT outbox_id FROM ids), (SELECT n FROM gone)`

// dropRetiredKeysSQL removes the live keys, among the outbox ids $1 (a
// batch of retireKeysSQL), whose digest is retired, by outbox id (its
// unique index), and returns how many. It runs once no transaction that
// could still miss the digests is left (see retireKeys).
const dropRetiredKeysSQL = `
WITH moved AS (
  DELETE FROM {schema}.idempotency_keys k
  WHERE k.outbox_id = ANY ($1::uuid[])
    AND EXISTS (SELECT 1 FROM {schema}.retired_keys r
                WHERE r.digest = {schema}.key_digest(k.tenant_id, k.instruction_id, k.idempotency_key))
  RETURNING 1
)
SELECT count(*) FROM moved`

// runningXactsSQL and stillRunningSQL find the client sessions'
// transactions of this database that are running now (each holds its
// virtual transaction id's lock from its start to its end, whether it
// wrote or only read), and which of them still are. pg_locks shows every
// session's locks to every role, where pg_stat_activity hides other
// roles' snapshots. Autovacuum and other background processes enqueue
// nothing and may run for long: they are not waited for.
const (
	runningXactsSQL = `
SELECT coalesce(array_agg(l.virtualtransaction), '{}')
FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'virtualxid' AND l.granted AND a.datname = current_database() AND a.backend_type = 'client backend'
  AND l.pid <> pg_backend_pid()`
	stillRunningSQL = `
SELECT count(*) FROM pg_locks l
WHERE l.locktype = 'virtualxid' AND l.granted AND l.virtualtransaction = ANY ($1::text[])`
)

// retiredKeysWait bounds how long a retirement waits for the transactions
// that were running when it committed a batch's digests (as checkpoints
// wait for theirs).
const retiredKeysWait = 30 * time.Second

// RetireKeys moves the idempotency keys of the instructions that ended in
// an archive partition (dispatched, cancelled, or a dead letter
// acknowledged there, which leaves dead_letters with its key) into their
// compact form, batch instructions per transaction, and returns how many
// it moved. A retired key is still refused forever (pending.ErrKeyRetired)
// but no longer returns its original receipt. DetachArchive's caller
// retires the keys of each partition it detached, so a key lives in full
// as long as the archive month that ended its instruction is attached.
// Finding the keys through the archive keeps the enqueue free of any index
// on the keys' time.
func (s *Store) RetireKeys(ctx context.Context, db Querier, partition string, batch int) (int64, error) {
	if err := s.checkPartition(ctx, db, partition); err != nil {
		return 0, err
	}
	moved, _, err := s.retireKeys(ctx, db, partition, batch)
	return moved, err
}

// retireKeys is RetireKeys for a partition the catalog has just listed;
// earlier is how many of the partition's keys were already gone, retired
// since the last pass that finished (see retireKeysSQL).
func (s *Store) retireKeys(ctx context.Context, db Querier, partition string, batch int) (total, earlier int64, err error) {
	if batch <= 0 {
		batch = 10_000
	}
	q := s.RetireKeysSQL(partition)
	for after := uuid.Nil; ; {
		var last *uuid.UUID
		var ids []uuid.UUID
		var gone int64
		if err := db.QueryRow(ctx, q, after, batch).Scan(&last, &ids, &gone); err != nil {
			return total, earlier, fmt.Errorf("retire keys of %s after %s: %w", partition, after, err)
		}
		earlier += gone
		if last == nil {
			return total, earlier, nil
		}
		// The digests are committed, the keys still live. A transaction
		// that reads from one snapshot (REPEATABLE READ, SERIALIZABLE)
		// taken before that commit does not see the digests; had the keys
		// gone with them, its enqueue of one found neither and enqueued
		// the instruction again, to be paid twice. While the key is live
		// such an enqueue is a duplicate; every later snapshot sees the
		// digest (an enqueue is refused). So the keys go once every
		// transaction running now has ended. A wait cut short leaves them
		// live beside their digests, which is safe, and the next run
		// removes them (their digests are found again).
		if err := s.waitForRunningTransactions(ctx, db, retiredKeysWait); err != nil {
			return total, earlier, fmt.Errorf("retire keys of %s after %s: %w", partition, after, err)
		}
		var n int64
		if err := db.QueryRow(ctx, s.sql.dropRetiredKeys, ids).Scan(&n); err != nil {
			return total, earlier, fmt.Errorf("retire keys of %s after %s: %w", partition, after, err)
		}
		total += n
		after = *last
	}
}

// waitForRunningTransactions waits (at most wait) until every transaction
// of this database that is running now, other than db's own, has ended.
func (s *Store) waitForRunningTransactions(ctx context.Context, db Querier, wait time.Duration) error {
	var running []string
	if err := db.QueryRow(ctx, runningXactsSQL).Scan(&running); err != nil {
		return fmt.Errorf("transactions running: %w", err)
	}
	deadline := time.Now().Add(wait)
	for len(running) > 0 {
		var n int
		if err := db.QueryRow(ctx, stillRunningSQL, running).Scan(&n); err != nil {
			return fmt.Errorf("transactions running: %w", err)
		}
		if n == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: %d transactions that were running when the keys' digests were committed are still open after %s: run it again",
				ErrArchiveLifecycle, n, wait)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	return nil
}

// RetireDetachedKeys retires the keys of every detached partition that no
// earlier pass finished (see RetireKeys), oldest first, recording each
// finished pass in key_retirements (migration 023), and returns how many
// keys it moved. A pass cut short (an error, a crash) is not recorded, so
// the next call does it again; one that finished is never repeated: an
// instruction's key is retired by the month of its last row, and what
// kept a key at that month's pass ends in a later month, whose own pass
// retires it. So each detached month is read once, however many are kept.
func (s *Store) RetireDetachedKeys(ctx context.Context, db Querier, batch int) (int64, error) {
	parts, err := s.Partitions(ctx, db, false)
	if err != nil {
		return 0, err
	}
	var total int64
	for _, p := range parts {
		if p.State != "detached" || !p.KeysRetired.IsZero() {
			continue
		}
		n, earlier, err := s.retireKeys(ctx, db, p.Name, batch)
		total += n
		if err != nil {
			return total, err
		}
		// Two runs at once both finish the pass (the keys' row locks keep
		// them from moving a key twice); the first to record it wins. The
		// pass's count has the keys a run cut short had retired.
		if _, err := db.Exec(ctx, s.sql.keysRetired, p.Name, n+earlier); err != nil {
			return total, fmt.Errorf("retire keys of %s: record the pass: %w", p.Name, err)
		}
	}
	return total, nil
}

const keysRetiredSQL = `
INSERT INTO {schema}.key_retirements (partition_name, retired_keys) VALUES ($1, $2)
ON CONFLICT (partition_name) DO NOTHING`

// RetireKeysSQL is RetireKeys' statement for partition, for plan tests.
func (s *Store) RetireKeysSQL(partition string) string {
	return fmt.Sprintf(s.sql.retireKeys, s.table(partition))
}

// checkPartition refuses a name that is not one of the archive's
// partitions (attached, detached or default): the name goes into SQL as an
// identifier, so only names the catalog lists may.
func (s *Store) checkPartition(ctx context.Context, db Querier, name string) error {
	_, _, err := s.findPartition(ctx, db, name)
	return err
}

// findPartition is checkPartition that also returns the partition and the
// whole listing.
func (s *Store) findPartition(ctx context.Context, db Querier, name string) (Partition, []Partition, error) {
	parts, err := s.Partitions(ctx, db, false)
	if err != nil {
		return Partition{}, nil, err
	}
	for _, p := range parts {
		if p.Name == name {
			return p, parts, nil
		}
	}
	return Partition{}, nil, fmt.Errorf("%w: %q is not a partition of the archive (outbox archive list)", ErrArchiveLifecycle, name)
}

// ExportPartition writes one archive partition (attached or detached) to w
// as CSV with a header line, in (created_at, attempt_id) order, and returns
// the number of rows. It reads the partition through its parent, so a
// reader scoped to a tenant exports that tenant's rows of the month and no
// other's; the whole month is an export by a reader of every tenant
// (outbox.tenant '*') or by the owner.
//
// The CSV is the same bytes whatever the database's or the session's
// settings (exportSettingsSQL): an auditor compares a later export of a
// month with the copy and checksum kept, and the session's TimeZone,
// DateStyle and bytea_output would otherwise change every time and hash.
func (s *Store) ExportPartition(ctx context.Context, conn *pgx.Conn, name string, w io.Writer) (int64, error) {
	var rows int64
	err := pgx.BeginTxFunc(ctx, conn, pgx.TxOptions{AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, exportSettingsSQL); err != nil {
			return fmt.Errorf("export %s: %w", name, err)
		}
		p, parts, err := s.findPartition(ctx, tx, name)
		if err != nil {
			return err
		}
		tag, err := conn.PgConn().CopyTo(ctx, w, `COPY (SELECT * `+s.partitionRows(p, parts)+` ORDER BY created_at, attempt_id) TO STDOUT WITH (FORMAT csv, HEADER true)`)
		if err != nil {
			return fmt.Errorf("export %s: %w", name, err)
		}
		rows = tag.RowsAffected()
		return nil
	})
	return rows, err
}

// exportSettingsSQL fixes, for the transaction only, every setting that
// changes how the archive's columns and the partitions' bounds are written
// as text (COPY, pg_get_expr): times in UTC and ISO form, hashes as hex.
const exportSettingsSQL = `SELECT set_config('TimeZone', 'UTC', true), set_config('DateStyle', 'ISO, YMD', true),
       set_config('IntervalStyle', 'postgres', true), set_config('bytea_output', 'hex', true),
       set_config('extra_float_digits', '1', true)`
