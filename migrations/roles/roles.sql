-- Least privilege (docs/audit.md). Run by `outbox migrate --create-roles`
-- as a superuser (or a role with CREATEROLE that owns the schema), after
-- the migrations; idempotent, so it is also how grants are brought up to
-- date after a migration adds a table. {{schema}} is the schema.

-- The roles are cluster-wide and shared by every outbox schema of the
-- cluster. LOGIN without a password: set one (ALTER ROLE ... PASSWORD) or
-- map them in pg_hba.conf / pg_ident.conf.
DO $$
DECLARE
  r text;
BEGIN
  FOREACH r IN ARRAY ARRAY['outbox_owner', 'outbox_producer', 'outbox_relayer', 'outbox_auditor', 'outbox_operator'] LOOP
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
      BEGIN
        EXECUTE format('CREATE ROLE %I LOGIN', r);
      EXCEPTION WHEN duplicate_object OR unique_violation THEN
        NULL; -- created meanwhile by a concurrent run
      END;
    END IF;
  END LOOP;
END $$;

-- outbox_owner owns the schema and everything in it, and is the role that
-- runs migrations from now on. Nobody else can change a table's
-- definition, disable its triggers or drop a partition.
ALTER SCHEMA {{schema}} OWNER TO outbox_owner;
DO $$
DECLARE
  o record;
BEGIN
  FOR o IN
    SELECT format('ALTER %s %I.%I OWNER TO outbox_owner',
                  CASE c.relkind WHEN 'S' THEN 'SEQUENCE' ELSE 'TABLE' END, n.nspname, c.relname) AS stmt
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = '{{schema}}' AND c.relkind IN ('r', 'p', 'S')
    UNION ALL
    -- Views: the archive view (migration 011), which a migration that adds
    -- a column to attempts recreates. It reads with its reader's
    -- privileges (security_invoker), so its owner grants nothing by owning
    -- it.
    SELECT format('ALTER VIEW %I.%I OWNER TO outbox_owner', n.nspname, c.relname)
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = '{{schema}}' AND c.relkind = 'v'
    UNION ALL
    SELECT format('ALTER FUNCTION %s OWNER TO outbox_owner', p.oid::regprocedure)
    FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
    WHERE n.nspname = '{{schema}}'
  LOOP
    EXECUTE o.stmt;
  END LOOP;
END $$;

-- What runs as the owner on behalf of others: the producer's sequence
-- allocation and pending insert (so producers need no access to sequences
-- or pending), the relayers' partition upkeep (DDL, which relayers may not
-- do themselves) and their settling of a poison instruction's dead letter
-- by its late DISPATCHED outcome (relayers may not delete dead letters
-- otherwise).
ALTER FUNCTION {{schema}}.allocate_sequences(text[], int[]) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{schema}}.allocate_sequence(text) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{schema}}.ensure_attempt_partitions(int) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{schema}}.settle_poison_dead_letters(uuid[]) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION {{schema}}.allocate_sequences(text[], int[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION {{schema}}.allocate_sequence(text) FROM PUBLIC;
ALTER FUNCTION {{schema}}.enqueue_pending(uuid, text, text, text) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{schema}}.enqueue_pending_batch(uuid[], text[], text[], text[]) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION {{schema}}.enqueue_pending(uuid, text, text, text), {{schema}}.enqueue_pending_batch(uuid[], text[], text[], text[]),
  {{schema}}.enqueue_tenant_check(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION {{schema}}.ensure_attempt_partitions(int) FROM PUBLIC;
REVOKE ALL ON FUNCTION {{schema}}.settle_poison_dead_letters(uuid[]) FROM PUBLIC;
-- A late outcome's claim, read by relayers (migration 024) as the owner:
-- it may be in a detached month, which relayers do not read otherwise.
ALTER FUNCTION {{schema}}.archived_claim(uuid, timestamptz) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION {{schema}}.archived_claim(uuid, timestamptz) FROM PUBLIC;
-- Likewise whether a resent outcome was archived already (migration 029:
-- it reads the detached months too).
ALTER FUNCTION {{schema}}.archived_attempt(uuid, timestamptz) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION {{schema}}.archived_attempt(uuid, timestamptz) FROM PUBLIC;
-- Relayers take checkpoints (migration 031) as the owner: they may not
-- insert one themselves (a forged checkpoint, one of a period still to
-- come, would stop checkpointing), and the function closes no period past
-- its clock.
ALTER FUNCTION {{schema}}.take_checkpoint(timestamptz, interval, interval) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION {{schema}}.take_checkpoint(timestamptz, interval, interval) FROM PUBLIC;
-- Operators pause and resume rails (migration 019) as the owner: they may
-- not write rail_pauses themselves, and every pause is recorded.
ALTER FUNCTION {{schema}}.pause_rail(text, text, text) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{schema}}.resume_rail(text, text, text) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION {{schema}}.pause_rail(text, text, text), {{schema}}.resume_rail(text, text, text) FROM PUBLIC;
-- A resume of the pause shown (migration 047) stands as resume_rail.
ALTER FUNCTION {{schema}}.resume_rail_shown(text, timestamptz, text, text) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION {{schema}}.resume_rail_shown(text, timestamptz, text, text) FROM PUBLIC;
-- Operators cancel a pending instruction (migration 020) as the owner,
-- which archives who and why.
ALTER FUNCTION {{schema}}.cancel_pending(uuid, text, text) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION {{schema}}.cancel_pending(uuid, text, text) FROM PUBLIC;
-- The statements behind the operators' functions (migration 022), for the
-- owner alone: the functions operators run keep them to their tenant.
REVOKE ALL ON FUNCTION {{schema}}.replay_dead_letter_any_tenant(uuid, text, text), {{schema}}.acknowledge_dead_letter_any_tenant(uuid, text, text),
  {{schema}}.cancel_pending_any_tenant(uuid, text, text) FROM PUBLIC;

-- Start from nothing, then grant what each role needs.
REVOKE ALL ON ALL TABLES IN SCHEMA {{schema}} FROM outbox_producer, outbox_relayer, outbox_auditor, outbox_operator;
GRANT USAGE ON SCHEMA {{schema}} TO outbox_producer, outbox_relayer, outbox_auditor, outbox_operator;
GRANT SELECT ON {{schema}}.schema_version, {{schema}}.settings TO outbox_producer, outbox_relayer, outbox_auditor, outbox_operator;

-- Producer: enqueue (keys; pending rows and their sequence ids through
-- enqueue_pending(_batch), migration 033, which run as the owner and read
-- the instruction from its key), and read its own receipts (keys, under
-- its tenant). No INSERT on pending, no UPDATE on keys and no
-- allocate_sequence(s): with them a producer credential could allocate a
-- sequence id, or insert a pending row, outside an enqueue (a stranded
-- participant, every tenant's claims failing); a run of the roles script
-- before 033 granted them, and this takes them back.
-- A key is inserted without its sequence id (enqueue_pending stamps it):
-- a key inserted with one would be a receipt of an instruction that was
-- never enqueued, its enqueues answered as duplicates and never paid.
GRANT SELECT, INSERT (tenant_id, instruction_id, idempotency_key, outbox_id, participant_id, payload_hash)
  ON {{schema}}.idempotency_keys TO outbox_producer;
GRANT SELECT ON {{schema}}.retired_keys TO outbox_producer; -- a retired key is refused, not enqueued again
-- The tenant policies read the session's own bindings (migration 036) as
-- the session; a producer reads only its own login role's.
GRANT SELECT ON {{schema}}.tenant_bindings TO outbox_producer;
-- No grant on relayer_idle: the adaptive NOTIFY trigger that reads it
-- fires inside enqueue_pending(_batch), as the owner (the previous
-- build's producers inserted pending rows themselves and needed it).
REVOKE ALL ON FUNCTION {{schema}}.allocate_sequences(text[], int[]), {{schema}}.allocate_sequence(text) FROM outbox_producer;
GRANT EXECUTE ON FUNCTION {{schema}}.enqueue_pending(uuid, text, text, text) TO outbox_producer;
GRANT EXECUTE ON FUNCTION {{schema}}.enqueue_pending_batch(uuid[], text[], text[], text[]) TO outbox_producer;

-- Relayer: claim, record, hand off, reap, register idle, checkpoint,
-- partition upkeep. The archive and the checkpoints only grow; checkpoints
-- through take_checkpoint alone.
GRANT SELECT, INSERT, DELETE ON {{schema}}.pending, {{schema}}.inflight TO outbox_relayer;
-- When a pending row is due, and nothing else of it (migration 042); no
-- relayer statement updates inflight, but the reaper's row locks (FOR
-- UPDATE) need UPDATE on one of its columns.
GRANT UPDATE (next_attempt_at, retry_at) ON {{schema}}.pending TO outbox_relayer;
GRANT UPDATE (lease_until) ON {{schema}}.inflight TO outbox_relayer;
GRANT SELECT ON {{schema}}.sequences TO outbox_relayer;
-- queued only (outcomes, hand-offs, reaps and withdrawals count an
-- instruction out); the next sequence id is allocated for producers alone.
GRANT UPDATE (queued) ON {{schema}}.sequences TO outbox_relayer;
GRANT SELECT, INSERT ON {{schema}}.attempts, {{schema}}.dead_letters TO outbox_relayer;
GRANT SELECT ON {{schema}}.checkpoints TO outbox_relayer;
GRANT EXECUTE ON FUNCTION {{schema}}.take_checkpoint(timestamptz, interval, interval) TO outbox_relayer;
GRANT SELECT, INSERT, UPDATE, DELETE ON {{schema}}.relayer_idle TO outbox_relayer;
-- Each run's registration under its relayer id (migration 052).
GRANT SELECT, INSERT, UPDATE, DELETE ON {{schema}}.relayer_runs TO outbox_relayer;
GRANT EXECUTE ON FUNCTION {{schema}}.ensure_attempt_partitions(int) TO outbox_relayer;
GRANT EXECUTE ON FUNCTION {{schema}}.settle_poison_dead_letters(uuid[]) TO outbox_relayer;
GRANT EXECUTE ON FUNCTION {{schema}}.archived_claim(uuid, timestamptz) TO outbox_relayer;
GRANT EXECUTE ON FUNCTION {{schema}}.archived_attempt(uuid, timestamptz) TO outbox_relayer;
GRANT SELECT ON {{schema}}.rail_pauses TO outbox_relayer; -- claims leave paused rails alone

-- Auditor: reads everything (verify checks the queue against the archive),
-- writes nothing. Operator: reads what an auditor reads; writes only
-- through the functions that record who did it.
--
-- Every table and view of the schema except the archive's partitions,
-- which are read through their parents (attempts, attempts_detached, the
-- archive view): the parents' row-level security below keeps a reader to
-- its tenant, and PostgreSQL applies it to queries through the parent
-- only, never to a query that names a partition. Reading through a parent
-- needs no privilege on its partitions. (Not GRANT ... ON ALL TABLES: that
-- includes every partition.)
DO $$
DECLARE
  r record;
BEGIN
  FOR r IN SELECT c.oid::regclass AS rel FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE n.nspname = '{{schema}}' AND c.relkind IN ('r', 'p', 'v', 'm') AND NOT c.relispartition LOOP
    EXECUTE format('GRANT SELECT ON TABLE %s TO outbox_auditor, outbox_operator', r.rel);
  END LOOP;
END $$;
GRANT EXECUTE ON FUNCTION {{schema}}.replay_dead_letter(uuid, text, text), {{schema}}.acknowledge_dead_letter(uuid, text, text)
  TO outbox_operator;
GRANT EXECUTE ON FUNCTION {{schema}}.pause_rail(text, text, text), {{schema}}.resume_rail(text, text, text) TO outbox_operator;
GRANT EXECUTE ON FUNCTION {{schema}}.resume_rail_shown(text, timestamptz, text, text) TO outbox_operator;
GRANT EXECUTE ON FUNCTION {{schema}}.cancel_pending(uuid, text, text) TO outbox_operator;

-- The vacuum horizon (migration 018): relayers, auditors and operators see
-- the state, start and client of what holds it back in every role's
-- sessions, through the owner's pg_read_all_stats, without seeing those
-- sessions' queries.
ALTER FUNCTION {{schema}}.vacuum_horizon() SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
REVOKE ALL ON FUNCTION {{schema}}.vacuum_horizon() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION {{schema}}.vacuum_horizon() TO outbox_relayer, outbox_auditor, outbox_operator;
DO $$
BEGIN
  GRANT pg_read_all_stats TO outbox_owner;
EXCEPTION WHEN insufficient_privilege THEN
  RAISE WARNING 'could not grant pg_read_all_stats to outbox_owner (%): the vacuum horizon shows other roles'' sessions without their state and start until a superuser does', SQLERRM;
END $$;
-- Tenant isolation: row-level security on every table that holds an
-- instruction, keyed by its tenant and the session's outbox.tenant setting
-- ('' or unset: the rows without a tenant; '*': every tenant), within the
-- tenants its login role is bound to, if any (tenant_bindings, migration
-- 036). Producers, auditors and operators are scoped; relayers work across
-- tenants. The owner is not subject to these policies (it is not in their
-- roles).
DO $$
DECLARE
  t text;
BEGIN
  FOREACH t IN ARRAY ARRAY['idempotency_keys', 'retired_keys', 'pending', 'inflight', 'attempts', 'attempts_detached',
                           'dead_letters'] LOOP
    EXECUTE format('ALTER TABLE {{schema}}.%I ENABLE ROW LEVEL SECURITY', t);
    EXECUTE format('DROP POLICY IF EXISTS outbox_relayer_all ON {{schema}}.%I', t);
    EXECUTE format('CREATE POLICY outbox_relayer_all ON {{schema}}.%I TO outbox_relayer USING (true) WITH CHECK (true)', t);
    EXECUTE format('DROP POLICY IF EXISTS outbox_tenant ON {{schema}}.%I', t);
    EXECUTE format($p$CREATE POLICY outbox_tenant ON {{schema}}.%I TO outbox_producer, outbox_auditor, outbox_operator
                     USING ((current_setting('outbox.tenant', true) = '*'
                             OR coalesce(tenant_id, '') = coalesce(current_setting('outbox.tenant', true), ''))
                            AND coalesce(tenant_id, '') = ANY (coalesce((SELECT array_agg(b.tenant_id) FROM {{schema}}.tenant_bindings b WHERE b.role_name = session_user), ARRAY[coalesce(tenant_id, '')])))
                     WITH CHECK ((current_setting('outbox.tenant', true) = '*'
                                  OR coalesce(tenant_id, '') = coalesce(current_setting('outbox.tenant', true), ''))
                                 AND coalesce(tenant_id, '') = ANY (coalesce((SELECT array_agg(b.tenant_id) FROM {{schema}}.tenant_bindings b WHERE b.role_name = session_user), ARRAY[coalesce(tenant_id, '')])))$p$, t);
  END LOOP;
END $$;
-- Operator rows only through the operators' functions (migration 040):
-- relayers append to the archive and the dead letters, but never a
-- replay, acknowledgement or cancel (rows that name a person and a
-- database role) nor a dead letter already acknowledged. The operators'
-- functions write those as the owner, whom no policy restricts.
-- Restrictive: they narrow outbox_relayer_all above.
DROP POLICY IF EXISTS outbox_relayer_no_operator_rows ON {{schema}}.attempts;
CREATE POLICY outbox_relayer_no_operator_rows ON {{schema}}.attempts AS RESTRICTIVE FOR INSERT TO outbox_relayer
  WITH CHECK (state NOT IN ('REPLAYED', 'ACKNOWLEDGED', 'CANCELLED'));
DROP POLICY IF EXISTS outbox_relayer_no_acknowledgement ON {{schema}}.dead_letters;
CREATE POLICY outbox_relayer_no_acknowledgement ON {{schema}}.dead_letters AS RESTRICTIVE FOR INSERT TO outbox_relayer
  WITH CHECK (acknowledged_at IS NULL AND acknowledged_by IS NULL AND acknowledged_reason IS NULL);
-- A relayer moves rows between the queue's tables unchanged (migration
-- 042): what it inserts into pending, inflight or dead_letters must say
-- what the row it moves from says (the statement deletes that row, and
-- still sees it). Restrictive: they narrow outbox_relayer_all above.
DROP POLICY IF EXISTS outbox_relayer_from_inflight ON {{schema}}.pending;
CREATE POLICY outbox_relayer_from_inflight ON {{schema}}.pending AS RESTRICTIVE FOR INSERT TO outbox_relayer
  WITH CHECK (EXISTS (SELECT 1 FROM {{schema}}.inflight f
                      WHERE f.outbox_id = pending.outbox_id
                        AND (f.instruction_id, f.participant_id, f.sequence_id, f.idempotency_key, f.rail_type, f.payload, f.created_at)
                          = (pending.instruction_id, pending.participant_id, pending.sequence_id, pending.idempotency_key, pending.rail_type, pending.payload, pending.created_at)
                        AND f.tenant_id IS NOT DISTINCT FROM pending.tenant_id
                        AND f.correlation_id IS NOT DISTINCT FROM pending.correlation_id));
DROP POLICY IF EXISTS outbox_relayer_from_pending ON {{schema}}.inflight;
CREATE POLICY outbox_relayer_from_pending ON {{schema}}.inflight AS RESTRICTIVE FOR INSERT TO outbox_relayer
  WITH CHECK (EXISTS (SELECT 1 FROM {{schema}}.pending p
                      WHERE p.outbox_id = inflight.outbox_id
                        AND (p.instruction_id, p.participant_id, p.sequence_id, p.idempotency_key, p.rail_type, p.payload, p.created_at)
                          = (inflight.instruction_id, inflight.participant_id, inflight.sequence_id, inflight.idempotency_key, inflight.rail_type, inflight.payload, inflight.created_at)
                        AND p.tenant_id IS NOT DISTINCT FROM inflight.tenant_id
                        AND p.correlation_id IS NOT DISTINCT FROM inflight.correlation_id));
DROP POLICY IF EXISTS outbox_relayer_from_queue ON {{schema}}.dead_letters;
CREATE POLICY outbox_relayer_from_queue ON {{schema}}.dead_letters AS RESTRICTIVE FOR INSERT TO outbox_relayer
  WITH CHECK (EXISTS (SELECT 1 FROM {{schema}}.inflight f
                      WHERE f.outbox_id = dead_letters.outbox_id
                        AND (f.instruction_id, f.participant_id, f.sequence_id, f.idempotency_key, f.rail_type, f.payload, f.created_at)
                          = (dead_letters.instruction_id, dead_letters.participant_id, dead_letters.sequence_id, dead_letters.idempotency_key, dead_letters.rail_type, dead_letters.payload, dead_letters.created_at)
                        AND f.tenant_id IS NOT DISTINCT FROM dead_letters.tenant_id
                        AND f.correlation_id IS NOT DISTINCT FROM dead_letters.correlation_id)
           OR EXISTS (SELECT 1 FROM {{schema}}.pending p
                      WHERE p.outbox_id = dead_letters.outbox_id
                        AND (p.instruction_id, p.participant_id, p.sequence_id, p.idempotency_key, p.rail_type, p.payload, p.created_at)
                          = (dead_letters.instruction_id, dead_letters.participant_id, dead_letters.sequence_id, dead_letters.idempotency_key, dead_letters.rail_type, dead_letters.payload, dead_letters.created_at)
                        AND p.tenant_id IS NOT DISTINCT FROM dead_letters.tenant_id
                        AND p.correlation_id IS NOT DISTINCT FROM dead_letters.correlation_id));
-- Who may act for which tenant (migration 036): a producer reads its own
-- login role's bindings, auditors and operators read all of them, only
-- the owner writes them.
ALTER TABLE {{schema}}.tenant_bindings ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS outbox_own_bindings ON {{schema}}.tenant_bindings;
CREATE POLICY outbox_own_bindings ON {{schema}}.tenant_bindings TO outbox_producer USING (role_name = session_user);
DROP POLICY IF EXISTS outbox_all_bindings ON {{schema}}.tenant_bindings;
CREATE POLICY outbox_all_bindings ON {{schema}}.tenant_bindings TO outbox_auditor, outbox_operator USING (true);
-- The archive's partitions (every month, attached or detached, and the
-- default partition): no privilege for anyone but the owner, whoever
-- granted it (the REVOKE above takes back only the outbox roles'; a
-- version of this script before migration 027 granted auditors and
-- operators every partition), and row-level security without a policy, so
-- that a grant made anyway reads no row. The parents' policies do not
-- reach a query that names a partition; a partition's own do not affect
-- queries through its parent. Migration 027 does the same, and so do
-- partition upkeep and `outbox archive detach` for the months they
-- create and move (seal_archive_partition); this script does it itself
-- because it also runs on schemas from before 027.
DO $$
DECLARE
  p record;
  g oid;
BEGIN
  FOR p IN SELECT c.oid::regclass AS rel, c.relrowsecurity AS rls, c.relowner, c.relacl FROM pg_inherits i
           JOIN pg_class c ON c.oid = i.inhrelid
           WHERE i.inhparent IN ('{{schema}}.attempts'::regclass, '{{schema}}.attempts_detached'::regclass) LOOP
    IF NOT p.rls THEN
      EXECUTE format('ALTER TABLE %s ENABLE ROW LEVEL SECURITY', p.rel);
    END IF;
    FOR g IN SELECT DISTINCT a.grantee FROM aclexplode(p.relacl) a WHERE a.grantee <> p.relowner LOOP
      IF g = 0 THEN
        EXECUTE format('REVOKE ALL ON TABLE %s FROM PUBLIC', p.rel);
      ELSE
        EXECUTE format('REVOKE ALL ON TABLE %s FROM %s', p.rel, g::regrole);
      END IF;
    END LOOP;
  END LOOP;
END $$;
