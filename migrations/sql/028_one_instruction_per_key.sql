-- An idempotency key belongs to one instruction id, per tenant.
--
-- The rails deduplicate by the key alone (the webhook's Idempotency-Key,
-- the sandbox's tenant and key): they never see the instruction id. Keyed
-- by (tenant, instruction id, key), the outbox accepted a second
-- instruction id under a key already used, gave it a fresh outbox id and
-- sequence, and dispatched it; the rail answered it as a repeat of the
-- first, with the first one's reference, and it was recorded DISPATCHED
-- without being paid. The key alone is now the identity: an enqueue that
-- reuses a key under another instruction id is refused
-- (pending.ErrIdempotencyMismatch), nothing written.
--
-- The unique index on (tenant_id, idempotency_key) becomes the primary
-- key, in place of (tenant_id, instruction_id, idempotency_key), which it
-- implies: the table keeps one unique index besides the outbox id's, and
-- an enqueue writes no more index entries than before. Lookups by the
-- three parts find the one row by the two.
--
-- Building the index locks enqueues out of the table while it reads it
-- (2.3 s for a million keys on the benchmark machine, busy). An index built beforehand with
--   CREATE UNIQUE INDEX CONCURRENTLY idempotency_keys_key_idx
--     ON <schema>.idempotency_keys (tenant_id, idempotency_key);
-- is used as it is (docs/operations.md, "028"); one a failed concurrent
-- build left invalid is built again.
--
-- A key two instruction ids already share stops the migration: nothing
-- changes, and the error counts them. Each is a payment the rail may have
-- answered as a repeat; docs/operations.md says how to list them.
DO $$
DECLARE
  shared bigint;
BEGIN
  IF EXISTS (SELECT 1 FROM pg_catalog.pg_index i
             WHERE i.indexrelid = to_regclass('{{.schema}}.idempotency_keys_key_idx') AND NOT i.indisvalid) THEN
    DROP INDEX {{.schema}}.idempotency_keys_key_idx;
  END IF;
  BEGIN
    CREATE UNIQUE INDEX IF NOT EXISTS idempotency_keys_key_idx ON {{.schema}}.idempotency_keys (tenant_id, idempotency_key);
  EXCEPTION WHEN unique_violation THEN
    SELECT count(*) INTO shared FROM (
      SELECT 1 FROM {{.schema}}.idempotency_keys GROUP BY tenant_id, idempotency_key HAVING count(*) > 1) x;
    RAISE EXCEPTION '% idempotency key(s) of {{.schema}} are each shared by more than one instruction id', shared
      USING ERRCODE = 'unique_violation',
            DETAIL = 'A rail deduplicates by the key alone: it may have answered the later instructions as repeats of the first, recorded as dispatched without being paid.',
            HINT = 'List them with: SELECT tenant_id, idempotency_key, array_agg(instruction_id ORDER BY created_at) FROM {{.schema}}.idempotency_keys GROUP BY 1, 2 HAVING count(*) > 1; reconcile each with its rail (docs/operations.md, "028").';
  END;
END $$;

ALTER TABLE {{.schema}}.idempotency_keys
  DROP CONSTRAINT idempotency_keys_pkey,
  ADD CONSTRAINT idempotency_keys_pkey PRIMARY KEY USING INDEX idempotency_keys_key_idx;
