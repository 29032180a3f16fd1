-- Two operators' reads through an index, migration 049.
--
-- pending_rail_outbox_idx: the console's and the API's list of pending
-- instructions filtered by rail (?rail=) is in outbox id order, a page at
-- a time. Without an index by rail in that order each page walked the
-- primary key and sifted out the other rails' rows until it had a page:
-- a rail of 10 instructions among 1,000,000 pending read all 1,000,000
-- (31,537 buffers, a generic plan's or not), and so did every misspelt
-- rail. Through this index a page reads its rows. Every enqueue, retry
-- and requeue writes one index entry more (docs/operations.md, "Upgrading",
-- 049, has what it costs).
--
-- rail_pause_events_at_idx: `outbox rails list`'s history and the
-- console's rails page list the newest pauses and resumes; without an
-- index by time each listing read and sorted every event ever recorded.
-- Pauses are rare writes.
--
-- Building pending_rail_outbox_idx takes a lock that makes enqueues,
-- claims and outcome writes wait for the build (one pass over pending:
-- about a second per million rows). To build them beforehand without that
-- wait:
--   CREATE INDEX CONCURRENTLY pending_rail_outbox_idx ON outbox.pending (rail_type, outbox_id);
--   CREATE INDEX CONCURRENTLY rail_pause_events_at_idx ON outbox.rail_pause_events (at, event_id);
-- the migration then finds them in place. As 046 does for the dead
-- letters' indexes: one that a concurrent build left invalid is dropped
-- and built again, and one of that name defined otherwise stops the
-- migration, changing nothing, with the statement to build it right.
DO $$
DECLARE
  want record;
  idx oid;
BEGIN
  FOR want IN
    SELECT * FROM (VALUES
      ('pending_rail_outbox_idx', 'pending', '(rail_type, outbox_id)'),
      ('rail_pause_events_at_idx', 'rail_pause_events', '(at, event_id)')
    ) AS w(name, tab, columns)
  LOOP
    idx := pg_catalog.to_regclass('{{.schema}}.' || want.name);
    IF idx IS NOT NULL AND EXISTS (SELECT 1 FROM pg_catalog.pg_index i WHERE i.indexrelid = idx AND NOT i.indisvalid) THEN
      EXECUTE pg_catalog.format('DROP INDEX {{.schema}}.%I', want.name);
      idx := NULL;
    ELSIF idx IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM pg_catalog.pg_index i
        WHERE i.indexrelid = idx AND i.indrelid = pg_catalog.to_regclass('{{.schema}}.' || want.tab) AND NOT i.indisunique
          AND i.indpred IS NULL
          AND pg_catalog.pg_get_indexdef(idx) LIKE '% USING btree ' || want.columns) THEN
      RAISE EXCEPTION 'index {{.schema}}.% exists but is not the index on % %', want.name, want.tab, want.columns
        USING ERRCODE = 'object_not_in_prerequisite_state',
              DETAIL = pg_catalog.pg_get_indexdef(idx),
              HINT = pg_catalog.format('Drop it, or build it as: CREATE INDEX CONCURRENTLY %I ON {{.schema}}.%I %s; (docs/operations.md, "049").',
                                       want.name, want.tab, want.columns);
    END IF;
    IF idx IS NULL THEN
      EXECUTE pg_catalog.format('CREATE INDEX %I ON {{.schema}}.%I %s', want.name, want.tab, want.columns);
    END IF;
  END LOOP;
END $$;
