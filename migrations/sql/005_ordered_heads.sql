-- Ordered dispatch whose cost does not grow with the number of
-- participants.
--
-- With ordering on, only the head of a participant (its lowest pending
-- sequence, with nothing of it in flight) may be claimed. Until now every
-- claim found the heads with a skip scan over all participants with
-- pending work. From here on the heads are kept: a pending row that is not
-- its participant's head waits with next_attempt_at = 'infinity', so the
-- claim is the plain due-index scan of the unordered case, O(batch).
--
-- Who keeps it: the producer makes a new row the head when its participant
-- has nothing pending or in flight (sequences.queued = 0 under the
-- participant's row lock, which the enqueue takes anyway); the outcome of
-- a head, when terminal, decrements queued under the same lock and hands
-- the participant's next row to dispatch (or makes it due), in a second
-- statement of the same transaction that sees every producer that
-- committed while it waited for the lock. A producer and an outcome of one
-- participant thus serialize on sequences, and neither can miss the other.

-- Whether ordering is on is a property of the data, not of a relayer: a
-- relayer that ignored it would break the heads for the others.
CREATE TABLE {{.schema}}.settings (
  one     boolean PRIMARY KEY DEFAULT true CHECK (one),
  ordered boolean NOT NULL
);
INSERT INTO {{.schema}}.settings (ordered) VALUES (true);

-- queued: the participant's instructions in pending or in flight. Kept
-- exactly with ordering on (producers add, terminal outcomes subtract);
-- with ordering off only producers add, and switching ordering on
-- recomputes it.
ALTER TABLE {{.schema}}.sequences ADD COLUMN queued bigint NOT NULL DEFAULT 0 CHECK (queued >= 0);
UPDATE {{.schema}}.sequences s SET queued = c.n
FROM (SELECT participant_id, count(*) AS n
      FROM (SELECT participant_id FROM {{.schema}}.pending
            UNION ALL SELECT participant_id FROM {{.schema}}.inflight) x
      GROUP BY participant_id) c
WHERE c.participant_id = s.participant_id;

-- Rows that are not their participant's head wait.
UPDATE {{.schema}}.pending p SET next_attempt_at = 'infinity'
WHERE EXISTS (SELECT 1 FROM {{.schema}}.inflight f WHERE f.participant_id = p.participant_id AND f.ordered)
   OR EXISTS (SELECT 1 FROM {{.schema}}.pending q WHERE q.participant_id = p.participant_id AND q.sequence_id < p.sequence_id);

-- allocate_sequences replaces bump_sequences: it also counts the new
-- instructions into queued and returns what queued was before, which tells
-- the enqueue whether the first new row is its participant's head. Rows are
-- locked in participant order so concurrent batches cannot deadlock.
CREATE FUNCTION {{.schema}}.allocate_sequences(p_participant_ids text[], p_counts int[])
RETURNS TABLE (participant_id text, first_sequence_id bigint, queued_before bigint)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  RETURN QUERY
  WITH wanted AS (
    SELECT u.p, sum(u.n)::bigint AS n
    FROM unnest(p_participant_ids, p_counts) AS u(p, n)
    GROUP BY u.p
  ), bumped AS (
    INSERT INTO {{.schema}}.sequences AS s (participant_id, next_sequence_id, queued)
    SELECT w.p, w.n + 1, w.n FROM wanted w ORDER BY w.p
    ON CONFLICT ON CONSTRAINT sequences_pkey DO UPDATE
      SET next_sequence_id = s.next_sequence_id + excluded.queued, queued = s.queued + excluded.queued
    RETURNING s.participant_id AS p, s.next_sequence_id AS next, s.queued AS q
  )
  SELECT b.p, b.next - w.n, b.q - w.n
  FROM bumped b JOIN wanted w USING (p);
END $$;
DROP FUNCTION {{.schema}}.bump_sequences(text[], int[]);

-- Indexes nothing reads any more, each one write per message: the ordered
-- claim no longer asks "does this participant have anything in flight"
-- (the unique partial index keeps enforcing one ordered row in flight), and
-- nothing looks archive rows up by age of DISPATCHING.
DROP INDEX {{.schema}}.inflight_participant_idx;
DROP INDEX {{.schema}}.attempts_dispatching_age_idx;

-- Trails by instruction id go through the idempotency keys (one index
-- entry per instruction) instead of an archive index keyed by a random
-- text (two entries per attempt, scattered over the index).
CREATE INDEX idempotency_keys_instruction_idx ON {{.schema}}.idempotency_keys (instruction_id);
DROP INDEX {{.schema}}.attempts_instruction_idx;

-- pending and inflight are queue tables: few live rows, and a dead one for
-- every claim and outcome until the next vacuum. The hot statements reach
-- them by key, a batch at a time, and their plans are cached per
-- connection. PostgreSQL plans from the table's size on disk: planned while
-- a table is a few pages, a statement keeps the sequential scan it chose
-- then, whose cost grows with the dead rows until a vacuum invalidates the
-- plan. So the two tables keep their size on disk (vacuum reuses the space
-- instead of giving it back), and start at about 200 pages, where a keyed
-- access is the cheaper plan whatever the number of live rows. The rows
-- written here are deleted in the same transaction: nobody ever sees them.
ALTER TABLE {{.schema}}.pending SET (vacuum_truncate = false);
ALTER TABLE {{.schema}}.inflight SET (vacuum_truncate = false);
INSERT INTO {{.schema}}.inflight (outbox_id, attempt_id, attempt_no, relayer_id, ordered, claimed_at, lease_until,
                                  instruction_id, participant_id, sequence_id, idempotency_key, rail_type, payload, created_at)
SELECT gen_random_uuid(), gen_random_uuid(), 1, 'migration-005', false, now(), now(),
       'migration-005', 'migration-005', n, 'migration-005', 'migration-005', jsonb_build_object('pad', repeat('x', 300)), now()
FROM generate_series(1, 4000) AS n;
DELETE FROM {{.schema}}.inflight WHERE relayer_id = 'migration-005';
INSERT INTO {{.schema}}.pending (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type, payload,
                                 next_attempt_at)
SELECT gen_random_uuid(), 'migration-005', 'migration-005', n, 'migration-005', 'migration-005',
       jsonb_build_object('pad', repeat('x', 300)), 'infinity'
FROM generate_series(1, 4000) AS n;
DELETE FROM {{.schema}}.pending WHERE instruction_id = 'migration-005';
