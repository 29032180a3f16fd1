-- Dead letters' indexes by participant, valid, migration 046.
--
-- Migration 045 builds its two indexes on dead_letters with CREATE INDEX
-- IF NOT EXISTS, so that an operator can build them beforehand with
-- CREATE INDEX CONCURRENTLY and keep outcome writes running. But a
-- concurrent build that fails (a lock_timeout, a cancel, a lost session)
-- leaves an invalid index of that name, which IF NOT EXISTS then took as
-- it was: kept up by every dead letter written and read by no query, the
-- participant pages back to reading every dead letter. And an index of
-- that name defined otherwise was taken too. As 030 does for its index:
-- an invalid one is dropped and built again (holding dead_letters' writes
-- for the build, as 045 did), and one defined otherwise stops the
-- migration, changing nothing, with the statement to build it right.
DO $$
DECLARE
  want record;
  idx oid;
BEGIN
  FOR want IN
    SELECT * FROM (VALUES
      ('dead_letters_participant_idx', '(participant_id, failed_at, outbox_id)', ''),
      ('dead_letters_participant_open_idx', '(participant_id, failed_at, outbox_id)', ' WHERE (acknowledged_at IS NULL)')
    ) AS w(name, columns, predicate)
  LOOP
    idx := pg_catalog.to_regclass('{{.schema}}.' || want.name);
    IF idx IS NOT NULL AND EXISTS (SELECT 1 FROM pg_catalog.pg_index i WHERE i.indexrelid = idx AND NOT i.indisvalid) THEN
      EXECUTE pg_catalog.format('DROP INDEX {{.schema}}.%I', want.name);
      idx := NULL;
    ELSIF idx IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM pg_catalog.pg_index i
        WHERE i.indexrelid = idx AND i.indrelid = '{{.schema}}.dead_letters'::regclass AND NOT i.indisunique
          AND pg_catalog.pg_get_indexdef(idx) LIKE '% USING btree ' || want.columns || want.predicate) THEN
      RAISE EXCEPTION 'index {{.schema}}.% exists but is not the index on dead_letters % %', want.name, want.columns, want.predicate
        USING ERRCODE = 'object_not_in_prerequisite_state',
              DETAIL = pg_catalog.pg_get_indexdef(idx),
              HINT = pg_catalog.format('Drop it, or build it as: CREATE INDEX CONCURRENTLY %I ON {{.schema}}.dead_letters %s%s; (docs/operations.md, "045").',
                                       want.name, want.columns, want.predicate);
    END IF;
    IF idx IS NULL THEN
      EXECUTE pg_catalog.format('CREATE INDEX %I ON {{.schema}}.dead_letters %s%s', want.name, want.columns, want.predicate);
    END IF;
  END LOOP;
END $$;
