-- Dead letters by participant, migration 045.
--
-- A participant's dead letters (the console's participant page counts its
-- open ones; its link lists them, open or all, with their count) were
-- found through the indexes by failure time or a sequential scan, each
-- row filtered by participant: every view of one participant read every
-- open dead letter, or every dead letter, that failed before its own.
-- Acknowledged dead letters stay until their archive month is detached,
-- and a rail outage leaves tens of thousands at once. These indexes, in
-- the lists' order within a participant, read its rows alone: one of the
-- open dead letters (as dead_letters_open_idx is of everyone's), which
-- the planner prefers for the open list, and one of them all.
--
-- Building them takes a lock that makes outcome writes that dead-letter,
-- the reaper's poison cap, replays and acknowledgements wait for the
-- build (dead_letters is small beside the archive). To build them
-- beforehand without that wait:
--   CREATE INDEX CONCURRENTLY dead_letters_participant_idx
--     ON outbox.dead_letters (participant_id, failed_at, outbox_id);
--   CREATE INDEX CONCURRENTLY dead_letters_participant_open_idx
--     ON outbox.dead_letters (participant_id, failed_at, outbox_id) WHERE acknowledged_at IS NULL;
-- the migration then finds them in place.
CREATE INDEX IF NOT EXISTS dead_letters_participant_idx
  ON {{.schema}}.dead_letters (participant_id, failed_at, outbox_id);
CREATE INDEX IF NOT EXISTS dead_letters_participant_open_idx
  ON {{.schema}}.dead_letters (participant_id, failed_at, outbox_id) WHERE acknowledged_at IS NULL;
