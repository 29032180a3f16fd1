-- Checkpoints of bounded size, migration 043.
--
-- take_checkpoint digests every archive row of its period in one statement
-- (string_agg of the rows' hashes, then sha256), and its period ran from
-- the end of the last checkpoint to the caller's end. After hours without
-- a checkpoint (each one refused while a long transaction ran anywhere in
-- the cluster, or checkpointing left off), the next one had hours of rows
-- to digest at once: past the relayers' statement timeout (30 s), or past
-- PostgreSQL's 1 GB for one value (34 million rows, under five hours at
-- 1,000 instructions/s), it failed, and every later call started at the
-- same place with a longer period and failed too: no checkpoint was taken
-- again, and `archive detach` refused every month after.
--
-- A period now holds at most outbox.checkpoint_max_rows archive rows
-- (1,000,000 unless the session sets it), or lasts a millisecond: when the
-- period asked for holds more, it is cut at the longest window from its
-- start, a minute doubled or halved, that holds no more. Each count reads
-- at most that many rows more than one through the archive's BRIN index on
-- created_at (the archive has no other index on time), so a normal
-- checkpoint reads its rows twice, and one of a backlog a few times: a
-- backlog is closed in steps of bounded size. A period so cut is taken
-- even when it is shorter than the minimum period asked for.
--
-- Before digesting, a checkpoint waits for the transactions that were
-- running when it began and could still commit rows into its period. It
-- waited for the transaction ids of its snapshot's list of running ones,
-- which had two faults. That list holds every transaction of the cluster
-- that has written anything: a producer's long business transaction, or
-- a batch job in another database of the same cluster, refused every
-- checkpoint for as long as it ran. And it leaves out those whose id is
-- not below the snapshot's xmax (the last completed transaction's id plus
-- one): on a quiet database the newest writer of the archive, with no
-- transaction completed after it got its id, was not waited for, and the
-- checkpoint digested its period without the row it was about to commit,
-- which audit verify then reported as a changed period. It now waits for
-- every transaction that holds a lock on the archive (every insert into
-- it takes one on attempts, kept to the transaction's end) and got its
-- transaction id before the checkpoint's own, found through pg_locks,
-- which every role reads whole (pg_stat_activity hides other roles'
-- transaction ids). Same
-- function otherwise (migration 034's table lock, 031's clock bound); its standing
-- (SECURITY DEFINER where the roles are in place), owner and grants are
-- kept.
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
    cut boolean := false;
    w interval;
    max_rows bigint;
    month_end timestamptz;
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
    -- Never more than max_rows rows (but for a millisecond's): a backlog
    -- is closed in steps.
    IF e > s THEN
      max_rows := greatest(coalesce(nullif(current_setting('outbox.checkpoint_max_rows', true), '')::bigint, 1000000), 1);
      SELECT count(*) INTO n FROM (SELECT FROM {{.schema}}.attempts a
                                   WHERE a.created_at >= s AND a.created_at < e LIMIT max_rows + 1) r;
      IF n > max_rows THEN
        cut := true;
        w := least(interval '1 minute', e - s);
        LOOP -- halve a window that holds too many (a burst)
          SELECT count(*) INTO n FROM (SELECT FROM {{.schema}}.attempts a
                                       WHERE a.created_at >= s AND a.created_at < s + w LIMIT max_rows + 1) r;
          EXIT WHEN n <= max_rows OR w <= interval '1 millisecond';
          w := greatest(w / 2, interval '1 millisecond');
        END LOOP;
        WHILE n <= max_rows AND s + 2 * w < e LOOP -- double one that holds few enough
          SELECT count(*) INTO n FROM (SELECT FROM {{.schema}}.attempts a
                                       WHERE a.created_at >= s AND a.created_at < s + 2 * w LIMIT max_rows + 1) r;
          IF n <= max_rows THEN
            w := 2 * w;
          END IF;
        END LOOP;
        e := s + w;
      END IF;
    END IF;
    IF e <= s OR (NOT cut AND e - s < p_min_period AND e < month_end) THEN
      RETURN;
    END IF;
    deadline := clock_timestamp() + p_wait;
    -- This transaction's own id: the archive's writers that got theirs
    -- before it (age() > 0) are the ones to wait for.
    PERFORM pg_current_xact_id();
    WHILE EXISTS (SELECT 1 FROM pg_locks r
                  JOIN pg_locks t ON t.virtualtransaction = r.virtualtransaction
                                 AND t.locktype = 'transactionid' AND t.mode = 'ExclusiveLock' AND t.granted
                  WHERE r.locktype = 'relation' AND r.relation = '{{.schema}}.attempts'::regclass
                    AND r.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                    AND age(t.transactionid) > 0) LOOP
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
