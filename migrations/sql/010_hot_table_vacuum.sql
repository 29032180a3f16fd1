-- The hot tables churn: every instruction is inserted into pending, moved
-- to inflight and deleted from it, and its participant's sequence row is
-- updated twice. A 90-second soak at 1,000/s (`outbox bench soak`) with
-- the default settings let 63,000 dead tuples pile up in each of pending
-- and inflight before autovacuum's first visit (the default scale factor
-- waits for 20% of a table that is mostly dead space), growing them 4x
-- and their indexes with them. Vacuum them by absolute count instead,
-- without the cost-based sleeps meant to spare big tables (these are
-- small: a pass takes milliseconds), so each autovacuum visit (every
-- autovacuum_naptime; docs/operations.md recommends 10 s) finds them due
-- and their space is reused instead of extended.
ALTER TABLE {{.schema}}.pending SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 2000,
                                     autovacuum_vacuum_cost_delay = 0);
ALTER TABLE {{.schema}}.inflight SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 2000,
                                      autovacuum_vacuum_cost_delay = 0);
-- One row per participant, updated by every enqueue and every outcome:
-- room on each page keeps those updates HOT (no index entries, pruned on
-- the page) and the table at its size.
ALTER TABLE {{.schema}}.sequences SET (fillfactor = 50, autovacuum_vacuum_scale_factor = 0,
                                       autovacuum_vacuum_threshold = 2000, autovacuum_vacuum_cost_delay = 0);
