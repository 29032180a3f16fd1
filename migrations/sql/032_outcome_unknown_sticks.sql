-- A dead letter's outcome_unknown (migration 009) said only whether its
-- LAST attempt may have reached the rail. An instruction whose first
-- attempt timed out (the rail may have paid) and whose last was refused
-- before sending was a dead letter "not outcome unknown", which operators
-- replay or refund as one the rail certainly did not act on.
--
-- outcome_unknown on pending and inflight carries the mark from attempt to
-- attempt, as zombie_count does: on a pending row, an attempt before this
-- copy's was outcome unknown; a copy the reaper requeued (zombie_attempt_id
-- set) is marked at its claim instead, because a late FAILED of the
-- abandoned claim that withdraws the copy settles that claim (its dead
-- letter takes the earlier attempts' mark only). On an in-flight row: an
-- attempt before this claim was. Dead letters OR it with their last
-- outcome's; a replay puts the dead letter's mark back on pending.
-- Constant defaults: no table rewrite.
ALTER TABLE {{.schema}}.pending ADD COLUMN outcome_unknown boolean NOT NULL DEFAULT false;
ALTER TABLE {{.schema}}.inflight ADD COLUMN outcome_unknown boolean NOT NULL DEFAULT false;

-- What is already there is marked from the archive's attached months: an
-- attempt the rail may have acted on (its error codes are the relayer's
-- outcomeUnknown set and the reaper's). One index probe per row that has
-- a history (chain_head: a first enqueue has none); pending and inflight
-- stay locked by the ALTERs above until it commits.
UPDATE {{.schema}}.dead_letters d SET outcome_unknown = true
WHERE NOT d.outcome_unknown AND EXISTS (
  SELECT 1 FROM {{.schema}}.attempts a
  WHERE a.outbox_id = d.outbox_id
    AND a.error_code IN ('RAIL_TIMEOUT', 'RAIL_TRANSPORT_ERROR', 'RAIL_UPSTREAM_ERROR', 'UNKNOWN_RAIL_CODE', 'ZOMBIE_REQUEUE', 'ZOMBIE_LIMIT'));
UPDATE {{.schema}}.inflight f SET outcome_unknown = true
WHERE EXISTS (
  SELECT 1 FROM {{.schema}}.attempts a
  WHERE a.outbox_id = f.outbox_id
    AND a.error_code IN ('RAIL_TIMEOUT', 'RAIL_TRANSPORT_ERROR', 'RAIL_UPSTREAM_ERROR', 'UNKNOWN_RAIL_CODE', 'ZOMBIE_REQUEUE', 'ZOMBIE_LIMIT'));
-- The requeue of a copy's own abandoned claim is not counted here: its
-- claim marks it (above).
UPDATE {{.schema}}.pending p SET outcome_unknown = true
WHERE p.chain_head IS NOT NULL AND EXISTS (
  SELECT 1 FROM {{.schema}}.attempts a
  WHERE a.outbox_id = p.outbox_id
    AND a.error_code IN ('RAIL_TIMEOUT', 'RAIL_TRANSPORT_ERROR', 'RAIL_UPSTREAM_ERROR', 'UNKNOWN_RAIL_CODE', 'ZOMBIE_REQUEUE', 'ZOMBIE_LIMIT')
    AND (p.zombie_attempt_id IS NULL OR a.claim_attempt_id IS DISTINCT FROM p.zombie_attempt_id));

-- replay_dead_letter_any_tenant (migration 031's, with the operator's
-- tenant applied to the row it deletes) puts the dead letter's mark back
-- on the replayed row: its replay's attempts are more attempts of one
-- instruction. Same statements otherwise; CREATE OR REPLACE keeps
-- the function's owner, settings and grants.
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
           format('replayed by %s (it had failed with %s): %s', p_operator, error_code, p_reason), NULL::int, false, archived_at, chain_head, hash
    FROM stamped
  )
  SELECT count(*) INTO n FROM d;
  RETURN n;
END $fn$;
