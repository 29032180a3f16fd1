-- An operator scoped to one tenant acts on that tenant's instructions only.
-- replay_dead_letter, acknowledge_dead_letter and cancel_pending run as the
-- owner (migrations 008 and 020), which row-level security does not
-- filter: an operator connected with outbox.tenant = 'A', who cannot even
-- see tenant B's rows, could replay, acknowledge or cancel one of them by
-- its outbox id. Each is now a thin function that looks up the
-- instruction's tenant and, if the caller's tables would hide it, answers
-- as for an instruction that is not there (0); the statements themselves
-- move, unchanged, to *_any_tenant functions that only the owner runs.

-- tenant_in_scope says whether this session may act on a row of tenant
-- p_tenant: the tables' own policy for the roles it scopes (outbox.tenant
-- '*' for every tenant, unset or '' for the rows without one), for a
-- session whose login is an operator. Owners, superusers and roles that
-- bypass row-level security are not scoped by the tables, and are not here.
-- session_user, not current_user: inside the callers, which run as the
-- owner, current_user is the owner.
CREATE FUNCTION {{.schema}}.tenant_in_scope(p_tenant text) RETURNS boolean
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
  scope text := current_setting('outbox.tenant', true);
BEGIN
  IF scope = '*' OR coalesce(p_tenant, '') = coalesce(scope, '') THEN
    RETURN true;
  END IF;
  IF to_regrole('outbox_operator') IS NULL THEN
    RETURN true;
  END IF;
  RETURN NOT pg_has_role(session_user, 'outbox_operator', 'MEMBER')
      OR EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = session_user AND (r.rolsuper OR r.rolbypassrls));
END $fn$;

ALTER FUNCTION {{.schema}}.replay_dead_letter(uuid, text, text) RENAME TO replay_dead_letter_any_tenant;
ALTER FUNCTION {{.schema}}.acknowledge_dead_letter(uuid, text, text) RENAME TO acknowledge_dead_letter_any_tenant;
ALTER FUNCTION {{.schema}}.cancel_pending(uuid, text, text) RENAME TO cancel_pending_any_tenant;

-- The who-and-why check comes first, as before: a refusal for a missing
-- reason does not depend on the id.
CREATE FUNCTION {{.schema}}.replay_dead_letter(p_outbox_id uuid, p_operator text, p_reason text) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
  PERFORM {{.schema}}.operator_check(p_operator, p_reason);
  IF NOT {{.schema}}.tenant_in_scope((SELECT d.tenant_id FROM {{.schema}}.dead_letters d WHERE d.outbox_id = p_outbox_id)) THEN
    RETURN 0;
  END IF;
  RETURN {{.schema}}.replay_dead_letter_any_tenant(p_outbox_id, p_operator, p_reason);
END $fn$;

CREATE FUNCTION {{.schema}}.acknowledge_dead_letter(p_outbox_id uuid, p_operator text, p_reason text) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
  PERFORM {{.schema}}.operator_check(p_operator, p_reason);
  IF NOT {{.schema}}.tenant_in_scope((SELECT d.tenant_id FROM {{.schema}}.dead_letters d WHERE d.outbox_id = p_outbox_id)) THEN
    RETURN 0;
  END IF;
  RETURN {{.schema}}.acknowledge_dead_letter_any_tenant(p_outbox_id, p_operator, p_reason);
END $fn$;

-- SECURITY INVOKER until the roles are in place, as migration 020's.
CREATE FUNCTION {{.schema}}.cancel_pending(p_outbox_id uuid, p_operator text, p_reason text) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
  PERFORM {{.schema}}.operator_check(p_operator, p_reason);
  IF NOT {{.schema}}.tenant_in_scope((SELECT p.tenant_id FROM {{.schema}}.pending p WHERE p.outbox_id = p_outbox_id)) THEN
    RETURN 0;
  END IF;
  RETURN {{.schema}}.cancel_pending_any_tenant(p_outbox_id, p_operator, p_reason);
END $fn$;

-- Each front takes its function's standing: it runs as the owner where
-- that did (replay and acknowledge always; cancel once the roles are in
-- place), and whoever could execute the function (the operators, where
-- the roles are in place) can execute the front and no longer the
-- function, which is then for the owner alone. Default privileges (no
-- roles set up) stay the defaults on both.
DO $$
DECLARE
  f text;
  g text;
  inner_fn regprocedure;
BEGIN
  FOREACH f IN ARRAY ARRAY['replay_dead_letter', 'acknowledge_dead_letter', 'cancel_pending'] LOOP
    inner_fn := format('{{.schema}}.%I(uuid, text, text)', f || '_any_tenant')::regprocedure;
    IF (SELECT prosecdef FROM pg_proc WHERE oid = inner_fn) THEN
      EXECUTE format('ALTER FUNCTION {{.schema}}.%I(uuid, text, text) SECURITY DEFINER SET search_path = pg_catalog, pg_temp', f);
    END IF;
    IF (SELECT proacl IS NOT NULL FROM pg_proc WHERE oid = inner_fn) THEN
      EXECUTE format('REVOKE ALL ON FUNCTION {{.schema}}.%I(uuid, text, text) FROM PUBLIC', f);
      FOR g IN SELECT CASE a.grantee WHEN 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END
               FROM pg_proc p, aclexplode(p.proacl) a
               WHERE p.oid = inner_fn AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION {{.schema}}.%I(uuid, text, text) TO %s', f, g);
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM %s', inner_fn, g);
      END LOOP;
    END IF;
  END LOOP;
END $$;
