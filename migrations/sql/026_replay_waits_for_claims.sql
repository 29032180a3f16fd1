-- replay_dead_letter_any_tenant (migration 017; renamed by 022) decides
-- whether the replayed instruction is its participant's head in a
-- statement after taking the participant's lock. Claims take no such lock:
-- a claim of the participant's head that had not committed by then was
-- invisible to that statement, which made the replayed instruction due
-- beside the one in flight; every claim that reached it then failed on
-- inflight_ordered_participant_idx, whatever else it would have taken.
--
-- The replay now first locks the participant's lowest pending row, the
-- only one a claim can take (only heads are due). FOR UPDATE waits for a
-- claim that holds it and then skips it if the claim took it; a claim
-- that comes after skips it (claims lock with SKIP LOCKED) and, once the
-- replay commits, finds it waiting. The statement that decides comes
-- after, with a snapshot of its own (READ COMMITTED: each statement of a
-- VOLATILE function takes one), so it sees the claim's instruction in
-- flight. Same statements otherwise; CREATE OR REPLACE keeps the
-- function's owner, settings and grants.
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
    DELETE FROM {{.schema}}.dead_letters WHERE outbox_id = p_outbox_id
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
