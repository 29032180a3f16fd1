-- Checkpoints serialize on a lock only the owner can take, migration 034.
--
-- take_checkpoint (migration 031) serialized its callers on an advisory
-- lock. PostgreSQL has no privilege for advisory locks: any role that can
-- connect (a producer, an auditor) could take that lock and hold it, and
-- every checkpoint then waited and failed (the relayers' and reapers'
-- calls are bounded), so no period was closed while it held it. It now
-- locks the checkpoints table itself, in SHARE ROW EXCLUSIVE mode: the
-- mode conflicts with itself (one checkpointer at a time, as before) and
-- with every write, and PostgreSQL lets only a role that may update,
-- delete or truncate the table take it (the owner, under whom the
-- function runs where the roles are in place). Readers of the checkpoints
-- (ACCESS SHARE, what a SELECT or an auditor's LOCK takes) neither wait
-- for it nor hold it up. Same function otherwise; its standing is kept as
-- migration 031 set it.
DO $m$
DECLARE
  definer boolean := (SELECT prosecdef FROM pg_proc
                      WHERE oid = '{{.schema}}.take_checkpoint(timestamptz, interval, interval)'::regprocedure);
BEGIN
  CREATE OR REPLACE FUNCTION {{.schema}}.take_checkpoint(p_end timestamptz, p_wait interval DEFAULT '30 seconds',
                                                         p_min_period interval DEFAULT '0')
  RETURNS SETOF {{.schema}}.checkpoints
  LANGUAGE plpgsql AS $fn$
  DECLARE
    last_end  timestamptz;
    last_hash bytea;
    s timestamptz;
    e timestamptz;
    month_end timestamptz;
    snap pg_snapshot;
    deadline timestamptz;
    n bigint;
    d bytea;
  BEGIN
    -- One checkpointer at a time, on a lock only the owner can take (it
    -- conflicts with itself and with every write to the table).
    LOCK TABLE {{.schema}}.checkpoints IN SHARE ROW EXCLUSIVE MODE;
    SELECT c.period_end, c.hash INTO last_end, last_hash
    FROM {{.schema}}.checkpoints c ORDER BY c.period_start DESC LIMIT 1;
    s := coalesce(last_end, (SELECT chained_since FROM {{.schema}}.settings));
    month_end := (date_trunc('month', s AT TIME ZONE 'UTC') + interval '1 month') AT TIME ZONE 'UTC';
    -- Never past the clock: rows not stamped yet cannot be digested.
    e := least(p_end, month_end, clock_timestamp());
    IF e <= s OR (e - s < p_min_period AND e < month_end) THEN
      RETURN;
    END IF;
    snap := pg_current_snapshot();
    deadline := clock_timestamp() + p_wait;
    WHILE EXISTS (SELECT 1 FROM pg_snapshot_xip(snap) x WHERE pg_xact_status(x) = 'in progress') LOOP
      IF clock_timestamp() > deadline THEN
        RAISE EXCEPTION 'outbox checkpoint: transactions running since before % are still open after %', s, p_wait
          USING ERRCODE = 'lock_not_available';
      END IF;
      PERFORM pg_sleep(0.01);
    END LOOP;
    SELECT count(*), sha256(coalesce(string_agg(coalesce(a.hash, '\x'::bytea), '\x'::bytea ORDER BY a.created_at, a.attempt_id), '\x'::bytea))
    INTO n, d
    FROM {{.schema}}.attempts a WHERE a.created_at >= s AND a.created_at < e;
    RETURN QUERY
    INSERT INTO {{.schema}}.checkpoints (period_start, period_end, row_count, digest, prev_hash, hash)
    VALUES (s, e, n, d, last_hash, {{.schema}}.checkpoint_hash(last_hash, s, e, n, d))
    RETURNING *;
  END $fn$;
  IF definer THEN
    ALTER FUNCTION {{.schema}}.take_checkpoint(timestamptz, interval, interval) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
  END IF;
END $m$;
