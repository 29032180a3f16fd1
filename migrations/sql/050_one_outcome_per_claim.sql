-- One claim, one outcome: a late outcome of a claim that has one already is
-- absorbed, migration 050.
--
-- The outcome statement for late and resent outcomes (recordLateSQL in
-- internal/store/record.go) asked archived_attempt (012, 029) only whether
-- that outcome's own id was archived (a resend after a lost commit reply).
-- A second outcome of the same claim under another outcome id was archived
-- as late beside the first, and `outbox audit verify` reported the claim
-- ("every claim closed once"): two writers of late outcomes of one claim,
-- or a late one after the claim's on-time outcome, each found nothing of
-- the other in its snapshot. The statement now asks late_outcome_prior
-- instead, which answers late as archived_attempt does for a resend, and
-- otherwise absorbed: whether a row other than the reaper's (a
-- ZOMBIE_REQUEUE, or a poison instruction's FAILED ZOMBIE_LIMIT, after
-- which one late outcome is legitimate) closes the claim already, an
-- outcome recorded on time or late. An absorbed outcome is not archived;
-- the statement reports it so (Recorded.Absorbed), and it withdraws no
-- requeued copy.
--
-- Two writers cannot both miss the other: before it looks, the function
-- locks the claim's participant's sequences row (FOR UPDATE), which the
-- writer that archived the other outcome held until its commit (the
-- relayer's late writes lock their participants first, in participant
-- order, ordering on or off; an on-time outcome's write removed the
-- in-flight row, on which a late writer that saw it waited), and it is
-- VOLATILE, so under READ COMMITTED its reads see what committed while it
-- waited. The row is the one every outcome write with ordering on, every
-- producer, replay and cancel of the participant takes already; nothing
-- new is locked, and the fenced outcome statement, the common one, does
-- not call it. (A caller's REPEATABLE READ or SERIALIZABLE transaction
-- reads its own snapshot: there a late outcome that committed after that
-- snapshot is not seen.) A claim whose DISPATCHING row is in a detached
-- month locks nothing, and an outcome in a detached month is not looked
-- for: the first outcome lands in the months from its claim on.
--
-- It runs with its caller's privileges: relayers read the archive, lock a
-- participant's row (UPDATE of queued), and execute archived_attempt.
CREATE FUNCTION {{.schema}}.late_outcome_prior(p_attempt_id uuid, p_claim_attempt_id uuid, p_outbox_id uuid,
                                               p_since timestamptz, OUT late boolean, OUT absorbed boolean)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  participant text;
BEGIN
  absorbed := false;
  late := ({{.schema}}.archived_attempt(p_attempt_id, p_since)).late;
  IF late IS NOT NULL THEN
    RETURN; -- a resend
  END IF;
  SELECT a.participant_id INTO participant FROM {{.schema}}.attempts a
  WHERE a.attempt_id = p_claim_attempt_id AND a.created_at >= p_since AND a.state = 'DISPATCHING'
  LIMIT 1;
  PERFORM 1 FROM {{.schema}}.sequences s WHERE s.participant_id = participant FOR UPDATE;
  -- Again, after the lock: a resend whose first write committed meanwhile.
  late := ({{.schema}}.archived_attempt(p_attempt_id, p_since)).late;
  IF late IS NOT NULL THEN
    RETURN;
  END IF;
  absorbed := EXISTS (
    SELECT 1 FROM {{.schema}}.attempts a
    WHERE a.outbox_id = p_outbox_id AND a.created_at >= p_since AND a.claim_attempt_id = p_claim_attempt_id
      AND a.state <> 'DISPATCHING'
      AND (a.late OR NOT (a.state = 'ZOMBIE_REQUEUE' OR a.state = 'FAILED' AND a.error_code = 'ZOMBIE_LIMIT')));
END $$;
