-- archived_attempt (migration 012) tells the outcome statement whether an
-- outcome whose in-flight row is gone was archived already (a resend after
-- a lost commit reply) and how. It read the attached partitions only: a
-- relayer cut off from the database across a month's end that resent an
-- outcome after an operator detached that month found nothing, and the
-- outcome was archived a second time, as late (the same attempt id twice,
-- a claim closed twice: `outbox audit verify` reports both, and a
-- DISPATCHED one counts as paid twice). It now reads the detached months
-- too when the attached ones do not hold the row, as archived_claim
-- (migration 024) does for the claim, and like it runs as the owner where
-- the roles are in place: relayers do not read the detached months
-- otherwise. It returns one row's late flag and hash, nothing else.
DO $m$
DECLARE
  definer boolean := (SELECT prosecdef FROM pg_proc WHERE oid = '{{.schema}}.ensure_attempt_partitions(int)'::regprocedure);
  g regrole;
BEGIN
  CREATE OR REPLACE FUNCTION {{.schema}}.archived_attempt(p_attempt_id uuid, p_since timestamptz, OUT late boolean, OUT hash bytea)
  LANGUAGE plpgsql STABLE AS $fn$
  BEGIN
    SELECT a.late, a.hash INTO late, hash FROM {{.schema}}.attempts a
    WHERE a.attempt_id = p_attempt_id AND a.created_at >= p_since
    LIMIT 1;
    IF FOUND THEN
      RETURN;
    END IF;
    SELECT a.late, a.hash INTO late, hash FROM {{.schema}}.attempts_detached a
    WHERE a.attempt_id = p_attempt_id AND a.created_at >= p_since
    LIMIT 1;
  END $fn$;
  IF definer THEN
    ALTER FUNCTION {{.schema}}.archived_attempt(uuid, timestamptz) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
    REVOKE ALL ON FUNCTION {{.schema}}.archived_attempt(uuid, timestamptz) FROM PUBLIC;
    FOR g IN SELECT a.grantee::regrole FROM pg_proc p, aclexplode(p.proacl) a
             WHERE p.oid = '{{.schema}}.ensure_attempt_partitions(int)'::regprocedure
               AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner LOOP
      EXECUTE format('GRANT EXECUTE ON FUNCTION {{.schema}}.archived_attempt(uuid, timestamptz) TO %s', g);
    END LOOP;
  END IF;
END $m$;
