package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrPartitionMissing is returned by partition upkeep when a month it
// keeps could not be created (its rows are in the default partition).
var ErrPartitionMissing = errors.New("archive partition missing")

// EnsurePartitions creates the archive's monthly partitions for the current
// month and monthsAhead months after it. Idempotent. A month whose rows
// are already in the default partition cannot be created (the function
// only warns, so that the other months still are, and a warning reaches
// no log): it then returns ErrPartitionMissing naming the months missing,
// so that upkeep's failure is seen while that month's rows go on into the
// default partition.
func (s *Store) EnsurePartitions(ctx context.Context, db Querier, monthsAhead int) error {
	if _, err := db.Exec(ctx, s.sql.ensurePartitions, monthsAhead); err != nil {
		return fmt.Errorf("ensure partitions: %w", err)
	}
	var missing []string
	if err := db.QueryRow(ctx, missingPartitionsSQL, s.schema, monthsAhead).Scan(&missing); err != nil {
		return fmt.Errorf("ensure partitions: %w", err)
	}
	if len(missing) > 0 {
		return fmt.Errorf("ensure partitions: %w: %s (the default partition holds rows of those months: outbox archive move-default, docs/operations.md, \"The archive's lifecycle\")",
			ErrPartitionMissing, strings.Join(missing, ", "))
	}
	return nil
}

const ensurePartitionsSQL = `SELECT {schema}.ensure_attempt_partitions($1)`

// missingPartitionsSQL names the months ensure_attempt_partitions keeps
// ($2 ahead, in UTC) that are not partitions of the schema $1's archive.
const missingPartitionsSQL = `
SELECT coalesce(array_agg(n.name ORDER BY i), '{}')
FROM generate_series(0, $2::int) i
CROSS JOIN LATERAL (SELECT 'attempts_' || to_char(date_trunc('month', now() AT TIME ZONE 'UTC') + make_interval(months => i), 'YYYY_MM') AS name) n
WHERE NOT EXISTS (SELECT 1 FROM pg_inherits h JOIN pg_class c ON c.oid = h.inhrelid JOIN pg_class p ON p.oid = h.inhparent
                  JOIN pg_namespace ns ON ns.oid = p.relnamespace
                  WHERE ns.nspname = $1 AND p.relname = 'attempts' AND c.relname = n.name)`

// MovedMonth is one month that MoveDefaultRows gave a partition of its
// own: its name, its bounds in UTC, and how many rows it took from the
// default partition.
type MovedMonth struct {
	Partition string
	From, To  time.Time
	Rows      int64
}

// MoveDefaultRows gives every month whose rows are in the archive's
// default partition a partition of its own and moves those rows into it.
//
// Rows land in the default partition when they are written in a month
// upkeep has not created (every relayer and reaper stopped for longer than
// the months made ahead), and that month can then never be created, so its
// rows could never be detached, exported by month or have their keys
// retired, and upkeep failed with ErrPartitionMissing for the rest of the
// month. Everything happens in one transaction, so the archive never shows
// a row twice or not at all: each month's rows are copied, column by
// column, into a new table shaped as the archive (its indexes, defaults and
// checks, and the month's bounds as a constraint that a later detach reuses),
// deleted from the default partition (its append-only trigger is turned
// off for that statement alone, and the copy's and the deletion's counts
// must agree), and the table is attached as the month's partition, owned
// by the archive's owner, with its truncate trigger, sealed as upkeep
// seals a month. No row's content changes, so hashes, chains and
// checkpoints verify as before.
//
// It holds the default partition's exclusive lock (waiting at most
// lockTimeout for it) and, to attach, a lock on attempts that relayers'
// inserts into other months do not wait for; only writes into the default
// partition itself (the current month, when it is one of those missing)
// and reads of it (a late outcome's look-up) wait until it commits. A
// month named by a table that already exists (a detached month whose rows
// reached the default partition through a clock gone backwards) is
// refused with ErrArchiveLifecycle, and nothing is moved. It needs the
// schema's owner (or a superuser).
func (s *Store) MoveDefaultRows(ctx context.Context, db TxBeginner, lockTimeout time.Duration) ([]MovedMonth, error) {
	var moved []MovedMonth
	err := pgx.BeginTxFunc(ctx, db, pgx.TxOptions{}, func(tx pgx.Tx) error {
		moved = nil
		// The month's bounds are read and written as UTC ISO text,
		// whatever the session's zone and date style.
		if _, err := tx.Exec(ctx, exportSettingsSQL); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", max(1, lockTimeout.Milliseconds()))); err != nil {
			return err
		}
		var def, owner, columns string
		err := tx.QueryRow(ctx, defaultPartitionSQL, s.schema).Scan(&def, &owner, &columns)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil // no default partition: nothing can be in it
		}
		if err != nil {
			return err
		}
		def = s.table(def)
		if _, err := tx.Exec(ctx, "LOCK TABLE "+def+" IN ACCESS EXCLUSIVE MODE"); err != nil {
			return fmt.Errorf("lock the default partition: %w", err)
		}
		rows, err := tx.Query(ctx, fmt.Sprintf(`SELECT DISTINCT date_trunc('month', created_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' FROM %s ORDER BY 1`, def))
		if err != nil {
			return err
		}
		months, err := pgx.CollectRows(rows, pgx.RowTo[time.Time])
		if err != nil {
			return err
		}
		for _, from := range months {
			m, err := s.moveMonth(ctx, tx, def, owner, columns, from.UTC())
			if err != nil {
				return err
			}
			moved = append(moved, m)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("move the default partition's rows: %w", err)
	}
	return moved, nil
}

// moveMonth moves one month of the default partition def into a partition
// of its own (see MoveDefaultRows).
func (s *Store) moveMonth(ctx context.Context, tx pgx.Tx, def, owner, columns string, from time.Time) (MovedMonth, error) {
	m := MovedMonth{Partition: "attempts_" + from.Format("2006_01"), From: from, To: from.AddDate(0, 1, 0)}
	name, lo, hi := s.table(m.Partition), quoteTime(m.From), quoteTime(m.To)
	var taken bool
	if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, name).Scan(&taken); err != nil {
		return m, err
	}
	if taken {
		return m, fmt.Errorf("%w: the default partition holds rows of %s, but a table %s already exists (a detached month?): nothing was moved",
			ErrArchiveLifecycle, from.Format("2006-01"), m.Partition)
	}
	within := fmt.Sprintf("created_at >= %s AND created_at < %s", lo, hi)
	var deleted int64
	for _, q := range []struct {
		sql  string
		rows *int64
	}{
		{fmt.Sprintf("CREATE TABLE %s (LIKE %s INCLUDING ALL)", name, s.table("attempts")), nil},
		{fmt.Sprintf("ALTER TABLE %s ADD CONSTRAINT %s CHECK (%s)", name, pgx.Identifier{m.Partition + "_bounds"}.Sanitize(), within), nil},
		{fmt.Sprintf("INSERT INTO %s (%s) SELECT %[2]s FROM %s WHERE %s", name, columns, def, within), &m.Rows},
		{fmt.Sprintf("ALTER TABLE %s DISABLE TRIGGER attempts_append_only", def), nil},
		{fmt.Sprintf("DELETE FROM %s WHERE %s", def, within), &deleted},
		{fmt.Sprintf("ALTER TABLE %s ENABLE TRIGGER attempts_append_only", def), nil},
		{fmt.Sprintf("ALTER TABLE %s OWNER TO %s", name, pgx.Identifier{owner}.Sanitize()), nil},
		{fmt.Sprintf("ALTER TABLE %s ATTACH PARTITION %s FOR VALUES FROM (%s) TO (%s)", s.table("attempts"), name, lo, hi), nil},
		{fmt.Sprintf("CREATE TRIGGER attempts_no_truncate BEFORE TRUNCATE ON %s FOR EACH STATEMENT EXECUTE FUNCTION %s.reject_attempt_change()",
			name, pgx.Identifier{s.schema}.Sanitize()), nil},
		{fmt.Sprintf("SELECT %s.seal_archive_partition(%s::regclass)", pgx.Identifier{s.schema}.Sanitize(), "'"+strings.ReplaceAll(name, "'", "''")+"'"), nil},
	} {
		tag, err := tx.Exec(ctx, q.sql)
		if err != nil {
			return m, fmt.Errorf("%s: %w", m.Partition, err)
		}
		if q.rows != nil {
			*q.rows = tag.RowsAffected()
		}
	}
	if deleted != m.Rows {
		return m, fmt.Errorf("%s: copied %d rows but deleted %d from the default partition: nothing was moved", m.Partition, m.Rows, deleted)
	}
	return m, nil
}

// defaultPartitionSQL finds the archive's default partition in schema $1,
// the archive's owner, and the archive's columns in order (the default
// partition may have been created before some of them were added, so
// rows are copied by name).
const defaultPartitionSQL = `
SELECT c.relname, pg_get_userbyid(p.relowner),
       (SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) FROM pg_attribute
        WHERE attrelid = p.oid AND attnum > 0 AND NOT attisdropped)
FROM pg_inherits i
JOIN pg_class c ON c.oid = i.inhrelid
JOIN pg_class p ON p.oid = i.inhparent
JOIN pg_namespace n ON n.oid = p.relnamespace
WHERE n.nspname = $1 AND p.relname = 'attempts' AND pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT'`
