-- outcomes_not_fenced fails the outcome statement, and with it the outcome
-- write's transaction, when some of its outcomes no longer find the
-- in-flight row of their claim: late outcomes (the reaper requeued the
-- instruction, or another relayer holds it now) and resends of outcomes
-- already recorded (a commit whose reply was lost). The common outcome
-- statement has no plan for those, because PostgreSQL sets up every node
-- of a plan at each execution, run or not, and theirs was about a quarter
-- of it; the relayer writes such a batch again, whole, with the statement
-- that handles them (internal/store/record.go). n is how many.
CREATE FUNCTION {{.schema}}.outcomes_not_fenced(n bigint) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'outbox: % outcome(s) of this write no longer find the in-flight row of their claim (late, or recorded before)', n
    USING ERRCODE = 'OBLT1';
END $$;
