-- An operator's cancel and replay lock the participant found through the
-- instruction's key, migration 044.
--
-- cancel_pending_any_tenant (latest: 039) and replay_dead_letter_any_tenant
-- (latest: 039) took their participant's lock in a first statement that
-- read the instruction's participant from the table the action expects it
-- in (pending for a cancel, dead_letters for a replay), and then acted in
-- later statements, each with a snapshot of its own (READ COMMITTED). An
-- instruction that was elsewhere at the first statement's snapshot (in
-- flight, or about to become a dead letter) gave no participant, so no
-- lock was taken, and an outcome write that committed before the next
-- statement (a retry or a release back to pending, a failure into the dead
-- letters, the reaper's requeue, a replay) left the action to find it
-- there and act without the lock: deciding heads and queued counts beside
-- producers, outcome writes and other operators that hold it (a
-- participant's next instruction left waiting with no head, or a deadlock
-- with a replay that holds the lock and wants the cancelled row). The
-- window had no wait in it, so nothing a test can hold open; a cancel or
-- replay racing an outcome write of its own instruction instead answered
-- "not pending" / "not a dead letter" without waiting for the write that
-- held the participant's lock.
--
-- Both now read the participant from idempotency_keys, by outbox id (a
-- unique index; the row never moves while the instruction lives), lock it,
-- and only then read where the instruction is: every move of an
-- instruction into pending or the dead letters holds that lock (outcome
-- writes, the reaper, replays; with ordering on), so what the action reads
-- after the lock stays true until it commits, except a claim (pending to
-- in flight), which the cancel's row lock waits for as before.
--
-- A cancel of an instruction in flight now answers -1, not 0: a build
-- that knows it (store.ErrCancelInFlight) says the rail call may be under way
-- and nothing was done; an older build reads anything but 1 as "not
-- pending", as before. The front cancel_pending (migration 022) reads the
-- instruction's tenant from its key too, so that an operator scoped to
-- the instruction's tenant hears the same about one in flight (it read
-- pending, where one in flight is not, and answered 0).
--
-- Same statements otherwise: the cut-off refusal of migration 035, the
-- retry_at demotion and promotion of 039, the database role in the
-- archived message (035), the tenant checks (022). CREATE OR REPLACE keeps
-- owners and grants; each function's standing (SECURITY DEFINER or not)
-- is taken before and given back after, as migrations 035 and 039 do.

CREATE OR REPLACE FUNCTION {{.schema}}.replay_dead_letter_any_tenant(p_outbox_id uuid, p_operator text, p_reason text) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  n bigint;
  participant text;
BEGIN
  PERFORM {{.schema}}.operator_check(p_operator, p_reason);
  SELECT k.participant_id INTO participant FROM {{.schema}}.idempotency_keys k WHERE k.outbox_id = p_outbox_id;
  IF participant IS NULL THEN
    -- A row inserted without an enqueue has no key: read where it is.
    participant := (SELECT d.participant_id FROM {{.schema}}.dead_letters d WHERE d.outbox_id = p_outbox_id);
  END IF;
  PERFORM 1 FROM {{.schema}}.sequences s WHERE s.participant_id = participant FOR UPDATE;
  PERFORM 1 FROM {{.schema}}.pending q
  WHERE q.participant_id = participant
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

DO $m$
DECLARE
  definer boolean := (SELECT prosecdef FROM pg_proc WHERE oid = '{{.schema}}.cancel_pending_any_tenant(uuid, text, text)'::regprocedure);
  front_definer boolean := (SELECT prosecdef FROM pg_proc WHERE oid = '{{.schema}}.cancel_pending(uuid, text, text)'::regprocedure);
BEGIN
  CREATE OR REPLACE FUNCTION {{.schema}}.cancel_pending_any_tenant(p_outbox_id uuid, p_operator text, p_reason text) RETURNS bigint
  LANGUAGE plpgsql VOLATILE AS $fn$
  DECLARE
    n bigint;
    rail_until timestamptz;
    participant text;
  BEGIN
    PERFORM {{.schema}}.operator_check(p_operator, p_reason);
    SELECT k.participant_id INTO participant FROM {{.schema}}.idempotency_keys k WHERE k.outbox_id = p_outbox_id;
    IF participant IS NULL THEN
      -- A row inserted without an enqueue has no key: read where it is.
      participant := coalesce((SELECT p.participant_id FROM {{.schema}}.pending p WHERE p.outbox_id = p_outbox_id),
                              (SELECT i.participant_id FROM {{.schema}}.inflight i WHERE i.outbox_id = p_outbox_id));
    END IF;
    PERFORM 1 FROM {{.schema}}.sequences s WHERE s.participant_id = participant FOR UPDATE;
    -- Under the lock only a claim moves the row (pending to in flight):
    -- FOR UPDATE waits for a claim that holds it, then skips it if the
    -- claim took it.
    PERFORM 1 FROM {{.schema}}.pending p
    WHERE p.outbox_id = p_outbox_id AND {{.schema}}.tenant_in_scope(p.tenant_id)
    FOR UPDATE;
    IF NOT FOUND THEN
      -- In flight: its rail call may be under way, and it is not the
      -- operator's to withdraw (-1: nothing done). Anything else: 0.
      IF EXISTS (SELECT 1 FROM {{.schema}}.inflight i
                 WHERE i.outbox_id = p_outbox_id AND {{.schema}}.tenant_in_scope(i.tenant_id)) THEN
        RETURN -1;
      END IF;
      RETURN 0;
    END IF;
    -- The rail may still act on a call a stop cut off until the retry time
    -- its relayer recorded (the claim's lease end): no cancel before then
    -- (migration 035).
    SELECT max(a.next_attempt_at) INTO rail_until FROM {{.schema}}.attempts a
    WHERE a.outbox_id = p_outbox_id AND a.state = 'RETRYABLE' AND a.error_code = 'CUT_OFF_AT_STOP' AND a.next_attempt_at > now();
    IF rail_until IS NOT NULL THEN
      RAISE EXCEPTION 'outbox: instruction % cannot be cancelled before %: its rail call was cut off by a relayer''s stop (CUT_OFF_AT_STOP, outcome unknown) and the rail may still be acting on it until its claim''s lease ends',
        p_outbox_id, to_char(rail_until AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
        USING ERRCODE = 'OBCW1',
              DETAIL = to_char(rail_until AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
              HINT = 'Try the cancel again after that time; reconcile with the rail before treating the instruction as never paid.';
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

  -- The front (migration 022): the tenant from the instruction's key,
  -- which is there wherever the instruction is (pending, in flight).
  CREATE OR REPLACE FUNCTION {{.schema}}.cancel_pending(p_outbox_id uuid, p_operator text, p_reason text) RETURNS bigint
  LANGUAGE plpgsql VOLATILE AS $fn$
  BEGIN
    PERFORM {{.schema}}.operator_check(p_operator, p_reason);
    IF NOT {{.schema}}.tenant_in_scope(coalesce(
         (SELECT k.tenant_id FROM {{.schema}}.idempotency_keys k WHERE k.outbox_id = p_outbox_id),
         (SELECT p.tenant_id FROM {{.schema}}.pending p WHERE p.outbox_id = p_outbox_id))) THEN
      RETURN 0;
    END IF;
    RETURN {{.schema}}.cancel_pending_any_tenant(p_outbox_id, p_operator, p_reason);
  END $fn$;

  IF definer THEN
    ALTER FUNCTION {{.schema}}.cancel_pending_any_tenant(uuid, text, text) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
  END IF;
  IF front_definer THEN
    ALTER FUNCTION {{.schema}}.cancel_pending(uuid, text, text) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
  END IF;
END $m$;
