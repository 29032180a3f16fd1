-- The due index leads with the rail type. Claims choose among the rails a
-- relayer may claim now: those it serves, less those whose breaker is open
-- and those an operator paused (migration 019). Read in (next_attempt_at,
-- created_at) order, the index put every due instruction of the other
-- rails in the way: a rail down for an hour, or paused, with producers
-- still enqueueing for it, left its backlog at the front of the index,
-- and every claim and hand-off refill of every other rail walked through
-- it (82 ms a claim past 300,000 of them, against 0.4 ms). Per rail, a
-- claim reads each claimable rail's due range from its start
-- (internal/store/claim.go, dueRows), whatever waits for the others.
-- The build locks pending against writes for as long as it takes: on a
-- queue of a few thousand rows, milliseconds.
CREATE INDEX pending_rail_due_idx ON {{.schema}}.pending (rail_type, next_attempt_at, created_at);
DROP INDEX {{.schema}}.pending_due_idx;
