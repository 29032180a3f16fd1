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
