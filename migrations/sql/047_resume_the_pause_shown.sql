-- A resume acts only on the pause its operator was shown. resume_rail
-- (migration 019, as migration 035 left it) ends whatever pause the rail
-- has: a resume from a console page or an API read made before another
-- operator resumed that pause and paused the rail again ended the new
-- pause, made for a reason the resumer never saw. resume_rail_shown is
-- resume_rail (every line of migration 035's, the database role recorded)
-- for the pause of p_rail_type made at p_paused_at only (rail_pauses'
-- paused_at, as the pause's reader was shown it); it returns false, and
-- records nothing, when that pause is not in force (the caller reads
-- rail_pauses to tell "not paused" from "paused again"). resume_rail stays
-- as it is for the CLI, whose `rails resume` acts by name.
CREATE FUNCTION {{.schema}}.resume_rail_shown(p_rail_type text, p_paused_at timestamptz, p_operator text, p_reason text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
  PERFORM {{.schema}}.operator_check(p_operator, p_reason);
  DELETE FROM {{.schema}}.rail_pauses WHERE rail_type = p_rail_type AND paused_at = p_paused_at;
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  INSERT INTO {{.schema}}.rail_pause_events (rail_type, action, operator, reason, database_role)
  VALUES (p_rail_type, 'RESUMED', p_operator, p_reason, session_user);
  PERFORM pg_notify('outbox_pending', '');
  RETURN true;
END $fn$;

-- It stands as resume_rail does: where the roles are in place (migration
-- 019, roles.sql) it runs as the owner with resume_rail's search_path,
-- and only the roles that may run resume_rail may run it.
DO $m$
DECLARE
  g regrole;
BEGIN
  IF (SELECT prosecdef FROM pg_proc WHERE oid = '{{.schema}}.resume_rail(text, text, text)'::regprocedure) THEN
    ALTER FUNCTION {{.schema}}.resume_rail_shown(text, timestamptz, text, text) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
    REVOKE ALL ON FUNCTION {{.schema}}.resume_rail_shown(text, timestamptz, text, text) FROM PUBLIC;
    FOR g IN SELECT a.grantee::regrole FROM pg_proc p, aclexplode(p.proacl) a
             WHERE p.oid = '{{.schema}}.resume_rail(text, text, text)'::regprocedure
               AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner LOOP
      EXECUTE format('GRANT EXECUTE ON FUNCTION {{.schema}}.resume_rail_shown(text, timestamptz, text, text) TO %s', g);
    END LOOP;
  END IF;
END $m$;
