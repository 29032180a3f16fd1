-- idempotency_keys is permanent, but every outbox starts with it empty,
-- and the producer's statements are planned then: a connection's cached
-- plans chose sequential scans (and hash joins over them) of the few pages
-- the table had, and kept them while it grew, until autovacuum's next
-- ANALYZE: every enqueue read the whole table (73 and 162 pages per call
-- at 7,500 keys, in `outbox bench enqueue`). Like pending and inflight
-- (005), the table starts at about 200 pages, where a lookup by key is the
-- cheaper plan whatever the number of rows, and keeps them. The rows
-- written here are deleted in the same transaction: nobody ever sees them,
-- and new keys reuse their space.
ALTER TABLE {{.schema}}.idempotency_keys SET (vacuum_truncate = false);
INSERT INTO {{.schema}}.idempotency_keys (tenant_id, instruction_id, idempotency_key, outbox_id, participant_id, payload_hash)
SELECT 'migration-006', 'migration-006-' || n, repeat('x', 100), gen_random_uuid(), 'migration-006', '\x00'
FROM generate_series(1, 8000) AS n;
DELETE FROM {{.schema}}.idempotency_keys WHERE tenant_id = 'migration-006';
