-- pending and inflight are vacuumed by absolute count since 001; the other
-- table every instruction churns is sequences: one row per participant,
-- updated by every enqueue and every outcome (next_sequence_id, queued).
-- A 10-minute soak at 1,000/s (`outbox bench soak`, docs/operations.md)
-- found what bounds all three is how often autovacuum visits
-- (autovacuum_naptime, a server setting: 10 s recommended), and that
-- sequences was left to the default 20% scale factor. Room on each page
-- keeps its updates HOT (no index entries, pruned on the page), and the
-- same count-based, sleep-free vacuum as the other hot tables keeps it at
-- its size.
ALTER TABLE {{.schema}}.sequences SET (fillfactor = 50, autovacuum_vacuum_scale_factor = 0,
                                       autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_cost_delay = 0);
