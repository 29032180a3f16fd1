-- The enqueue functions keep a bound producer to its bindings, migration
-- 038.
--
-- enqueue_pending(_batch) (migration 033) run as the owner, which
-- row-level security does not filter, and applied the session's tenant
-- themselves: a key of the tenant outbox.tenant names was taken as it
-- was, and only a key of another tenant went through enqueue_tenant_check,
-- which applies the bindings (migration 036). So a producer bound to A
-- whose session set outbox.tenant to B completed a key of B inserted
-- without its instruction (its outbox id known): a payment of B, with the
-- rail and payload it chose. Now a key of the setting's tenant is taken
-- as it was only if the session's login role has no bindings or is bound
-- to that tenant; any other key goes through enqueue_tenant_check, which
-- refuses it (42501) as it refuses a key of another tenant, for the roles
-- the bindings restrict (producers), and lets the others through
-- (relayers, superusers, BYPASSRLS roles), as before.
--
-- The bindings are read only where the function runs as another role
-- than the session's (session_user <> current_user: SECURITY DEFINER, the
-- roles in place, and the caller not the owner). Where the session runs
-- it as itself (the owner, where roles are in place; anyone, where they
-- are not, and then the tenant policies, where there are any, filter the
-- key read), nothing is read, so the owner's enqueue costs what it did,
-- and a caller without SELECT on tenant_bindings keeps enqueueing. The
-- read is a statement of its own, before the enqueue's, so the enqueue's
-- statement keeps one generic plan without the table in it
-- (docs/performance.md gives what it costs).
--
-- Same functions otherwise, as migration 033 wrote them (no later
-- migration replaced them); CREATE OR REPLACE keeps their owners and
-- grants, and each function's standing (SECURITY DEFINER and its
-- search_path where the roles are in place) is restated as it was.
DO $m$
DECLARE
  one_definer boolean := (SELECT prosecdef FROM pg_proc
                          WHERE oid = '{{.schema}}.enqueue_pending(uuid, text, text, text)'::regprocedure);
  batch_definer boolean := (SELECT prosecdef FROM pg_proc
                            WHERE oid = '{{.schema}}.enqueue_pending_batch(uuid[], text[], text[], text[])'::regprocedure);
BEGIN
  CREATE OR REPLACE FUNCTION {{.schema}}.enqueue_pending(p_outbox_id uuid, p_rail_type text, p_correlation_id text, p_payload text)
  RETURNS void
  LANGUAGE plpgsql VOLATILE AS $fn$
  DECLARE
    bound text[]; -- the login role's tenants; NULL: none, or not read
  BEGIN
    IF session_user <> current_user THEN
      bound := (SELECT array_agg(b.tenant_id) FROM {{.schema}}.tenant_bindings b WHERE b.role_name = session_user);
    END IF;
    -- No key row: a duplicate, a mismatch or a retired key, not this
    -- enqueue's; nothing is allocated or inserted.
    WITH k AS (
      SELECT i.tenant_id, i.instruction_id, i.participant_id, i.idempotency_key
      FROM {{.schema}}.idempotency_keys i
      WHERE i.outbox_id = p_outbox_id AND i.sequence_id IS NULL
        AND ((i.tenant_id = coalesce(current_setting('outbox.tenant', true), '') AND (bound IS NULL OR i.tenant_id = ANY (bound)))
             OR {{.schema}}.enqueue_tenant_check(i.tenant_id))
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

  CREATE OR REPLACE FUNCTION {{.schema}}.enqueue_pending_batch(p_outbox_ids uuid[], p_rail_types text[], p_correlation_ids text[],
                                                               p_payloads text[])
  RETURNS void
  LANGUAGE plpgsql VOLATILE AS $fn$
  DECLARE
    bound text[]; -- the login role's tenants; NULL: none, or not read
  BEGIN
    IF session_user <> current_user THEN
      bound := (SELECT array_agg(b.tenant_id) FROM {{.schema}}.tenant_bindings b WHERE b.role_name = session_user);
    END IF;
    WITH input AS (
      SELECT * FROM unnest(p_outbox_ids, p_rail_types, p_correlation_ids, p_payloads) WITH ORDINALITY
        AS u(outbox_id, rail_type, correlation_id, payload, ord)
    ), fresh AS (
      SELECT i.*, k.row AS key_row, k.tenant_id, k.instruction_id, k.participant_id, k.idempotency_key
      FROM input i
      CROSS JOIN LATERAL (SELECT k.ctid AS row, k.tenant_id, k.instruction_id, k.participant_id, k.idempotency_key
                          FROM {{.schema}}.idempotency_keys k
                          WHERE k.outbox_id = i.outbox_id AND k.sequence_id IS NULL LIMIT 1) k
      WHERE (k.tenant_id = coalesce(current_setting('outbox.tenant', true), '') AND (bound IS NULL OR k.tenant_id = ANY (bound)))
         OR {{.schema}}.enqueue_tenant_check(k.tenant_id)
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

  IF one_definer THEN
    ALTER FUNCTION {{.schema}}.enqueue_pending(uuid, text, text, text) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
  END IF;
  IF batch_definer THEN
    ALTER FUNCTION {{.schema}}.enqueue_pending_batch(uuid[], text[], text[], text[]) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
  END IF;
END $m$;
