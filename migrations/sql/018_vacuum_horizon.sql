-- vacuum_horizon names the oldest of what keeps PostgreSQL from removing
-- the dead row versions of this database's tables: a session whose
-- transaction (or snapshot) is old, a standby's feedback, a prepared
-- transaction, a replication slot. While one is held, every claim and
-- outcome leaves row versions behind in the hot tables that no vacuum can
-- remove, and each later statement walks past them: the relayers slow down
-- the longer it is held (docs/operations.md, "A held vacuum horizon").
--
-- It returns one row: the oldest holder (its columns NULL when there is
-- none) and sees_all, whether the role running it sees the details of
-- every role's sessions. Any role sees every session's pid, role and
-- snapshot; only its own role, a superuser and pg_read_all_stats see a
-- session's state, start, type and client. roles.sql makes this function
-- SECURITY DEFINER of outbox_owner, which it makes a member of
-- pg_read_all_stats, so the outbox's roles see the details without seeing
-- other sessions' queries.
--
-- Autovacuum workers hold a snapshot that vacuum itself ignores; they are
-- left out (when their type can be seen). Since PostgreSQL 14 a session
-- holds back only the tables of its own database; a standby's feedback and
-- a slot hold back every database.
CREATE FUNCTION {{.schema}}.vacuum_horizon()
RETURNS TABLE (kind text, holder text, role_name text, application text, client text, state text,
               xid_age bigint, since timestamptz, sees_all boolean)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
  SELECT h.kind, h.holder, h.role_name, h.application, h.client, h.state, h.xid_age, h.since,
         pg_has_role(current_user, 'pg_read_all_stats', 'USAGE')
  FROM (SELECT 1) one
  LEFT JOIN (
    SELECT CASE WHEN a.backend_type = 'walsender' THEN 'standby' ELSE 'session' END AS kind, a.pid::text AS holder,
           a.usename::text AS role_name, a.application_name AS application, host(a.client_addr) AS client, a.state,
           age(a.backend_xmin)::bigint AS xid_age, a.xact_start AS since
    FROM pg_stat_activity a
    WHERE a.backend_xmin IS NOT NULL AND a.pid <> pg_backend_pid()
      AND a.backend_type IS DISTINCT FROM 'autovacuum worker'
      AND (a.datname = current_database() OR a.backend_type = 'walsender')
    UNION ALL
    SELECT 'prepared transaction', p.gid, p.owner::text, NULL, NULL, NULL, age(p.transaction)::bigint, p.prepared
    FROM pg_prepared_xacts p
    WHERE p.database = current_database()
    UNION ALL
    SELECT 'replication slot', s.slot_name::text, NULL, NULL, NULL, CASE WHEN s.active THEN 'active' ELSE 'inactive' END,
           age(s.xmin)::bigint, NULL
    FROM pg_replication_slots s
    WHERE s.xmin IS NOT NULL
    ORDER BY xid_age DESC
    LIMIT 1
  ) h ON true
$fn$;

-- Where the roles are in place (partition upkeep then runs as its owner),
-- the new function gets its standing at once, for the roles that may read
-- the queue (its snapshot reports the horizon): relayers, auditors and
-- operators. It sees every session's details once its owner is a member
-- of pg_read_all_stats, which only a superuser can grant: roles.sql does
-- (outbox migrate --create-roles, again after this upgrade).
DO $$
DECLARE
  g regrole;
BEGIN
  IF (SELECT prosecdef FROM pg_proc WHERE oid = '{{.schema}}.ensure_attempt_partitions(int)'::regprocedure) THEN
    ALTER FUNCTION {{.schema}}.vacuum_horizon() SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
    REVOKE ALL ON FUNCTION {{.schema}}.vacuum_horizon() FROM PUBLIC;
    FOR g IN SELECT a.grantee::regrole FROM pg_class c, aclexplode(c.relacl) a
             WHERE c.oid = '{{.schema}}.inflight'::regclass
               AND a.privilege_type = 'SELECT' AND a.grantee <> 0 AND a.grantee <> c.relowner LOOP
      EXECUTE format('GRANT EXECUTE ON FUNCTION {{.schema}}.vacuum_horizon() TO %s', g);
    END LOOP;
  END IF;
END $$;
