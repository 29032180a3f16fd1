-- The rows of write.sql in two statements instead of four: the
-- participants' locks, then one statement that records the outcomes,
-- claims each freed participant's next instruction and archives both
-- kinds of row in one insert with one hash expression. The successors are
-- found through an array of the deleted in-flight rows' participants, so
-- every delete is done before the insert the one-in-flight index checks.
-- Measured against write.sql in docs/performance.md ("What the statements
-- cost beyond their rows"). Run after schema.sql, one client:
--   pgbench -n -M prepared -c 1 -t 4000 -f write-merged.sql -D "parts={p0,p1,p2,p3,p4,p5,p6,p7,p8,p9}"
\startpipeline
BEGIN;
SELECT 1 FROM sequences WHERE participant_id = ANY(:parts::text[]) ORDER BY participant_id FOR UPDATE;
WITH done AS (DELETE FROM inflight WHERE participant_id = ANY(:parts::text[]) RETURNING *, clock_timestamp() AS at),
fin AS (UPDATE sequences SET queued = queued - 1 WHERE participant_id = ANY(:parts::text[])),
heads AS (SELECT h.row FROM unnest(ARRAY(SELECT participant_id FROM done)) u(pid) CROSS JOIN LATERAL (SELECT ctid AS row FROM pending p WHERE p.participant_id = u.pid ORDER BY sequence_id LIMIT 1) h),
taken AS (DELETE FROM pending WHERE ctid = ANY (ARRAY(SELECT row FROM heads)) RETURNING *, gen_random_uuid() AS aid, clock_timestamp() AS at),
rowsv AS (
  SELECT gen_random_uuid() AS attempt_id, outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type, tenant_id, correlation_id, NULL::jsonb AS payload,
    attempt_no, 'DISPATCHED'::text AS state, relayer_id, attempt_id AS claim_attempt_id, claimed_at, now() AS completed_at, 'ref'::text AS rail_reference, 'ok'::text AS rail_code, 1 AS latency_ms, at, chain_head
  FROM done
  UNION ALL
  SELECT aid, outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type, tenant_id, correlation_id, payload,
    attempt_count + 1, 'DISPATCHING', 'r', NULL, now(), NULL, NULL, NULL, NULL, at, chain_head
  FROM taken),
stamped AS (SELECT v.*, sha256(coalesce(chain_head, ''::bytea) || record_send(ROW(attempt_id, outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type, tenant_id, correlation_id, payload, attempt_no, state, relayer_id, claim_attempt_id, claimed_at, completed_at, rail_reference, rail_code, latency_ms, at))) AS hash FROM rowsv v),
claimed AS (INSERT INTO inflight SELECT outbox_id, attempt_id, attempt_no, 'r', true, now(), now() + interval '1 minute', instruction_id, participant_id, sequence_id,
  idempotency_key, rail_type, tenant_id, correlation_id, payload, now(), 0, hash
  FROM stamped WHERE state = 'DISPATCHING')
INSERT INTO archive (attempt_id, outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type, tenant_id, correlation_id, payload,
  attempt_no, state, relayer_id, claim_attempt_id, claimed_at, completed_at, rail_reference, rail_code, latency_ms, created_at, prev_hash, hash)
SELECT attempt_id, outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type, tenant_id, correlation_id, payload,
  attempt_no, state, relayer_id, claim_attempt_id, claimed_at, completed_at, rail_reference, rail_code, latency_ms, at, chain_head, hash FROM stamped;
COMMIT;
\endpipeline
