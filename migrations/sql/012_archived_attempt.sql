-- archived_attempt reads one archive row by attempt id, in the partitions
-- from p_since on (NULLs when there is none). The outcome statement
-- (record.go) calls it for the outcomes whose in-flight row was gone: a
-- late outcome needs its claim's hash, a resent one how it was recorded.
--
-- It is a PL/pgSQL function, which the planner never inlines, so that its
-- query is planned, and the archive's partitions are locked, only when it
-- runs. Written into the outcome statement itself, the two reads made that
-- statement's plan hold every attached partition and its primary key
-- (their bound compares with a value of each row, so no partition is
-- pruned before execution): every outcome write locked and set up a scan
-- of all of them to read none, at a cost that grew with each month
-- attached (0.07 ms per write with 5 partitions, 0.4 ms with 39).
CREATE FUNCTION {{.schema}}.archived_attempt(p_attempt_id uuid, p_since timestamptz, OUT late boolean, OUT hash bytea)
LANGUAGE plpgsql STABLE AS $$
BEGIN
  SELECT a.late, a.hash INTO late, hash FROM {{.schema}}.attempts a
  WHERE a.attempt_id = p_attempt_id AND a.created_at >= p_since
  LIMIT 1;
END $$;
