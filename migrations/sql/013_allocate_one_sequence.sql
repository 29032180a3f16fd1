-- allocate_sequence is allocate_sequences for one participant and one
-- instruction, the common enqueue (one instruction per business
-- transaction). Same row, same lock, same result.
--
-- allocate_sequences takes arrays, and PostgreSQL replans a query with an
-- array parameter on every call (a generic plan cannot know the array's
-- length, so the custom plan always looks cheaper): inside the function,
-- where the enqueue's own plan settings cannot reach, that planning was
-- about a fifth of a one-instruction enqueue's database processor time
-- (docs/architecture.md). With a scalar parameter the function's statement
-- keeps one generic plan.
CREATE FUNCTION {{.schema}}.allocate_sequence(p_participant_id text, OUT first_sequence_id bigint, OUT queued_before bigint)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  INSERT INTO {{.schema}}.sequences AS s (participant_id, next_sequence_id, queued)
  VALUES (p_participant_id, 2, 1)
  ON CONFLICT ON CONSTRAINT sequences_pkey DO UPDATE
    SET next_sequence_id = s.next_sequence_id + 1, queued = s.queued + 1
  RETURNING s.next_sequence_id - 1, s.queued - 1 INTO first_sequence_id, queued_before;
END $$;

-- Where the roles of `outbox migrate --create-roles` are in place (the
-- array form then runs as its owner), the new function gets the same
-- standing at once, so that producers, who may not touch sequences
-- themselves, can still enqueue after an upgrade that only migrated.
-- roles.sql says the same for fresh installs.
DO $$
DECLARE
  g regrole;
BEGIN
  IF (SELECT prosecdef FROM pg_proc WHERE oid = '{{.schema}}.allocate_sequences(text[], int[])'::regprocedure) THEN
    ALTER FUNCTION {{.schema}}.allocate_sequence(text) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
    REVOKE ALL ON FUNCTION {{.schema}}.allocate_sequence(text) FROM PUBLIC;
    FOR g IN SELECT a.grantee::regrole FROM pg_proc p, aclexplode(p.proacl) a
             WHERE p.oid = '{{.schema}}.allocate_sequences(text[], int[])'::regprocedure
               AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner LOOP
      EXECUTE format('GRANT EXECUTE ON FUNCTION {{.schema}}.allocate_sequence(text) TO %s', g);
    END LOOP;
  END IF;
END $$;
