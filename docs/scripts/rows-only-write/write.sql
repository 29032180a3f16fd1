-- The rows a hand-off write of ten writes, and nothing else (run after
-- schema.sql, one client):
--   pgbench -n -M prepared -c 1 -t 4000 -f write.sql -D "parts={p0,p1,p2,p3,p4,p5,p6,p7,p8,p9}"
\startpipeline
BEGIN;
SELECT 1 FROM sequences WHERE participant_id = ANY(:parts::text[]) ORDER BY participant_id FOR UPDATE;
WITH done AS (DELETE FROM inflight WHERE participant_id = ANY(:parts::text[]) RETURNING *, clock_timestamp() AS at)
INSERT INTO archive (attempt_id, outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type, tenant_id, correlation_id,
  attempt_no, state, relayer_id, claim_attempt_id, claimed_at, completed_at, rail_reference, rail_code, latency_ms, created_at, prev_hash, hash)
SELECT gen_random_uuid(), outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type, tenant_id, correlation_id,
  attempt_no, 'DISPATCHED', relayer_id, attempt_id, claimed_at, now(), 'ref', 'ok', 1, at, chain_head,
  sha256(coalesce(chain_head, ''::bytea) || record_send(ROW(outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type, tenant_id, correlation_id, attempt_no, 'DISPATCHED', relayer_id, attempt_id, claimed_at, now(), 'ref', 'ok', 1, at)))
FROM done;
UPDATE sequences SET queued = queued - 1 WHERE participant_id = ANY(:parts::text[]);
WITH heads AS (SELECT h.row FROM unnest(:parts::text[]) u(pid) CROSS JOIN LATERAL (SELECT ctid AS row FROM pending p WHERE p.participant_id = u.pid ORDER BY sequence_id LIMIT 1) h),
taken AS (DELETE FROM pending WHERE ctid = ANY (ARRAY(SELECT row FROM heads)) RETURNING *, gen_random_uuid() AS aid, clock_timestamp() AS at),
claimed AS (INSERT INTO inflight SELECT outbox_id, aid, attempt_count + 1, 'r', true, now(), now() + interval '1 minute', instruction_id, participant_id, sequence_id,
  idempotency_key, rail_type, tenant_id, correlation_id, payload, created_at, zombie_count,
  sha256(coalesce(chain_head, ''::bytea) || record_send(ROW(aid, outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type, tenant_id, correlation_id, payload, attempt_count + 1, 'DISPATCHING', now(), at)))
  FROM taken RETURNING *)
INSERT INTO archive (attempt_id, outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type, tenant_id, correlation_id, payload,
  attempt_no, state, relayer_id, claimed_at, created_at, hash)
SELECT attempt_id, outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type, tenant_id, correlation_id, payload,
  attempt_no, 'DISPATCHING', relayer_id, claimed_at, claimed_at, chain_head FROM claimed;
COMMIT;
\endpipeline
