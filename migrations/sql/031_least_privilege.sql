-- Least privilege, migration 031.
--
-- 1. Checkpoints only through take_checkpoint. Relayers appended
--    checkpoints with INSERT on the table, so one relayer credential could
--    append a checkpoint of a period that ends in the future (or of any
--    digest): every later take_checkpoint started from its end and found
--    nothing to close, and `audit verify` reported the archive as changed
--    once rows arrived in that period. take_checkpoint now closes no period
--    past its own clock, whatever end its caller passes, and where the
--    roles are in place it runs as the owner: whoever could insert
--    checkpoints may run it instead, and no longer insert.
CREATE OR REPLACE FUNCTION {{.schema}}.take_checkpoint(p_end timestamptz, p_wait interval DEFAULT '30 seconds',
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
END $$;

DO $$
DECLARE
  g regrole;
BEGIN
  IF (SELECT prosecdef FROM pg_proc WHERE oid = '{{.schema}}.ensure_attempt_partitions(int)'::regprocedure) THEN
    ALTER FUNCTION {{.schema}}.take_checkpoint(timestamptz, interval, interval) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
    REVOKE ALL ON FUNCTION {{.schema}}.take_checkpoint(timestamptz, interval, interval) FROM PUBLIC;
    FOR g IN SELECT DISTINCT a.grantee::regrole FROM pg_class c, aclexplode(c.relacl) a
             WHERE c.oid = '{{.schema}}.checkpoints'::regclass
               AND a.privilege_type = 'INSERT' AND a.grantee <> 0 AND a.grantee <> c.relowner LOOP
      EXECUTE format('GRANT EXECUTE ON FUNCTION {{.schema}}.take_checkpoint(timestamptz, interval, interval) TO %s', g);
      EXECUTE format('REVOKE INSERT ON {{.schema}}.checkpoints FROM %s', g);
    END LOOP;
  END IF;
END $$;

-- 2. Relayers update a participant's queued count, not its next sequence
--    id: UPDATE on every column of sequences let a relayer credential wind
--    a participant's counter back, and the next enqueues reused sequence
--    ids already archived (audit verify: gap-free sequences). Outcomes,
--    hand-offs, reaps and withdrawals write queued alone; FOR UPDATE needs
--    UPDATE on one column.
DO $$
DECLARE
  g regrole;
BEGIN
  FOR g IN SELECT DISTINCT a.grantee::regrole FROM pg_class c, aclexplode(c.relacl) a
           WHERE c.oid = '{{.schema}}.sequences'::regclass
             AND a.privilege_type = 'UPDATE' AND a.grantee <> 0 AND a.grantee <> c.relowner LOOP
    EXECUTE format('REVOKE UPDATE ON {{.schema}}.sequences FROM %s', g);
    EXECUTE format('GRANT UPDATE (queued) ON {{.schema}}.sequences TO %s', g);
  END LOOP;
END $$;

-- 3. Partition upkeep, which relayers run as the owner, creates at most 24
--    months ahead: a relayer credential had the owner create a partition
--    for every month of the next centuries in one call (thousands of
--    tables the archive's queries then plan over, only the owner can drop).
--    The relayers and reapers keep 3. Same function otherwise (migration
--    027); its standing is kept as there.
DO $m$
DECLARE
  definer boolean := (SELECT prosecdef FROM pg_proc WHERE oid = '{{.schema}}.ensure_attempt_partitions(int)'::regprocedure);
BEGIN
  CREATE OR REPLACE FUNCTION {{.schema}}.ensure_attempt_partitions(months_ahead int DEFAULT 3) RETURNS void
  LANGUAGE plpgsql AS $fn$
  DECLARE
    m date;
    name text;
  BEGIN
    -- Upkeep keeps a few months ahead; a caller may not have the owner
    -- create a table for every month of centuries.
    IF months_ahead > 24 THEN
      RAISE EXCEPTION 'outbox: archive partitions are kept at most 24 months ahead, not %', months_ahead
        USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOR i IN 0..months_ahead LOOP
      m := (date_trunc('month', now() AT TIME ZONE 'UTC') + make_interval(months => i))::date;
      name := 'attempts_' || to_char(m, 'YYYY_MM');
      IF to_regclass(format('%I.%I', '{{.schema}}', name)) IS NULL THEN
        BEGIN
          EXECUTE format('CREATE TABLE %I.%I PARTITION OF %I.attempts FOR VALUES FROM (%L) TO (%L)',
                         '{{.schema}}', name, '{{.schema}}',
                         (m::timestamp AT TIME ZONE 'UTC'), ((m + interval '1 month')::timestamp AT TIME ZONE 'UTC'));
          -- Row triggers are inherited from the parent; TRUNCATE triggers are
          -- not, so each partition gets its own.
          EXECUTE format('CREATE TRIGGER attempts_no_truncate BEFORE TRUNCATE ON %I.%I
                          FOR EACH STATEMENT EXECUTE FUNCTION %I.reject_attempt_change()', '{{.schema}}', name, '{{.schema}}');
          PERFORM {{.schema}}.seal_archive_partition(format('%I.%I', '{{.schema}}', name)::regclass);
        EXCEPTION WHEN check_violation THEN
          -- "updated partition constraint for default partition would be
          -- violated": rows of this month are in the default partition.
          RAISE WARNING 'outbox: cannot create partition %.%: the default partition holds rows of that month (%); move them out to create it',
            '{{.schema}}', name, SQLERRM;
        END;
      END IF;
    END LOOP;
  END $fn$;
  IF definer THEN
    ALTER FUNCTION {{.schema}}.ensure_attempt_partitions(int) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
  END IF;
END $m$;

-- 4. The operators' functions act within the caller's tenant in the
--    statement that acts. Migration 022's fronts check the instruction's
--    tenant in one statement and act through *_any_tenant in later ones,
--    each with a snapshot of its own (READ COMMITTED): an instruction that
--    was not there at the check (a missing tenant passed for the rows
--    without one) but committed before the act, a dead letter or pending
--    row of another tenant, was replayed, acknowledged or cancelled by an
--    operator scoped to the rows without a tenant
--    (migrations.TestOperatorsActWithinTheirTenantUnderRace). The statement
--    that deletes or locks the row now also requires tenant_in_scope of
--    the row it acts on: for the owner, superusers and other roles that
--    are not operators it is true, as before. Same statements otherwise
--    (migrations 008, 020 and 026); CREATE OR REPLACE keeps each
--    function's owner and grants. The fronts keep their early check.
CREATE OR REPLACE FUNCTION {{.schema}}.replay_dead_letter_any_tenant(p_outbox_id uuid, p_operator text, p_reason text) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  n bigint;
BEGIN
  PERFORM {{.schema}}.operator_check(p_operator, p_reason);
  PERFORM 1 FROM {{.schema}}.sequences s
  WHERE s.participant_id = (SELECT d.participant_id FROM {{.schema}}.dead_letters d WHERE d.outbox_id = p_outbox_id)
  FOR UPDATE;
  PERFORM 1 FROM {{.schema}}.pending q
  WHERE q.participant_id = (SELECT d.participant_id FROM {{.schema}}.dead_letters d WHERE d.outbox_id = p_outbox_id)
  ORDER BY q.sequence_id LIMIT 1
  FOR UPDATE;
  WITH d AS (
    DELETE FROM {{.schema}}.dead_letters WHERE outbox_id = p_outbox_id AND {{.schema}}.tenant_in_scope(tenant_id)
    RETURNING *, {{.schema}}.uuidv7() AS replay_id, clock_timestamp() AS archived_at
  ), stamped AS (
    SELECT d.*, {{.schema}}.attempt_hash(d.chain_head, replay_id, outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type, tenant_id, correlation_id,
           payload, 0, 'REPLAYED', p_operator, NULL::uuid,
           now(), now(), now(), NULL::text, NULL::text, NULL::text,
           format('replayed by %s (it had failed with %s): %s', p_operator, error_code, p_reason), NULL::int, false, d.archived_at) AS hash FROM d
  ), counted AS (
    UPDATE {{.schema}}.sequences s SET queued = s.queued + 1
    WHERE s.participant_id = (SELECT participant_id FROM d)
  ), first AS (
    SELECT NOT (SELECT ordered FROM {{.schema}}.settings) OR (
             NOT EXISTS (SELECT 1 FROM {{.schema}}.inflight i WHERE i.participant_id = d.participant_id AND i.ordered)
             AND NOT EXISTS (SELECT 1 FROM {{.schema}}.pending q WHERE q.participant_id = d.participant_id AND q.sequence_id < d.sequence_id)
           ) AS head
    FROM d
  ), demoted AS (
    UPDATE {{.schema}}.pending p SET next_attempt_at = 'infinity'
    WHERE (SELECT head FROM first) AND (SELECT ordered FROM {{.schema}}.settings)
      AND p.participant_id = (SELECT participant_id FROM d)
      AND p.sequence_id > (SELECT sequence_id FROM d)
      AND p.next_attempt_at <> 'infinity'
  ), requeued AS (
    INSERT INTO {{.schema}}.pending (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type, tenant_id, correlation_id, payload, attempt_count, next_attempt_at, created_at, zombie_attempt_id, chain_head)
    SELECT outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type, tenant_id, correlation_id, payload, 0,
           CASE WHEN (SELECT head FROM first) THEN now() ELSE 'infinity' END, created_at, NULL, hash
    FROM stamped
  ), archived AS (
    INSERT INTO {{.schema}}.attempts (attempt_id, outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type, tenant_id, correlation_id, payload, attempt_no, state, relayer_id, claim_attempt_id,
    claimed_at, completed_at, next_attempt_at, rail_reference, rail_code, error_code, error_message, latency_ms, late, created_at, prev_hash, hash)
    SELECT replay_id, outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type, tenant_id, correlation_id,
           payload, 0, 'REPLAYED', p_operator, NULL::uuid,
           now(), now(), now(), NULL::text, NULL::text, NULL::text,
           format('replayed by %s (it had failed with %s): %s', p_operator, error_code, p_reason), NULL::int, false, archived_at, chain_head, hash
    FROM stamped
  )
  SELECT count(*) INTO n FROM d;
  RETURN n;
END $fn$;


CREATE OR REPLACE FUNCTION {{.schema}}.acknowledge_dead_letter_any_tenant(p_outbox_id uuid, p_operator text, p_reason text) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  n bigint;
BEGIN
  PERFORM {{.schema}}.operator_check(p_operator, p_reason);
  WITH d AS (
    SELECT x.*, {{.schema}}.uuidv7() AS ack_id, clock_timestamp() AS archived_at
    FROM {{.schema}}.dead_letters x
    WHERE x.outbox_id = p_outbox_id AND x.acknowledged_at IS NULL AND {{.schema}}.tenant_in_scope(x.tenant_id)
    FOR UPDATE
  ), stamped AS (
    SELECT d.*, {{.schema}}.attempt_hash(d.chain_head, d.ack_id, d.outbox_id, d.instruction_id, d.participant_id,
             d.sequence_id, d.idempotency_key, d.rail_type, d.tenant_id, d.correlation_id, NULL::jsonb, d.attempt_count,
             'ACKNOWLEDGED', p_operator, NULL::uuid, now(), now(), NULL::timestamptz, NULL::text, NULL::text,
             d.error_code, format('acknowledged by %s: %s', p_operator, p_reason), NULL::int, false, d.archived_at) AS hash
    FROM d
  ), acked AS (
    UPDATE {{.schema}}.dead_letters x
    SET acknowledged_at = now(), acknowledged_by = p_operator, acknowledged_reason = p_reason, chain_head = s.hash
    FROM stamped s WHERE x.outbox_id = s.outbox_id
    RETURNING 1
  ), archived AS (
    INSERT INTO {{.schema}}.attempts (attempt_id, outbox_id, instruction_id, participant_id, sequence_id, idempotency_key,
                                      rail_type, tenant_id, correlation_id, payload, attempt_no, state, relayer_id,
                                      claim_attempt_id, claimed_at, completed_at, next_attempt_at, rail_reference, rail_code,
                                      error_code, error_message, latency_ms, late, created_at, prev_hash, hash)
    SELECT ack_id, outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type, tenant_id,
           correlation_id, NULL::jsonb, attempt_count, 'ACKNOWLEDGED', p_operator, NULL::uuid, now(), now(),
           NULL::timestamptz, NULL::text, NULL::text, error_code, format('acknowledged by %s: %s', p_operator, p_reason),
           NULL::int, false, archived_at, chain_head, hash
    FROM stamped
  )
  SELECT count(*) INTO n FROM acked;
  RETURN n;
END $fn$;


-- cancel_pending_any_tenant runs as the owner only where the roles are in
-- place (migration 020): CREATE OR REPLACE would make it SECURITY INVOKER,
-- so its standing is taken before and given back after.
DO $m$
DECLARE
  definer boolean := (SELECT prosecdef FROM pg_proc WHERE oid = '{{.schema}}.cancel_pending_any_tenant(uuid, text, text)'::regprocedure);
BEGIN
  CREATE OR REPLACE FUNCTION {{.schema}}.cancel_pending_any_tenant(p_outbox_id uuid, p_operator text, p_reason text) RETURNS bigint
  LANGUAGE plpgsql VOLATILE AS $fn$
  DECLARE
    n bigint;
  BEGIN
    PERFORM {{.schema}}.operator_check(p_operator, p_reason);
    PERFORM 1 FROM {{.schema}}.sequences s
    WHERE s.participant_id = (SELECT p.participant_id FROM {{.schema}}.pending p WHERE p.outbox_id = p_outbox_id)
    FOR UPDATE;
    WITH d AS (
      DELETE FROM {{.schema}}.pending WHERE outbox_id = p_outbox_id AND {{.schema}}.tenant_in_scope(tenant_id)
      RETURNING *, {{.schema}}.uuidv7() AS cancel_id, clock_timestamp() AS archived_at
    ), stamped AS (
      SELECT d.*, {{.schema}}.attempt_hash(d.chain_head, cancel_id, outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type, tenant_id, correlation_id,
             payload, attempt_count + 1, 'CANCELLED', p_operator, NULL::uuid,
             now(), now(), NULL::timestamptz, NULL::text, NULL::text, NULL::text,
             format('cancelled by %s: %s', p_operator, p_reason), NULL::int, false, d.archived_at) AS hash FROM d
    ), counted AS (
      UPDATE {{.schema}}.sequences s SET queued = s.queued - 1
      WHERE s.participant_id = (SELECT participant_id FROM d) AND (SELECT ordered FROM {{.schema}}.settings)
    ), promoted AS (
      UPDATE {{.schema}}.pending p SET next_attempt_at = now()
      WHERE (SELECT ordered FROM {{.schema}}.settings)
        AND p.participant_id = (SELECT participant_id FROM d)
        AND p.outbox_id <> p_outbox_id
        AND p.next_attempt_at = 'infinity'
        AND p.sequence_id = (SELECT min(q.sequence_id) FROM {{.schema}}.pending q
                             WHERE q.participant_id = (SELECT participant_id FROM d) AND q.outbox_id <> p_outbox_id)
        AND NOT EXISTS (SELECT 1 FROM {{.schema}}.pending q
                        WHERE q.participant_id = (SELECT participant_id FROM d) AND q.sequence_id < (SELECT sequence_id FROM d))
        AND NOT EXISTS (SELECT 1 FROM {{.schema}}.inflight i
                        WHERE i.participant_id = (SELECT participant_id FROM d) AND i.ordered)
    ), archived AS (
      INSERT INTO {{.schema}}.attempts (attempt_id, outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type, tenant_id, correlation_id, payload, attempt_no, state, relayer_id, claim_attempt_id,
      claimed_at, completed_at, next_attempt_at, rail_reference, rail_code, error_code, error_message, latency_ms, late, created_at, prev_hash, hash)
      SELECT cancel_id, outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type, tenant_id, correlation_id,
             payload, attempt_count + 1, 'CANCELLED', p_operator, NULL::uuid,
             now(), now(), NULL::timestamptz, NULL::text, NULL::text, NULL::text,
             format('cancelled by %s: %s', p_operator, p_reason), NULL::int, false, archived_at, chain_head, hash
      FROM stamped
    )
    SELECT count(*) INTO n FROM d;
    RETURN n;
  END $fn$;
  IF definer THEN
    ALTER FUNCTION {{.schema}}.cancel_pending_any_tenant(uuid, text, text) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
  END IF;
END $m$;
