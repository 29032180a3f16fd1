-- A retry keeps its retry time behind a replay, migration 039.
--
-- With ordering on, a participant's rows other than its head wait with
-- next_attempt_at = 'infinity', and whatever makes one the head (the
-- hand-off of a terminal outcome, a cancel, a reap, a retry behind a
-- replay) made it due at once or claimed it. Two rows waited that way
-- with a retry time of their own, and lost it:
-- - the participant's head, waiting for its retry (a backoff, a rail's
--   Retry-After, or for a call a relayer's stop cut off the end of its
--   claim's lease, while the rail may still be acting on it), when an
--   operator replayed a dead letter of a lower sequence: the replay made
--   the replayed one the head and the retry wait at 'infinity';
-- - a retry recorded while such a replayed lower sequence was pending:
--   written at 'infinity'.
-- When the replayed instruction ended, the hand-off claimed the retry at
-- once and the relayer sent it, before its retry time (the rail's
-- idempotency key kept the payment single, but a rail that said "not
-- before" was called again at once, and a cut-off call was sent again
-- while the rail could still be acting on it).
--
-- pending.retry_at now keeps that time while the row waits: the replay's
-- demotion and a retry written behind a replay set it; every promotion
-- makes the row due at it (or now, if it has passed) and clears it; the
-- hand-off does not claim a row whose retry_at is still ahead, it makes
-- it due then. NULL on every other row (a nullable column without a
-- default: adding it rewrites nothing). The relayers' statements (record,
-- hand-off, reap, `outbox ordering`) are this build's; below are the
-- replay's and the cancel's, as migration 035 left them, with the
-- demotion and the promotion so changed. Pending rows already waiting
-- behind a replay get their time back from the archive: the retry time
-- their last attempt recorded (one index probe per month by outbox id per
-- waiting row that has been attempted).
--
-- settings.retry_times_kept_since is when this migration ran: `audit
-- verify` checks that no claim came before the retry time its
-- instruction's previous attempt recorded, for claims since then (an
-- earlier one may have been made by the hand-off above).

ALTER TABLE {{.schema}}.pending ADD COLUMN retry_at timestamptz;
COMMENT ON COLUMN {{.schema}}.pending.retry_at IS
  'With ordering on: the retry time of a row that waits (next_attempt_at = infinity) behind a replayed lower sequence; it is made due then, not before (migration 039).';

ALTER TABLE {{.schema}}.settings ADD COLUMN retry_times_kept_since timestamptz;
UPDATE {{.schema}}.settings SET retry_times_kept_since = now();

UPDATE {{.schema}}.pending p SET retry_at = r.next_attempt_at
FROM (
  SELECT q.outbox_id, (SELECT a.next_attempt_at FROM {{.schema}}.archive a
                       WHERE a.outbox_id = q.outbox_id AND NOT a.late AND a.state <> 'DISPATCHING'
                       ORDER BY a.created_at DESC LIMIT 1) AS next_attempt_at
  FROM {{.schema}}.pending q
  WHERE q.next_attempt_at = 'infinity' AND q.attempt_count > 0
) r
WHERE p.outbox_id = r.outbox_id AND r.next_attempt_at > now();

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
    UPDATE {{.schema}}.pending p SET next_attempt_at = 'infinity',
      retry_at = CASE WHEN p.next_attempt_at > now() THEN p.next_attempt_at END
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
      UPDATE {{.schema}}.pending p SET next_attempt_at = CASE WHEN p.retry_at > now() THEN p.retry_at ELSE now() END, retry_at = NULL
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
