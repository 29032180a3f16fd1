-- archived_claim reads a claim's DISPATCHING row by its attempt id: what a
-- late outcome's archive row repeats of its claim (the instruction's
-- identity, the attempt number, the relayer, when it was claimed) and the
-- row's hash, which the late row follows in the instruction's chain.
--
-- The outcome statement (record.go) calls it for the outcomes whose
-- in-flight row was gone. An outcome recorded on time takes all of that
-- from its in-flight row, so relayers send only what the rail answered,
-- not the identity that row already holds (nine arrays fewer in every
-- outcome write; docs/architecture.md, "What a write sends").
--
-- It reads the attached partitions from p_since on (by primary key, as
-- archived_attempt does), then the detached months: a relayer cut off
-- from the database across a month's end may record an outcome whose
-- claim an operator has detached since. roles.sql runs it as the owner,
-- because relayers do not read the detached months otherwise; it returns
-- the one claim asked for.
--
-- A claim's DISPATCHING row commits before its rail is called, and the
-- archive is append-only, so a missing row means archive rows were
-- removed: it fails (data_corrupted) rather than archive an outcome that
-- no longer follows its claim, which `outbox audit verify` would report
-- as a broken chain.
CREATE FUNCTION {{.schema}}.archived_claim(p_attempt_id uuid, p_since timestamptz)
RETURNS TABLE (instruction_id text, participant_id text, sequence_id bigint, idempotency_key text, rail_type text,
               tenant_id text, correlation_id text, attempt_no int, relayer_id text, claimed_at timestamptz,
               hash bytea)
LANGUAGE plpgsql STABLE AS $$
BEGIN
  RETURN QUERY
    SELECT a.instruction_id, a.participant_id, a.sequence_id, a.idempotency_key, a.rail_type, a.tenant_id,
           a.correlation_id, a.attempt_no, a.relayer_id, a.claimed_at, a.hash
    FROM {{.schema}}.attempts a
    WHERE a.attempt_id = p_attempt_id AND a.created_at >= p_since AND a.state = 'DISPATCHING'
    LIMIT 1;
  IF FOUND THEN
    RETURN;
  END IF;
  RETURN QUERY
    SELECT a.instruction_id, a.participant_id, a.sequence_id, a.idempotency_key, a.rail_type, a.tenant_id,
           a.correlation_id, a.attempt_no, a.relayer_id, a.claimed_at, a.hash
    FROM {{.schema}}.attempts_detached a
    WHERE a.attempt_id = p_attempt_id AND a.created_at >= p_since AND a.state = 'DISPATCHING'
    LIMIT 1;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'outbox: claim % has no DISPATCHING row in the archive', p_attempt_id
      USING ERRCODE = 'data_corrupted',
            HINT = 'archive rows were removed; outbox audit verify reports which';
  END IF;
END $$;

-- Where the roles are in place (partition upkeep then runs as its owner),
-- the new function gets the same standing at once, for the roles that may
-- run partition upkeep (the relayers). roles.sql says the same for fresh
-- installs.
DO $$
DECLARE
  g regrole;
BEGIN
  IF (SELECT prosecdef FROM pg_proc WHERE oid = '{{.schema}}.ensure_attempt_partitions(int)'::regprocedure) THEN
    ALTER FUNCTION {{.schema}}.archived_claim(uuid, timestamptz) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
    REVOKE ALL ON FUNCTION {{.schema}}.archived_claim(uuid, timestamptz) FROM PUBLIC;
    FOR g IN SELECT a.grantee::regrole FROM pg_proc p, aclexplode(p.proacl) a
             WHERE p.oid = '{{.schema}}.ensure_attempt_partitions(int)'::regprocedure
               AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner LOOP
      EXECUTE format('GRANT EXECUTE ON FUNCTION {{.schema}}.archived_claim(uuid, timestamptz) TO %s', g);
    END LOOP;
  END IF;
END $$;
