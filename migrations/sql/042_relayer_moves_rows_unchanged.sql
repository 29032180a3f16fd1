-- A relayer moves an instruction between the queue's tables but never
-- changes what it says, migration 042.
--
-- Relayers held UPDATE on every column of pending and inflight, and
-- INSERT on both and on dead_letters with a policy that let them write
-- any row (the roles script's outbox_relayer_all). So a relayer
-- credential, leaked without the relayer's rail secrets, could change a
-- queued instruction (its payload: amount, currency, destination; its
-- participant, sequence, key, rail), in place or by deleting and
-- inserting it again, and the relayers would send what it said; a dead
-- letter so changed would be sent by the next replay. What a relayer
-- actually does: move a row from pending to inflight (a claim, a hand-off),
-- back from inflight to pending (a retry, a release, the reaper's
-- requeue), or to dead_letters (a failure, the reaper's poison
-- instruction, a late failure's withdrawn copy), in one statement that
-- deletes the row it moves; and change when a pending row is due.
--
-- - UPDATE on pending is now next_attempt_at and retry_at alone, and on
--   inflight lease_until alone (the reaper's row locks, FOR UPDATE, need
--   UPDATE on some column; no relayer statement updates inflight).
-- - Three restrictive policies refuse a relayer's insert (42501) unless
--   the row it moves from says the same: an inflight row needs a pending
--   row of its outbox id, a pending row an inflight row, a dead letter
--   either, with the same instruction id, participant, sequence, key,
--   rail, tenant, correlation id, payload and first enqueue. The relayers'
--   statements delete that row in the same statement, and every part of a
--   statement sees the rows as they were when it began, so the check
--   finds it. Each costs the insert one look-up by primary key of the
--   table the row comes from.
-- Where the roles are in place (the relayers' policy exists) the owner
-- does this here; the roles script (`outbox migrate --create-roles`) does
-- it otherwise, and again.
DO $$
BEGIN
  IF EXISTS (SELECT 1 FROM pg_policies p
             WHERE p.schemaname = '{{.schema}}' AND p.tablename = 'pending' AND p.policyname = 'outbox_relayer_all') THEN
    REVOKE UPDATE ON {{.schema}}.pending, {{.schema}}.inflight FROM outbox_relayer;
    GRANT UPDATE (next_attempt_at, retry_at) ON {{.schema}}.pending TO outbox_relayer;
    GRANT UPDATE (lease_until) ON {{.schema}}.inflight TO outbox_relayer;
    DROP POLICY IF EXISTS outbox_relayer_from_inflight ON {{.schema}}.pending;
    CREATE POLICY outbox_relayer_from_inflight ON {{.schema}}.pending AS RESTRICTIVE FOR INSERT TO outbox_relayer
      WITH CHECK (EXISTS (SELECT 1 FROM {{.schema}}.inflight f
                          WHERE f.outbox_id = pending.outbox_id
                            AND (f.instruction_id, f.participant_id, f.sequence_id, f.idempotency_key, f.rail_type, f.payload, f.created_at)
                              = (pending.instruction_id, pending.participant_id, pending.sequence_id, pending.idempotency_key, pending.rail_type, pending.payload, pending.created_at)
                            AND f.tenant_id IS NOT DISTINCT FROM pending.tenant_id
                            AND f.correlation_id IS NOT DISTINCT FROM pending.correlation_id));
    DROP POLICY IF EXISTS outbox_relayer_from_pending ON {{.schema}}.inflight;
    CREATE POLICY outbox_relayer_from_pending ON {{.schema}}.inflight AS RESTRICTIVE FOR INSERT TO outbox_relayer
      WITH CHECK (EXISTS (SELECT 1 FROM {{.schema}}.pending p
                          WHERE p.outbox_id = inflight.outbox_id
                            AND (p.instruction_id, p.participant_id, p.sequence_id, p.idempotency_key, p.rail_type, p.payload, p.created_at)
                              = (inflight.instruction_id, inflight.participant_id, inflight.sequence_id, inflight.idempotency_key, inflight.rail_type, inflight.payload, inflight.created_at)
                            AND p.tenant_id IS NOT DISTINCT FROM inflight.tenant_id
                            AND p.correlation_id IS NOT DISTINCT FROM inflight.correlation_id));
    DROP POLICY IF EXISTS outbox_relayer_from_queue ON {{.schema}}.dead_letters;
    CREATE POLICY outbox_relayer_from_queue ON {{.schema}}.dead_letters AS RESTRICTIVE FOR INSERT TO outbox_relayer
      WITH CHECK (EXISTS (SELECT 1 FROM {{.schema}}.inflight f
                          WHERE f.outbox_id = dead_letters.outbox_id
                            AND (f.instruction_id, f.participant_id, f.sequence_id, f.idempotency_key, f.rail_type, f.payload, f.created_at)
                              = (dead_letters.instruction_id, dead_letters.participant_id, dead_letters.sequence_id, dead_letters.idempotency_key, dead_letters.rail_type, dead_letters.payload, dead_letters.created_at)
                            AND f.tenant_id IS NOT DISTINCT FROM dead_letters.tenant_id
                            AND f.correlation_id IS NOT DISTINCT FROM dead_letters.correlation_id)
               OR EXISTS (SELECT 1 FROM {{.schema}}.pending p
                          WHERE p.outbox_id = dead_letters.outbox_id
                            AND (p.instruction_id, p.participant_id, p.sequence_id, p.idempotency_key, p.rail_type, p.payload, p.created_at)
                              = (dead_letters.instruction_id, dead_letters.participant_id, dead_letters.sequence_id, dead_letters.idempotency_key, dead_letters.rail_type, dead_letters.payload, dead_letters.created_at)
                            AND p.tenant_id IS NOT DISTINCT FROM dead_letters.tenant_id
                            AND p.correlation_id IS NOT DISTINCT FROM dead_letters.correlation_id));
  END IF;
END $$;
