-- Enqueue through the owner, migration 033.
--
-- Producers wrote pending rows and allocated sequence ids themselves
-- (INSERT on pending, UPDATE (sequence_id) on idempotency_keys, EXECUTE on
-- allocate_sequence(s)), so those privileges were theirs outside an
-- enqueue too: `SELECT allocate_sequence('p')` alone took participant p's
-- next sequence id for an instruction that never existed, and with
-- ordering on every later instruction of p waited for it (a stranded
-- participant, whichever tenant's); a pending row inserted by hand, due
-- beside an instruction of its participant in flight, made every claim
-- that reached it fail on inflight_ordered_participant_idx, for every
-- tenant.
--
-- enqueue_pending (one instruction) and enqueue_pending_batch do what the
-- enqueue's second statement did: for an idempotency key that carries the
-- given outbox id and no sequence id yet (the key the enqueue's first
-- statement just inserted), allocate the participant's next sequence id,
-- insert the pending row and stamp the key. The instruction's identity
-- (tenant, instruction id, participant, key) is read from the key row, not
-- taken from the caller, so every pending row a producer can make is the
-- instruction of a key, and every sequence id allocated is that
-- instruction's, in the same statement. Where the roles of `outbox migrate
-- --create-roles` are in place they run as the owner (below), and this
-- build's roles script takes back the producers' INSERT on pending,
-- UPDATE on keys and EXECUTE on allocate_sequence(s).
--
-- The owner is not subject to row-level security, so the functions apply
-- the producer's tenant themselves: a key outside the session's
-- outbox.tenant is refused (42501), as the policy refuses its insert. The
-- enqueue inserted that key under the policy a moment before, so this
-- refuses only a call that names another tenant's key by hand.

-- enqueue_tenant_check is true for a key's tenant inside the session's
-- scope (outbox.tenant: '*' every tenant, '' or unset the rows without
-- one), and for every tenant where the session is not a producer (the
-- owner, a single-role deployment: the policies do not apply to them
-- either); otherwise it raises. session_user: inside the callers, which
-- run as the owner, current_user is the owner.
CREATE FUNCTION {{.schema}}.enqueue_tenant_check(p_tenant text) RETURNS boolean
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  scope text := current_setting('outbox.tenant', true);
BEGIN
  IF scope = '*' OR p_tenant = coalesce(scope, '') OR to_regrole('outbox_producer') IS NULL
     OR NOT pg_has_role(session_user, 'outbox_producer', 'MEMBER')
     OR EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = session_user AND (r.rolsuper OR r.rolbypassrls)) THEN
    RETURN true;
  END IF;
  RAISE EXCEPTION 'outbox: the idempotency key of this enqueue belongs to another tenant than outbox.tenant'
    USING ERRCODE = 'insufficient_privilege';
END $fn$;

-- One instruction: the common enqueue. One statement with scalar
-- parameters, as the statement it replaces was: PL/pgSQL keeps one
-- generic plan for it (migration 013 says why that matters), and it
-- starts one executor, not one per step (read the key, allocate, insert,
-- stamp).
CREATE FUNCTION {{.schema}}.enqueue_pending(p_outbox_id uuid, p_rail_type text, p_correlation_id text, p_payload text)
RETURNS void
LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
  -- No key row: a duplicate, a mismatch or a retired key, not this
  -- enqueue's; nothing is allocated or inserted.
  WITH k AS (
    SELECT i.tenant_id, i.instruction_id, i.participant_id, i.idempotency_key
    FROM {{.schema}}.idempotency_keys i
    WHERE i.outbox_id = p_outbox_id AND i.sequence_id IS NULL
      AND (i.tenant_id = coalesce(current_setting('outbox.tenant', true), '') OR {{.schema}}.enqueue_tenant_check(i.tenant_id))
  ), f AS (
    INSERT INTO {{.schema}}.sequences AS s (participant_id, next_sequence_id, queued)
    SELECT k.participant_id, 2, 1 FROM k
    ON CONFLICT ON CONSTRAINT sequences_pkey DO UPDATE
      SET next_sequence_id = s.next_sequence_id + 1, queued = s.queued + 1
    RETURNING s.next_sequence_id - 1 AS sequence_id, s.queued - 1 AS queued_before
  ), inserted AS (
    -- With ordering on, only a participant's head is due at once; the
    -- others wait until the outcome of the one before hands them on.
    INSERT INTO {{.schema}}.pending (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
                                    tenant_id, correlation_id, payload, attempt_count, next_attempt_at, created_at,
                                    zombie_attempt_id)
    SELECT p_outbox_id, k.instruction_id, k.participant_id, f.sequence_id, k.idempotency_key, p_rail_type,
           nullif(k.tenant_id, ''), nullif(p_correlation_id, ''), p_payload::jsonb, 0,
           CASE WHEN f.queued_before = 0 OR NOT (SELECT ordered FROM {{.schema}}.settings) THEN now() ELSE 'infinity' END,
           now(), NULL
    FROM k, f
  )
  UPDATE {{.schema}}.idempotency_keys x SET sequence_id = f.sequence_id
  FROM f WHERE x.outbox_id = p_outbox_id;
END $fn$;

-- A batch: the arrays are the instructions in input order. Sequence ids
-- are handed out per participant in input order; participants are locked
-- in participant order (allocate_sequences), so concurrent batches wait
-- for each other but do not deadlock. The keys are reached by outbox id,
-- one lookup per instruction (LATERAL with a LIMIT: the store's enqueue.go
-- says why never by a join the planner picks).
CREATE FUNCTION {{.schema}}.enqueue_pending_batch(p_outbox_ids uuid[], p_rail_types text[], p_correlation_ids text[],
                                                  p_payloads text[])
RETURNS void
LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
  WITH input AS (
    SELECT * FROM unnest(p_outbox_ids, p_rail_types, p_correlation_ids, p_payloads) WITH ORDINALITY
      AS u(outbox_id, rail_type, correlation_id, payload, ord)
  ), fresh AS (
    SELECT i.*, k.row AS key_row, k.tenant_id, k.instruction_id, k.participant_id, k.idempotency_key
    FROM input i
    CROSS JOIN LATERAL (SELECT k.ctid AS row, k.tenant_id, k.instruction_id, k.participant_id, k.idempotency_key
                        FROM {{.schema}}.idempotency_keys k
                        WHERE k.outbox_id = i.outbox_id AND k.sequence_id IS NULL LIMIT 1) k
    WHERE k.tenant_id = coalesce(current_setting('outbox.tenant', true), '') OR {{.schema}}.enqueue_tenant_check(k.tenant_id)
  ), counts AS (
    SELECT f.participant_id, count(*)::int AS n FROM fresh f GROUP BY f.participant_id
  ), firsts AS (
    SELECT b.participant_id, b.first_sequence_id, b.queued_before
    FROM {{.schema}}.allocate_sequences((SELECT array_agg(c.participant_id) FROM counts c),
                                        (SELECT array_agg(c.n) FROM counts c)) b
  ), numbered AS (
    SELECT f.*, fi.first_sequence_id + row_number() OVER (PARTITION BY f.participant_id ORDER BY f.ord) - 1 AS sequence_id,
           fi.queued_before = 0 AND row_number() OVER (PARTITION BY f.participant_id ORDER BY f.ord) = 1 AS head
    FROM fresh f JOIN firsts fi USING (participant_id)
  ), inserted AS (
    INSERT INTO {{.schema}}.pending (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
                                    tenant_id, correlation_id, payload, attempt_count, next_attempt_at, created_at,
                                    zombie_attempt_id)
    SELECT n.outbox_id, n.instruction_id, n.participant_id, n.sequence_id, n.idempotency_key, n.rail_type,
           nullif(n.tenant_id, ''), nullif(n.correlation_id, ''), n.payload::jsonb, 0,
           CASE WHEN n.head OR NOT (SELECT ordered FROM {{.schema}}.settings) THEN now() ELSE 'infinity' END, now(), NULL
    FROM numbered n
  )
  UPDATE {{.schema}}.idempotency_keys k SET sequence_id = n.sequence_id
  FROM numbered n WHERE k.ctid = ANY (ARRAY(SELECT x.key_row FROM numbered x)) AND k.ctid = n.key_row;
END $fn$;

-- Where the roles are in place (allocate_sequence then runs as the owner),
-- the new functions take its standing at once: they run as the owner, and
-- whoever may allocate may call them, so producers keep enqueueing after an
-- upgrade that only migrated. The producers' old privileges stay until
-- this build's `outbox migrate --create-roles` takes them back: the
-- previous build's producers still use them during a rolling deploy.
-- roles.sql says the same for fresh installs.
DO $$
DECLARE
  g regrole;
BEGIN
  IF (SELECT prosecdef FROM pg_proc WHERE oid = '{{.schema}}.allocate_sequence(text)'::regprocedure) THEN
    ALTER FUNCTION {{.schema}}.enqueue_pending(uuid, text, text, text) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
    ALTER FUNCTION {{.schema}}.enqueue_pending_batch(uuid[], text[], text[], text[]) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
    REVOKE ALL ON FUNCTION {{.schema}}.enqueue_pending(uuid, text, text, text), {{.schema}}.enqueue_pending_batch(uuid[], text[], text[], text[]),
      {{.schema}}.enqueue_tenant_check(text) FROM PUBLIC;
    FOR g IN SELECT a.grantee::regrole FROM pg_proc p, aclexplode(p.proacl) a
             WHERE p.oid = '{{.schema}}.allocate_sequence(text)'::regprocedure
               AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner LOOP
      EXECUTE format('GRANT EXECUTE ON FUNCTION {{.schema}}.enqueue_pending(uuid, text, text, text) TO %s', g);
      EXECUTE format('GRANT EXECUTE ON FUNCTION {{.schema}}.enqueue_pending_batch(uuid[], text[], text[], text[]) TO %s', g);
    END LOOP;
  END IF;
END $$;
