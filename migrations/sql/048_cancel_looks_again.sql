-- A cancel looks again at an instruction that came back to pending while it
-- looked, migration 048.
--
-- cancel_pending_any_tenant (latest: 044) looks for the instruction in
-- pending (FOR UPDATE) and, not finding it there, in flight, in a later
-- statement with a snapshot of its own (READ COMMITTED). With ordering on
-- the participant's lock, which the cancel takes first, keeps everything
-- but a claim from moving it meanwhile (outcome writes and the reaper take
-- that lock too). With ordering off they do not: a retry (a RETRYABLE
-- outcome) or the reaper's requeue that put the instruction back in
-- pending and committed between the two looks left the cancel finding it
-- in neither, and it answered 0 ("not pending": already settled, or
-- unknown) for an instruction that was pending and would be sent at its
-- retry time (TestCancelUnorderedRacingARetryOfItsClaim). An operator told
-- so stops looking.
--
-- Now "neither" is checked against pending once more, in a third
-- statement: found there, the instruction is looked at again from the
-- start (at most three times; an instruction a claim took at every look
-- was in flight throughout, and is answered -1, in flight, nothing done).
--
-- Otherwise the function is 044's, line for line: the participant's lock
-- read through the instruction's key (044), -1 for an instruction in
-- flight (044), the cut-off refusal (035), the retry_at promotion (039),
-- the database role in the archived message (035), the tenant checks
-- (022). CREATE OR REPLACE keeps its owner and grants; its standing
-- (SECURITY DEFINER or not, migrations 020 and 031) is taken before and
-- given back after, with its search_path, as 044 did. The front
-- cancel_pending (044) is unchanged.

DO $m$
DECLARE
  definer boolean := (SELECT prosecdef FROM pg_proc WHERE oid = '{{.schema}}.cancel_pending_any_tenant(uuid, text, text)'::regprocedure);
BEGIN
  CREATE OR REPLACE FUNCTION {{.schema}}.cancel_pending_any_tenant(p_outbox_id uuid, p_operator text, p_reason text) RETURNS bigint
  LANGUAGE plpgsql VOLATILE AS $fn$
  DECLARE
    n bigint;
    rail_until timestamptz;
    participant text;
    is_pending boolean := false;
  BEGIN
    PERFORM {{.schema}}.operator_check(p_operator, p_reason);
    SELECT k.participant_id INTO participant FROM {{.schema}}.idempotency_keys k WHERE k.outbox_id = p_outbox_id;
    IF participant IS NULL THEN
      -- A row inserted without an enqueue has no key: read where it is.
      participant := coalesce((SELECT p.participant_id FROM {{.schema}}.pending p WHERE p.outbox_id = p_outbox_id),
                              (SELECT i.participant_id FROM {{.schema}}.inflight i WHERE i.outbox_id = p_outbox_id));
    END IF;
    PERFORM 1 FROM {{.schema}}.sequences s WHERE s.participant_id = participant FOR UPDATE;
    -- FOR UPDATE waits for a claim that holds the row, then skips it if
    -- the claim took it. With ordering on, under the lock only a claim
    -- moves the row (pending to in flight). With ordering off an outcome
    -- write and the reaper's requeue take no participant's lock, and one
    -- that puts the instruction back in pending (a retry, a requeue) can
    -- commit between this look at pending and the look in flight (a
    -- statement with a snapshot of its own): neither finds it, although
    -- it is pending. So "neither" is checked against pending once more,
    -- and an instruction found back there is looked at again, a bounded
    -- number of times.
    FOR pass IN 1..3 LOOP
      PERFORM 1 FROM {{.schema}}.pending p
      WHERE p.outbox_id = p_outbox_id AND {{.schema}}.tenant_in_scope(p.tenant_id)
      FOR UPDATE;
      is_pending := FOUND;
      EXIT WHEN is_pending;
      -- In flight: its rail call may be under way, and it is not the
      -- operator's to withdraw (-1: nothing done).
      IF EXISTS (SELECT 1 FROM {{.schema}}.inflight i
                 WHERE i.outbox_id = p_outbox_id AND {{.schema}}.tenant_in_scope(i.tenant_id)) THEN
        RETURN -1;
      END IF;
      -- Neither pending nor in flight: settled or unknown (0), unless it
      -- came back to pending from in flight between the two looks.
      IF NOT EXISTS (SELECT 1 FROM {{.schema}}.pending p
                     WHERE p.outbox_id = p_outbox_id AND {{.schema}}.tenant_in_scope(p.tenant_id)) THEN
        RETURN 0;
      END IF;
    END LOOP;
    IF NOT is_pending THEN
      -- Claimed and put back at every look: in flight during this call,
      -- and each time a claim took it first. Nothing done, as for one in
      -- flight; a cancel again takes it once it rests in pending.
      RETURN -1;
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

  IF definer THEN
    ALTER FUNCTION {{.schema}}.cancel_pending_any_tenant(uuid, text, text) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
  END IF;
END $m$;
