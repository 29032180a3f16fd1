-- The sequence functions of 001, in PL/pgSQL. A SQL-language function that
-- cannot be inlined (these write) has its body planned again on every call,
-- that is on every enqueue; PL/pgSQL keeps the plan for the session.
-- Measured on a 2-core machine (pgbench, one client, BEGIN; bump; ROLLBACK,
-- three interleaved rounds): 22-32% less time per call, about 0.1 ms.
-- Behaviour is unchanged: same results, same locks in the same order.
-- Output column names are qualified or avoided below because in PL/pgSQL
-- they are also variables.

CREATE OR REPLACE FUNCTION {{.schema}}.bump_sequence(p_participant_id text) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  allocated bigint;
BEGIN
  INSERT INTO {{.schema}}.sequences AS s (participant_id, next_sequence_id)
  VALUES (p_participant_id, 2)
  ON CONFLICT ON CONSTRAINT sequences_pkey DO UPDATE SET next_sequence_id = s.next_sequence_id + 1
  RETURNING s.next_sequence_id - 1 INTO allocated;
  RETURN allocated;
END $$;

-- Rows are locked in participant order so concurrent batches cannot
-- deadlock on each other.
CREATE OR REPLACE FUNCTION {{.schema}}.bump_sequences(p_participant_ids text[], p_counts int[])
RETURNS TABLE (participant_id text, first_sequence_id bigint)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  RETURN QUERY
  WITH wanted AS (
    SELECT u.p, sum(u.n)::bigint AS n
    FROM unnest(p_participant_ids, p_counts) AS u(p, n)
    GROUP BY u.p
  ), bumped AS (
    INSERT INTO {{.schema}}.sequences AS s (participant_id, next_sequence_id)
    SELECT w.p, w.n + 1 FROM wanted w ORDER BY w.p
    ON CONFLICT ON CONSTRAINT sequences_pkey DO UPDATE SET next_sequence_id = s.next_sequence_id + excluded.next_sequence_id - 1
    RETURNING s.participant_id AS p, s.next_sequence_id AS next
  )
  SELECT b.p, b.next - w.n
  FROM bumped b JOIN wanted w USING (p);
END $$;
