-- Tamper evidence for the archive (docs/audit.md has the threat model).
--
-- 1. A hash chain per instruction. Every archive row carries
--    hash = sha256(prev_hash || canonical encoding of the row), where
--    prev_hash is the hash of the row it follows (NULL for the
--    instruction's first row). The writer takes prev_hash from the hot row
--    it moves (pending, inflight or dead_letters carry chain_head, the hash
--    of the instruction's last archive row), so recording never reads the
--    archive. A changed row no longer matches its hash; a deleted row
--    leaves the row after it pointing at nothing, or a hot row whose head
--    is missing.
-- 2. Checkpoints. Every interval a checkpoint digests the hashes of all
--    archive rows created in its period, and is itself chained to the
--    checkpoint before it. Deleting a whole instruction, or dropping a
--    partition, changes the digest of the periods it covered.
--
-- The owner can recompute all of it; an auditor who keeps an exported copy
-- of the checkpoints elsewhere detects even that (outbox audit verify
-- --checkpoints FILE).

ALTER TABLE {{.schema}}.attempts ADD COLUMN prev_hash bytea, ADD COLUMN hash bytea;
ALTER TABLE {{.schema}}.pending ADD COLUMN chain_head bytea;
ALTER TABLE {{.schema}}.inflight ADD COLUMN chain_head bytea;
ALTER TABLE {{.schema}}.dead_letters ADD COLUMN chain_head bytea;

-- Rows archived before this migration carry no hash; from chained_since on
-- every row must.
ALTER TABLE {{.schema}}.settings ADD COLUMN chained_since timestamptz;
UPDATE {{.schema}}.settings SET chained_since = clock_timestamp();
ALTER TABLE {{.schema}}.settings ALTER COLUMN chained_since SET NOT NULL;

-- attempt_hash is an archive row's hash. The canonical encoding is the
-- binary form of a row of the columns in a fixed order (record_send: each
-- column's type, length and binary value; timestamps as microseconds,
-- independent of the session's time zone and date style; text as UTF-8,
-- the client encoding every outbox process uses). `outbox audit verify`
-- rebuilds it from the stored columns with PostgreSQL's built-ins and
-- hashes it itself. Change it only together with the version tag and the
-- verifier. (A JSON encoding, jsonb_build_array, cost three times as much
-- per row: a sixth of the drain's throughput.)
CREATE FUNCTION {{.schema}}.attempt_hash(
  prev bytea, attempt_id uuid, outbox_id uuid, instruction_id text, participant_id text, sequence_id bigint,
  idempotency_key text, rail_type text, tenant_id text, correlation_id text, payload jsonb, attempt_no int,
  state text, relayer_id text, claim_attempt_id uuid, claimed_at timestamptz, completed_at timestamptz,
  next_attempt_at timestamptz, rail_reference text, rail_code text, error_code text, error_message text,
  latency_ms int, late boolean, created_at timestamptz) RETURNS bytea
LANGUAGE sql STABLE PARALLEL SAFE AS $$
  SELECT sha256(coalesce(prev, '\x'::bytea) || record_send(ROW(
    'outbox.attempts/1'::text, attempt_id, outbox_id, instruction_id, participant_id, sequence_id, idempotency_key,
    rail_type, tenant_id, correlation_id, payload, attempt_no, state, relayer_id, claim_attempt_id,
    claimed_at, completed_at, next_attempt_at, rail_reference, rail_code, error_code, error_message, latency_ms,
    late, created_at)))
$$;

-- Checkpoints: append-only, contiguous periods, each chained to the one
-- before it. A period never spans two months, so each checkpoint covers
-- rows of one partition.
CREATE TABLE {{.schema}}.checkpoints (
  period_start timestamptz PRIMARY KEY,
  period_end   timestamptz NOT NULL CHECK (period_end > period_start),
  row_count    bigint NOT NULL,
  digest       bytea NOT NULL, -- sha256 of the rows' hashes in (created_at, attempt_id) order
  prev_hash    bytea,          -- the previous checkpoint's hash
  hash         bytea NOT NULL,
  created_at   timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE FUNCTION {{.schema}}.reject_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'outbox % is append-only: % is not allowed', TG_TABLE_NAME, TG_OP
    USING ERRCODE = 'insufficient_privilege';
END $$;
CREATE TRIGGER checkpoints_append_only
  BEFORE UPDATE OR DELETE ON {{.schema}}.checkpoints
  FOR EACH ROW EXECUTE FUNCTION {{.schema}}.reject_change();
CREATE TRIGGER checkpoints_no_truncate
  BEFORE TRUNCATE ON {{.schema}}.checkpoints
  FOR EACH STATEMENT EXECUTE FUNCTION {{.schema}}.reject_change();

-- Checkpoints read the archive by time. A BRIN index costs next to nothing
-- per insert and fits an append-only table whose rows arrive in time order.
CREATE INDEX attempts_created_brin ON {{.schema}}.attempts USING brin (created_at);

-- checkpoint_hash is a checkpoint's hash, chained to the previous one.
CREATE FUNCTION {{.schema}}.checkpoint_hash(prev bytea, period_start timestamptz, period_end timestamptz,
                                            row_count bigint, digest bytea) RETURNS bytea
LANGUAGE sql STABLE PARALLEL SAFE AS $$
  SELECT sha256(coalesce(prev, '\x'::bytea) || record_send(ROW(
    'outbox.checkpoints/1'::text, period_start, period_end, row_count, digest)))
$$;

-- take_checkpoint appends the next checkpoint: from the end of the last one
-- (or chained_since) to p_end, cut at the end of that month. Rows are
-- stamped with the clock before their transaction commits, so it first
-- waits (up to p_wait) for every transaction that was running when it
-- started; the caller passes a p_end some seconds in the past for the
-- instants in which a row is stamped before its transaction has an id.
-- Run in READ COMMITTED (each statement sees what committed before it).
-- A period shorter than p_min_period is left to grow (unless it ends a
-- month), so that relayers that each checkpoint every minute do not
-- multiply the checkpoints. Concurrent callers serialize; it returns the
-- new checkpoint, or nothing when there is no period to close yet.
CREATE FUNCTION {{.schema}}.take_checkpoint(p_end timestamptz, p_wait interval DEFAULT '30 seconds',
                                            p_min_period interval DEFAULT '0')
RETURNS SETOF {{.schema}}.checkpoints
LANGUAGE plpgsql AS $$
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
  PERFORM pg_advisory_xact_lock(hashtext('outbox.checkpoint:{{.schema}}'));
  SELECT c.period_end, c.hash INTO last_end, last_hash
  FROM {{.schema}}.checkpoints c ORDER BY c.period_start DESC LIMIT 1;
  s := coalesce(last_end, (SELECT chained_since FROM {{.schema}}.settings));
  month_end := (date_trunc('month', s AT TIME ZONE 'UTC') + interval '1 month') AT TIME ZONE 'UTC';
  e := least(p_end, month_end);
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
END $$;
