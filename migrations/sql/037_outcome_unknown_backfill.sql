-- Outcome unknown, marked again from the whole archive, migration 037.
--
-- Migration 032 marked the dead letters, in-flight and pending rows of
-- which an earlier attempt may have reached the rail, from the archive,
-- and missed two kinds:
-- - an attempt a relayer's stop cut off (CUT_OFF_AT_STOP: the rail may
--   still have been acting on it; the relayer counts it outcome unknown,
--   032's list of codes did not), and
-- - an attempt in a month `outbox archive detach` had moved (032 read the
--   attached months only): a dead letter left unacknowledged for months.
-- Such an instruction stayed unmarked, and operators read it as one the
-- rail certainly did not act on. Since 032 every claim, requeue and
-- outcome carries the mark forward, so only what 032 left unmarked can be
-- missing it: these are 032's statements over the whole archive (the
-- archive view: attached and detached months) with the relayer's whole
-- list of codes, for the rows not marked yet. One index probe per month
-- by outbox_id per such row (a detached month keeps the indexes it had).
UPDATE {{.schema}}.dead_letters d SET outcome_unknown = true
WHERE NOT d.outcome_unknown AND EXISTS (
  SELECT 1 FROM {{.schema}}.archive a
  WHERE a.outbox_id = d.outbox_id
    AND a.error_code IN ('RAIL_TIMEOUT', 'RAIL_TRANSPORT_ERROR', 'RAIL_UPSTREAM_ERROR', 'UNKNOWN_RAIL_CODE', 'CUT_OFF_AT_STOP',
                         'ZOMBIE_REQUEUE', 'ZOMBIE_LIMIT'));
UPDATE {{.schema}}.inflight f SET outcome_unknown = true
WHERE NOT f.outcome_unknown AND EXISTS (
  SELECT 1 FROM {{.schema}}.archive a
  WHERE a.outbox_id = f.outbox_id
    AND a.error_code IN ('RAIL_TIMEOUT', 'RAIL_TRANSPORT_ERROR', 'RAIL_UPSTREAM_ERROR', 'UNKNOWN_RAIL_CODE', 'CUT_OFF_AT_STOP',
                         'ZOMBIE_REQUEUE', 'ZOMBIE_LIMIT'));
-- As in 032, the requeue of a copy's own abandoned claim is not counted:
-- that claim's next claim marks it.
UPDATE {{.schema}}.pending p SET outcome_unknown = true
WHERE NOT p.outcome_unknown AND p.chain_head IS NOT NULL AND EXISTS (
  SELECT 1 FROM {{.schema}}.archive a
  WHERE a.outbox_id = p.outbox_id
    AND a.error_code IN ('RAIL_TIMEOUT', 'RAIL_TRANSPORT_ERROR', 'RAIL_UPSTREAM_ERROR', 'UNKNOWN_RAIL_CODE', 'CUT_OFF_AT_STOP',
                         'ZOMBIE_REQUEUE', 'ZOMBIE_LIMIT')
    AND (p.zombie_attempt_id IS NULL OR a.claim_attempt_id IS DISTINCT FROM p.zombie_attempt_id));
