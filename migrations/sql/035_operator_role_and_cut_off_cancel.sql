-- The operator's database role in the archive, and no cancel while the
-- rail may still act on a cut-off call, migration 035.
--
-- 1. cancel_pending (migrations 020, 022, 031) cancelled an instruction
--    whose rail call a relayer's stop had cut off (a RETRYABLE
--    CUT_OFF_AT_STOP attempt, outcome unknown), during the window in which
--    the relayer itself may not send it again because the rail may still
--    be acting on the cut-off call: the claim's lease. The cancel archived
--    "never sent" while the rail could still pay it. It now refuses such an
--    instruction until that window has ended (SQLSTATE OBCW1, the time in
--    the error's detail) and writes nothing.
--
--    The window is read from the archive, not from the pending row: the
--    cut-off attempt's next_attempt_at is the retry time its relayer set
--    (the lease's end, engine.cutOffDelay, or a later Retry-After), and it
--    never changes. The pending row's next_attempt_at does: with ordering
--    on a retry queued behind a replayed lower sequence waits at
--    'infinity' (refusing for ever) and is later made due at once (before
--    the lease's end), and a retry after a second claim no longer has the
--    cut-off attempt as its chain head. So every CUT_OFF_AT_STOP attempt of
--    the outbox id counts, whatever came after it (one index probe per
--    attached month, on attempts_outbox_idx). Other outcome-unknown codes
--    (RAIL_TIMEOUT, RAIL_TRANSPORT_ERROR, RAIL_UPSTREAM_ERROR,
--    UNKNOWN_RAIL_CODE) and a reaper's ZOMBIE_REQUEUE are not refused:
--    their call ended (a timed-out call ran the whole rail timeout the rail
--    is given; a reaped claim's lease had ended), so what remains is an
--    outcome nobody knows, which waiting does not settle: the pending
--    row's outcome_unknown mark and the trail say so, and docs/operations.md
--    says to reconcile with the rail.
--
-- 2. The operators' functions archived the free-text name the caller
--    passed ("cancelled by alice"), whatever database role ran them. Each
--    now also records session_user, the role that authenticated (SECURITY
--    DEFINER changes current_user, not session_user), in the archived
--    message, which the hash chain covers: "cancelled by alice (database
--    role ops_1): reason", "replayed by alice (database role ops_1; it had
--    failed with X): reason", "acknowledged by alice (database role ops_1):
--    reason". The role is quoted as an identifier when it is not a plain
--    one, and operator_check refuses an operator name containing
--    "(database role", so the first such text in a message is always the
--    function's. Pauses and resumes (migration 019), which are not in the
--    chained archive, record it in rail_pause_events.database_role (NULL
--    for the events before this migration; no default: a column default
--    would be evaluated once, now, for every earlier row).
--
-- Same functions otherwise: replay_dead_letter_any_tenant as migration
-- 032 left it, acknowledge_dead_letter_any_tenant and
-- cancel_pending_any_tenant as migration 031 left them, pause_rail and
-- resume_rail as migration 019 made them. CREATE OR REPLACE keeps owners
-- and grants; each function's standing (SECURITY DEFINER or not) is
-- restated as it was. The fronts of migration 022 are unchanged.

-- operator_check: also refuses a name that could pass for the role's text.
CREATE OR REPLACE FUNCTION {{.schema}}.operator_check(p_operator text, p_reason text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $fn$
BEGIN
  IF btrim(coalesce(p_operator, '')) = '' THEN
    RAISE EXCEPTION 'outbox: an operator action needs the operator''s name' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF btrim(coalesce(p_reason, '')) = '' THEN
    RAISE EXCEPTION 'outbox: an operator action needs a reason' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF position('(database role' IN lower(p_operator)) > 0 THEN
    RAISE EXCEPTION 'outbox: an operator''s name may not contain "(database role": the archive records the database role itself'
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
END $fn$;

ALTER TABLE {{.schema}}.rail_pause_events ADD COLUMN database_role text;

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
    RETURNING *, {{.schema}}.uuidv7() AS replay_id, clock_timestamp() AS archived_at,
              format('replayed by %s (database role %I; it had failed with %s): %s', p_operator, session_user, error_code, p_reason) AS message
  ), stamped AS (
    SELECT d.*, {{.schema}}.attempt_hash(d.chain_head, replay_id, outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type, tenant_id, correlation_id,
           payload, 0, 'REPLAYED', p_operator, NULL::uuid,
           now(), now(), now(), NULL::text, NULL::text, NULL::text,
           d.message, NULL::int, false, d.archived_at) AS hash FROM d
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
    INSERT INTO {{.schema}}.pending (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type, tenant_id, correlation_id, payload, attempt_count, next_attempt_at, created_at, zombie_attempt_id, chain_head, outcome_unknown)
    SELECT outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type, tenant_id, correlation_id, payload, 0,
           CASE WHEN (SELECT head FROM first) THEN now() ELSE 'infinity' END, created_at, NULL, hash, outcome_unknown
    FROM stamped
  ), archived AS (
    INSERT INTO {{.schema}}.attempts (attempt_id, outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type, tenant_id, correlation_id, payload, attempt_no, state, relayer_id, claim_attempt_id,
    claimed_at, completed_at, next_attempt_at, rail_reference, rail_code, error_code, error_message, latency_ms, late, created_at, prev_hash, hash)
    SELECT replay_id, outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type, tenant_id, correlation_id,
           payload, 0, 'REPLAYED', p_operator, NULL::uuid,
           now(), now(), now(), NULL::text, NULL::text, NULL::text,
           message, NULL::int, false, archived_at, chain_head, hash
    FROM stamped
  )
  SELECT count(*) INTO n FROM d;
  RETURN n;
END $fn$;

CREATE OR REPLACE FUNCTION {{.schema}}.acknowledge_dead_letter_any_tenant(p_outbox_id uuid, p_operator text, p_reason text) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  n bigint;
  message text := format('acknowledged by %s (database role %I): %s', p_operator, session_user, p_reason);
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
             d.error_code, message, NULL::int, false, d.archived_at) AS hash
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
           NULL::timestamptz, NULL::text, NULL::text, error_code, message,
           NULL::int, false, archived_at, chain_head, hash
    FROM stamped
  )
  SELECT count(*) INTO n FROM acked;
  RETURN n;
END $fn$;

-- cancel_pending_any_tenant runs as the owner only where the roles are in
-- place (migrations 020 and 031): its standing is taken before and given
-- back after. The refusal comes after the participant's lock and with the
-- pending row locked, so no claim or outcome moves the row between the
-- check and the delete; a refusal raises, so nothing is written.
DO $m$
DECLARE
  definer boolean := (SELECT prosecdef FROM pg_proc WHERE oid = '{{.schema}}.cancel_pending_any_tenant(uuid, text, text)'::regprocedure);
BEGIN
  CREATE OR REPLACE FUNCTION {{.schema}}.cancel_pending_any_tenant(p_outbox_id uuid, p_operator text, p_reason text) RETURNS bigint
  LANGUAGE plpgsql VOLATILE AS $fn$
  DECLARE
    n bigint;
    rail_until timestamptz;
  BEGIN
    PERFORM {{.schema}}.operator_check(p_operator, p_reason);
    PERFORM 1 FROM {{.schema}}.sequences s
    WHERE s.participant_id = (SELECT p.participant_id FROM {{.schema}}.pending p WHERE p.outbox_id = p_outbox_id)
    FOR UPDATE;
    -- The rail may still act on a call a stop cut off until the retry time
    -- its relayer recorded (the claim's lease end): no cancel before then.
    -- The archive's row, not the pending row's due time, which ordering
    -- moves (see the header).
    PERFORM 1 FROM {{.schema}}.pending p
    WHERE p.outbox_id = p_outbox_id AND {{.schema}}.tenant_in_scope(p.tenant_id)
    FOR UPDATE;
    IF FOUND THEN
      SELECT max(a.next_attempt_at) INTO rail_until FROM {{.schema}}.attempts a
      WHERE a.outbox_id = p_outbox_id AND a.state = 'RETRYABLE' AND a.error_code = 'CUT_OFF_AT_STOP' AND a.next_attempt_at > now();
      IF rail_until IS NOT NULL THEN
        RAISE EXCEPTION 'outbox: instruction % cannot be cancelled before %: its rail call was cut off by a relayer''s stop (CUT_OFF_AT_STOP, outcome unknown) and the rail may still be acting on it until its claim''s lease ends',
          p_outbox_id, to_char(rail_until AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
          USING ERRCODE = 'OBCW1',
                DETAIL = to_char(rail_until AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
                HINT = 'Try the cancel again after that time; reconcile with the rail before treating the instruction as never paid.';
      END IF;
    END IF;
    WITH d AS (
      DELETE FROM {{.schema}}.pending WHERE outbox_id = p_outbox_id AND {{.schema}}.tenant_in_scope(tenant_id)
      RETURNING *, {{.schema}}.uuidv7() AS cancel_id, clock_timestamp() AS archived_at,
                format('cancelled by %s (database role %I): %s', p_operator, session_user, p_reason) AS message
    ), stamped AS (
      SELECT d.*, {{.schema}}.attempt_hash(d.chain_head, cancel_id, outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type, tenant_id, correlation_id,
             payload, attempt_count + 1, 'CANCELLED', p_operator, NULL::uuid,
             now(), now(), NULL::timestamptz, NULL::text, NULL::text, NULL::text,
             d.message, NULL::int, false, d.archived_at) AS hash FROM d
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
             message, NULL::int, false, archived_at, chain_head, hash
      FROM stamped
    )
    SELECT count(*) INTO n FROM d;
    RETURN n;
  END $fn$;
  IF definer THEN
    ALTER FUNCTION {{.schema}}.cancel_pending_any_tenant(uuid, text, text) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
  END IF;
END $m$;

-- pause_rail and resume_rail run as the owner only where the roles are in
-- place (migration 019, roles.sql): their standing is taken before and
-- given back after, as cancel_pending_any_tenant's.
DO $m$
DECLARE
  pause_definer boolean := (SELECT prosecdef FROM pg_proc WHERE oid = '{{.schema}}.pause_rail(text, text, text)'::regprocedure);
  resume_definer boolean := (SELECT prosecdef FROM pg_proc WHERE oid = '{{.schema}}.resume_rail(text, text, text)'::regprocedure);
BEGIN
  CREATE OR REPLACE FUNCTION {{.schema}}.pause_rail(p_rail_type text, p_operator text, p_reason text) RETURNS boolean
  LANGUAGE plpgsql VOLATILE AS $fn$
  BEGIN
    PERFORM {{.schema}}.operator_check(p_operator, p_reason);
    IF btrim(coalesce(p_rail_type, '')) = '' THEN
      RAISE EXCEPTION 'outbox: a pause needs a rail type (or * for every rail)' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO {{.schema}}.rail_pauses (rail_type, paused_by, reason) VALUES (p_rail_type, p_operator, p_reason)
    ON CONFLICT (rail_type) DO NOTHING;
    IF NOT FOUND THEN
      RETURN false;
    END IF;
    INSERT INTO {{.schema}}.rail_pause_events (rail_type, action, operator, reason, database_role)
    VALUES (p_rail_type, 'PAUSED', p_operator, p_reason, session_user);
    RETURN true;
  END $fn$;

  CREATE OR REPLACE FUNCTION {{.schema}}.resume_rail(p_rail_type text, p_operator text, p_reason text) RETURNS boolean
  LANGUAGE plpgsql VOLATILE AS $fn$
  BEGIN
    PERFORM {{.schema}}.operator_check(p_operator, p_reason);
    DELETE FROM {{.schema}}.rail_pauses WHERE rail_type = p_rail_type;
    IF NOT FOUND THEN
      RETURN false;
    END IF;
    INSERT INTO {{.schema}}.rail_pause_events (rail_type, action, operator, reason, database_role)
    VALUES (p_rail_type, 'RESUMED', p_operator, p_reason, session_user);
    PERFORM pg_notify('outbox_pending', '');
    RETURN true;
  END $fn$;
  IF pause_definer THEN
    ALTER FUNCTION {{.schema}}.pause_rail(text, text, text) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
  END IF;
  IF resume_definer THEN
    ALTER FUNCTION {{.schema}}.resume_rail(text, text, text) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
  END IF;
END $m$;
