-- A late DISPATCHED outcome settles the dead letter the reaper made of a
-- poison instruction (ZOMBIE_LIMIT, outcome unknown): the rail did act, so
-- the instruction is dispatched, not dead. The relayer recording the
-- outcome deleted that dead letter itself, but the relayer role of
-- `outbox migrate --create-roles` may not delete dead letters, and the
-- statement carried the delete whether or not it had one to make: every
-- late terminal outcome failed to withdraw the reaper's requeued copy,
-- which was then dispatched again. The delete moves here, where it can
-- run as the owner and do only this: remove such a dead letter once the
-- archive holds the late DISPATCHED attempt that settles it.
CREATE FUNCTION {{.schema}}.settle_poison_dead_letters(p_outbox_ids uuid[]) RETURNS bigint
LANGUAGE sql VOLATILE AS $$
  WITH settled AS (
    DELETE FROM {{.schema}}.dead_letters d
    WHERE d.outbox_id = ANY (p_outbox_ids) AND d.error_code = 'ZOMBIE_LIMIT' AND d.outcome_unknown
      AND EXISTS (SELECT 1 FROM {{.schema}}.attempts a
                  WHERE a.outbox_id = d.outbox_id AND a.state = 'DISPATCHED' AND a.late
                    AND a.created_at >= pg_catalog.now() - interval '1 day')
    RETURNING 1
  )
  SELECT count(*) FROM settled
$$;

-- Where the roles are in place (partition upkeep then runs as its owner),
-- the new function gets the same standing at once, for the roles that may
-- run partition upkeep (the relayers). roles.sql says the same for fresh
-- installs.
DO $$
DECLARE
  g regrole;
BEGIN
  IF (SELECT prosecdef FROM pg_proc WHERE oid = '{{.schema}}.ensure_attempt_partitions(int)'::regprocedure) THEN
    ALTER FUNCTION {{.schema}}.settle_poison_dead_letters(uuid[]) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
    REVOKE ALL ON FUNCTION {{.schema}}.settle_poison_dead_letters(uuid[]) FROM PUBLIC;
    FOR g IN SELECT a.grantee::regrole FROM pg_proc p, aclexplode(p.proacl) a
             WHERE p.oid = '{{.schema}}.ensure_attempt_partitions(int)'::regprocedure
               AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner LOOP
      EXECUTE format('GRANT EXECUTE ON FUNCTION {{.schema}}.settle_poison_dead_letters(uuid[]) TO %s', g);
    END LOOP;
  END IF;
END $$;
