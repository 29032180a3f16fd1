-- bump_sequence (one id for one participant) has no caller: an enqueue
-- allocates through bump_sequences inside its own statement, only for
-- instructions it actually inserts. A function that hands out a sequence
-- id with no instruction behind it can only break gap-free sequences.
DROP FUNCTION {{.schema}}.bump_sequence(text);
