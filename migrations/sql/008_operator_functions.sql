-- The operator's transitions as functions. An operator role
-- (outbox migrate --create-roles) may run these and nothing else that
-- writes: it cannot insert a pending row, delete a dead letter or write the
-- archive directly, yet a replay still does all of that, atomically, and
-- archives who did it. SECURITY DEFINER: they run as the schema's owner,
-- with a search path that cannot be redirected (every name is qualified).

-- Both take who acts and why; both refuse an empty answer to either
-- (SQLSTATE 22023), and both write the answer into the instruction's
-- archive trail, in its hash chain.

-- NOT VALID: the rows already archived met the narrower check, and
-- validating them would hold the archive's lock for a scan of every month.
ALTER TABLE {{.schema}}.attempts DROP CONSTRAINT attempts_state_check;
ALTER TABLE {{.schema}}.attempts ADD CONSTRAINT attempts_state_check
  CHECK (state IN ('DISPATCHING','DISPATCHED','RETRYABLE','FAILED','ZOMBIE_REQUEUE','REPLAYED','ACKNOWLEDGED')) NOT VALID;
ALTER TABLE {{.schema}}.dead_letters ADD COLUMN acknowledged_reason text;

-- operator_check refuses an operator action without a who or a why.
CREATE FUNCTION {{.schema}}.operator_check(p_operator text, p_reason text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $fn$
BEGIN
  IF btrim(coalesce(p_operator, '')) = '' THEN
    RAISE EXCEPTION 'outbox: an operator action needs the operator''s name' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF btrim(coalesce(p_reason, '')) = '' THEN
    RAISE EXCEPTION 'outbox: an operator action needs a reason' USING ERRCODE = 'invalid_parameter_value';
  END IF;
END $fn$;

-- replay_dead_letter sends a dead letter back to pending with the same
-- outbox and sequence id and a fresh retry budget, and archives a REPLAYED
-- row (relayer_id: the operator; error_message: why). Two statements: the
-- first locks the participant's sequences row (producers and outcomes of
-- the participant wait), the second, with a snapshot taken after that
-- lock, counts the instruction back into queued and, with ordering on,
-- makes it its participant's head when nothing of the participant is in
-- flight and no lower sequence is pending (the head it replaces waits
-- again). It returns 1 if the dead letter existed, else 0.
CREATE FUNCTION {{.schema}}.replay_dead_letter(p_outbox_id uuid, p_operator text, p_reason text) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  n bigint;
BEGIN
  PERFORM {{.schema}}.operator_check(p_operator, p_reason);
  PERFORM 1 FROM {{.schema}}.sequences s JOIN {{.schema}}.dead_letters d USING (participant_id)
  WHERE d.outbox_id = p_outbox_id
  FOR UPDATE OF s;
  WITH d AS (
    DELETE FROM {{.schema}}.dead_letters WHERE outbox_id = p_outbox_id
    RETURNING *, {{.schema}}.uuidv7() AS replay_id, clock_timestamp() AS archived_at
  ), stamped AS (
    SELECT d.*, {{.schema}}.attempt_hash(d.chain_head, replay_id, outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type, tenant_id, correlation_id,
           payload, 0, 'REPLAYED', p_operator, NULL::uuid,
           now(), now(), now(), NULL::text, NULL::text, NULL::text,
           format('replayed by %s (it had failed with %s): %s', p_operator, error_code, p_reason), NULL::int, false, d.archived_at) AS hash FROM d
  ), counted AS (
    UPDATE {{.schema}}.sequences s SET queued = s.queued + 1 FROM d WHERE s.participant_id = d.participant_id
  ), first AS (
    SELECT NOT (SELECT ordered FROM {{.schema}}.settings) OR (
             NOT EXISTS (SELECT 1 FROM {{.schema}}.inflight i WHERE i.participant_id = d.participant_id AND i.ordered)
             AND NOT EXISTS (SELECT 1 FROM {{.schema}}.pending q WHERE q.participant_id = d.participant_id AND q.sequence_id < d.sequence_id)
           ) AS head
    FROM d
  ), demoted AS (
    UPDATE {{.schema}}.pending p SET next_attempt_at = 'infinity'
    FROM d, first
    WHERE first.head AND (SELECT ordered FROM {{.schema}}.settings) AND p.participant_id = d.participant_id
      AND p.sequence_id > d.sequence_id AND p.next_attempt_at <> 'infinity'
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

-- acknowledge_dead_letter marks a dead letter as handled (it stays as the
-- instruction's final place) and archives an ACKNOWLEDGED row saying who
-- and why. It returns 1 if an unacknowledged dead letter existed, else 0.
CREATE FUNCTION {{.schema}}.acknowledge_dead_letter(p_outbox_id uuid, p_operator text, p_reason text) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  n bigint;
BEGIN
  PERFORM {{.schema}}.operator_check(p_operator, p_reason);
  WITH d AS (
    SELECT x.*, {{.schema}}.uuidv7() AS ack_id, clock_timestamp() AS archived_at
    FROM {{.schema}}.dead_letters x
    WHERE x.outbox_id = p_outbox_id AND x.acknowledged_at IS NULL
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

REVOKE ALL ON FUNCTION {{.schema}}.replay_dead_letter(uuid, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION {{.schema}}.acknowledge_dead_letter(uuid, text, text) FROM PUBLIC;
