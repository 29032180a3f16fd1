-- An instruction id has one idempotency key, per tenant.
--
-- Migration 028 made a key name one instruction id; the reverse stayed
-- open: the same instruction id enqueued under a second key was a second
-- instruction, with its own outbox id and sequence, and since the rails
-- deduplicate by the key, a second payment of one instruction (a producer
-- that generates a new key when it retries pays twice). An enqueue of an
-- instruction id under a key other than its own is now refused
-- (pending.ErrInstructionIDReused), nothing written: the enqueue's
-- ON CONFLICT DO NOTHING, which names no index, arbitrates on this one too,
-- so a racing enqueue waits for the first and then writes nothing.
--
-- The unique index is on the instruction id and the tenant, instruction
-- id first, so that it also serves the trails' lookups by instruction id
-- alone (store.TrailByInstruction), and the index migration 005 built for
-- them, on instruction_id, goes: an enqueue writes as many index entries
-- as before. tenant_id is NOT NULL ('' for none), so no NULLS NOT DISTINCT
-- is needed. The tenant is indexed as the expression tenant_id || '' (the
-- same text, so the same uniqueness), not as the column: the enqueue's key
-- lookups, by tenant and key, could otherwise take this index and read all
-- of it for the tenant, and did: on a fresh schema, whose statistics say
-- the keys are empty (migration 006), it costs the same as the primary
-- key, and the newer index wins the tie
-- (store.TestEnqueueReadsKeysPerInstruction: 20,000 index entries read for
-- one enqueue). The lookups by instruction id and tenant name the
-- expression.
--
-- Building the index locks enqueues out of the table while it reads it.
-- An index built beforehand with
--   CREATE UNIQUE INDEX CONCURRENTLY idempotency_keys_instruction_key
--     ON <schema>.idempotency_keys (instruction_id, (tenant_id || ''));
-- is used as it is (docs/operations.md, "030"); one a failed concurrent
-- build left invalid is built again. One of that name defined otherwise
-- stops the migration, changing nothing: it would not be the constraint.
--
-- An instruction id that already has two keys stops the migration:
-- nothing changes, and the error counts them. Each may have been paid
-- once per key; docs/operations.md says how to list them.
DO $$
DECLARE
  idx oid := to_regclass('{{.schema}}.idempotency_keys_instruction_key');
  reused bigint;
BEGIN
  IF idx IS NOT NULL AND EXISTS (SELECT 1 FROM pg_catalog.pg_index i WHERE i.indexrelid = idx AND NOT i.indisvalid) THEN
    DROP INDEX {{.schema}}.idempotency_keys_instruction_key;
  ELSIF idx IS NOT NULL AND NOT EXISTS (
      SELECT 1 FROM pg_catalog.pg_index i
      WHERE i.indexrelid = idx AND i.indrelid = '{{.schema}}.idempotency_keys'::regclass AND i.indisunique
        AND pg_catalog.pg_get_indexdef(idx) LIKE '% USING btree (instruction_id, ((tenant_id || ''''::text)))') THEN
    RAISE EXCEPTION 'index {{.schema}}.idempotency_keys_instruction_key exists but is not the unique index on idempotency_keys (instruction_id, (tenant_id || ''''))'
      USING ERRCODE = 'object_not_in_prerequisite_state',
            DETAIL = pg_catalog.pg_get_indexdef(idx),
            HINT = 'Drop it, or build it as: CREATE UNIQUE INDEX CONCURRENTLY idempotency_keys_instruction_key ON {{.schema}}.idempotency_keys (instruction_id, (tenant_id || '''')); (docs/operations.md, "030").';
  END IF;
  BEGIN
    CREATE UNIQUE INDEX IF NOT EXISTS idempotency_keys_instruction_key ON {{.schema}}.idempotency_keys (instruction_id, (tenant_id || ''));
  EXCEPTION WHEN unique_violation THEN
    SELECT count(*) INTO reused FROM (
      SELECT 1 FROM {{.schema}}.idempotency_keys GROUP BY instruction_id, tenant_id HAVING count(*) > 1) x;
    RAISE EXCEPTION '% instruction id(s) of {{.schema}} are each enqueued under more than one idempotency key', reused
      USING ERRCODE = 'unique_violation',
            DETAIL = 'A rail deduplicates by the key: it may have paid such an instruction once per key.',
            HINT = 'List them with: SELECT tenant_id, instruction_id, array_agg(idempotency_key ORDER BY created_at), array_agg(outbox_id ORDER BY created_at) FROM {{.schema}}.idempotency_keys GROUP BY 1, 2 HAVING count(*) > 1; reconcile each with its rail (docs/operations.md, "030").';
  END;
END $$;

DROP INDEX IF EXISTS {{.schema}}.idempotency_keys_instruction_idx;
