-- Operators cancel a pending instruction: it is never sent. A payment
-- recalled before it leaves (a fraud hold, a customer's cancellation before
-- the cut-off, a duplicate the upstream sent under two keys), or one the
-- rail already made that the outbox would send again (after a restore to an
-- earlier point, or a payment made by hand during an outage). Terminal: the
-- instruction's key stays, so enqueueing it again answers with its receipt.

-- NOT VALID, as in migration 008: the rows already archived met the
-- narrower check.
ALTER TABLE {{.schema}}.attempts DROP CONSTRAINT attempts_state_check;
ALTER TABLE {{.schema}}.attempts ADD CONSTRAINT attempts_state_check
  CHECK (state IN ('DISPATCHING','DISPATCHED','RETRYABLE','FAILED','ZOMBIE_REQUEUE','REPLAYED','ACKNOWLEDGED','CANCELLED')) NOT VALID;

-- cancel_pending removes a pending instruction (due, waiting for a retry,
-- or queued behind its participant's earlier ones; not one in flight: its
-- rail call may be under way) and archives a CANCELLED row naming who and
-- why, in the instruction's hash chain (attempt_no: the attempt it was
-- waiting for). Two statements, as replay_dead_letter: the first locks the
-- participant's sequences row (producers, outcomes and hand-offs of the
-- participant wait), the second, with a snapshot taken after that lock,
-- deletes the row (waiting for a claim that holds it, and then finding it
-- gone), counts it out of queued and, with ordering on, makes the next
-- instruction of the participant due if the cancelled one was its head
-- and nothing of it is in flight. It returns 1 if the instruction was
-- pending, else 0.
CREATE FUNCTION {{.schema}}.cancel_pending(p_outbox_id uuid, p_operator text, p_reason text) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
  n bigint;
BEGIN
  PERFORM {{.schema}}.operator_check(p_operator, p_reason);
  PERFORM 1 FROM {{.schema}}.sequences s
  WHERE s.participant_id = (SELECT p.participant_id FROM {{.schema}}.pending p WHERE p.outbox_id = p_outbox_id)
  FOR UPDATE;
  WITH d AS (
    DELETE FROM {{.schema}}.pending WHERE outbox_id = p_outbox_id
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

-- Where the roles are in place: it runs as the owner, for the roles that
-- may replay dead letters (operators). roles.sql says the same for fresh
-- installs.
DO $$
DECLARE
  g regrole;
BEGIN
  IF (SELECT prosecdef FROM pg_proc WHERE oid = '{{.schema}}.ensure_attempt_partitions(int)'::regprocedure) THEN
    ALTER FUNCTION {{.schema}}.cancel_pending(uuid, text, text) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
    REVOKE ALL ON FUNCTION {{.schema}}.cancel_pending(uuid, text, text) FROM PUBLIC;
    FOR g IN SELECT a.grantee::regrole FROM pg_proc p, aclexplode(p.proacl) a
             WHERE p.oid = '{{.schema}}.replay_dead_letter(uuid, text, text)'::regprocedure
               AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner LOOP
      EXECUTE format('GRANT EXECUTE ON FUNCTION {{.schema}}.cancel_pending(uuid, text, text) TO %s', g);
    END LOOP;
  END IF;
END $$;
