-- A login role bound to its tenants, migration 036.
--
-- The tenant a producer, auditor or operator acts for is the session's
-- outbox.tenant setting, which the session chooses: it keeps tenants apart
-- from each other's bugs, but a credential of tenant A could set it to B
-- and enqueue, read and act as B. tenant_bindings ties a login role to
-- the tenants it may act for ('' stands for the rows without a tenant).
-- A session whose login role (session_user: SET ROLE and SECURITY DEFINER
-- do not change it) has bindings acts within them whatever outbox.tenant
-- says: the setting still chooses among them ('*' means all of them, not
-- every tenant). A login role without bindings is scoped by the setting
-- alone, as before. Bindings are data, written by the owner:
--
--   INSERT INTO outbox.tenant_bindings (role_name, tenant_id) VALUES ('payments_a', 'A');
--
-- They restrict the roles the tenant policies scope (producers, auditors,
-- operators); relayers, the owner, superusers and roles with BYPASSRLS
-- work across tenants and are not restricted by a binding.
CREATE TABLE {{.schema}}.tenant_bindings (
  role_name text NOT NULL,
  tenant_id text NOT NULL,
  bound_at  timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (role_name, tenant_id)
);

-- Each session reads its own login role's bindings; auditors and
-- operators read all of them (who may act for which tenant is part of
-- what they audit); only the owner writes them. The tenant policies below
-- read the table in their subquery as the session, so it needs a policy
-- of its own; the roles script sets the same up on a fresh install.
ALTER TABLE {{.schema}}.tenant_bindings ENABLE ROW LEVEL SECURITY;
DO $$
BEGIN
  IF to_regrole('outbox_producer') IS NOT NULL AND to_regrole('outbox_auditor') IS NOT NULL
     AND to_regrole('outbox_operator') IS NOT NULL THEN
    CREATE POLICY outbox_own_bindings ON {{.schema}}.tenant_bindings TO outbox_producer USING (role_name = session_user);
    CREATE POLICY outbox_all_bindings ON {{.schema}}.tenant_bindings TO outbox_auditor, outbox_operator USING (true);
  END IF;
END $$;

-- The operators' functions run as the owner, which row-level security
-- does not filter, and apply the tables' policy themselves
-- (tenant_in_scope, migration 022): now with the binding too. Same rules
-- otherwise; not SECURITY DEFINER, it runs inside the functions that are.
CREATE OR REPLACE FUNCTION {{.schema}}.tenant_in_scope(p_tenant text) RETURNS boolean
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  scope text := current_setting('outbox.tenant', true);
  bound text[];
BEGIN
  IF to_regrole('outbox_operator') IS NULL OR NOT pg_has_role(session_user, 'outbox_operator', 'MEMBER')
     OR EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = session_user AND (r.rolsuper OR r.rolbypassrls)) THEN
    RETURN true;
  END IF;
  bound := (SELECT array_agg(b.tenant_id) FROM {{.schema}}.tenant_bindings b WHERE b.role_name = session_user);
  IF bound IS NOT NULL AND NOT coalesce(p_tenant, '') = ANY (bound) THEN
    RETURN false;
  END IF;
  RETURN scope = '*' OR coalesce(p_tenant, '') = coalesce(scope, '');
END $fn$;

-- The producers' functions (migration 033) likewise: a key of a tenant
-- outside the producer's bindings is refused (42501) even with
-- outbox.tenant '*'. The enqueue's key insert meets the binding first, in
-- the policy below; this refuses a hand-made call naming another tenant's
-- key. enqueue_pending(_batch) call this only for a key of another tenant
-- than outbox.tenant, so a session whose setting names a tenant outside
-- its bindings could still complete a key of that tenant inserted without
-- its instruction (docs/audit.md); it cannot insert one there.
CREATE OR REPLACE FUNCTION {{.schema}}.enqueue_tenant_check(p_tenant text) RETURNS boolean
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  scope text := current_setting('outbox.tenant', true);
  bound text[];
BEGIN
  IF to_regrole('outbox_producer') IS NULL OR NOT pg_has_role(session_user, 'outbox_producer', 'MEMBER')
     OR EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = session_user AND (r.rolsuper OR r.rolbypassrls)) THEN
    RETURN true;
  END IF;
  bound := (SELECT array_agg(b.tenant_id) FROM {{.schema}}.tenant_bindings b WHERE b.role_name = session_user);
  IF bound IS NULL OR p_tenant = ANY (bound) THEN
    IF scope = '*' OR p_tenant = coalesce(scope, '') THEN
      RETURN true;
    END IF;
    RAISE EXCEPTION 'outbox: the idempotency key of this enqueue belongs to another tenant than outbox.tenant'
      USING ERRCODE = 'insufficient_privilege';
  END IF;
  RAISE EXCEPTION 'outbox: the idempotency key of this enqueue belongs to a tenant this login role is not bound to'
    USING ERRCODE = 'insufficient_privilege';
END $fn$;

-- The tenant policies (the roles script creates them; a schema without
-- the roles has none): the binding, beside the setting. Its subquery is
-- an InitPlan, run once per statement (a producer's key insert took 4-5 us
-- longer in a server-side loop; a SECURITY DEFINER function in its place,
-- 14), and a session without bindings compares the row's tenant with
-- itself.
DO $$
DECLARE
  t text;
BEGIN
  IF EXISTS (SELECT 1 FROM pg_policies p WHERE p.schemaname = '{{.schema}}' AND p.policyname = 'outbox_tenant') THEN
    GRANT SELECT ON {{.schema}}.tenant_bindings TO outbox_producer, outbox_auditor, outbox_operator;
  END IF;
  FOR t IN SELECT p.tablename FROM pg_policies p WHERE p.schemaname = '{{.schema}}' AND p.policyname = 'outbox_tenant' LOOP
    EXECUTE format($p$ALTER POLICY outbox_tenant ON {{.schema}}.%I
                     USING ((current_setting('outbox.tenant', true) = '*'
                             OR coalesce(tenant_id, '') = coalesce(current_setting('outbox.tenant', true), ''))
                            AND coalesce(tenant_id, '') = ANY (coalesce((SELECT array_agg(b.tenant_id) FROM {{.schema}}.tenant_bindings b WHERE b.role_name = session_user), ARRAY[coalesce(tenant_id, '')])))
                     WITH CHECK ((current_setting('outbox.tenant', true) = '*'
                                  OR coalesce(tenant_id, '') = coalesce(current_setting('outbox.tenant', true), ''))
                                 AND coalesce(tenant_id, '') = ANY (coalesce((SELECT array_agg(b.tenant_id) FROM {{.schema}}.tenant_bindings b WHERE b.role_name = session_user), ARRAY[coalesce(tenant_id, '')])))$p$, t);
  END LOOP;
END $$;
