-- The tables of a hand-off write of ten over 10 participants, as the
-- engine has them (columns, indexes, monthly partitions of the archive),
-- each participant 5,000 instructions deep with its first in flight: see
-- docs/performance.md, "What the statements cost beyond their rows".
-- Run it in a scratch database; it drops and creates pending, inflight,
-- archive and sequences in the current schema.
DROP TABLE IF EXISTS pending, inflight, archive, sequences CASCADE;
CREATE TABLE pending (outbox_id uuid PRIMARY KEY, instruction_id text NOT NULL, participant_id text NOT NULL, sequence_id bigint NOT NULL,
  idempotency_key text NOT NULL, rail_type text NOT NULL, tenant_id text, correlation_id text, payload jsonb NOT NULL,
  attempt_count int NOT NULL DEFAULT 0, next_attempt_at timestamptz NOT NULL DEFAULT now(), created_at timestamptz NOT NULL DEFAULT now(),
  zombie_count int NOT NULL DEFAULT 0, chain_head bytea,
  UNIQUE (participant_id, sequence_id)) WITH (fillfactor = 90);
CREATE INDEX pending_rail_due ON pending (rail_type, next_attempt_at, created_at);
CREATE INDEX pending_suspects ON pending (next_attempt_at, created_at) WHERE zombie_count >= 2;
CREATE TABLE inflight (outbox_id uuid PRIMARY KEY, attempt_id uuid NOT NULL, attempt_no int NOT NULL, relayer_id text NOT NULL, ordered boolean NOT NULL,
  claimed_at timestamptz NOT NULL, lease_until timestamptz NOT NULL, instruction_id text NOT NULL, participant_id text NOT NULL, sequence_id bigint NOT NULL,
  idempotency_key text NOT NULL, rail_type text NOT NULL, tenant_id text, correlation_id text, payload jsonb NOT NULL, created_at timestamptz NOT NULL,
  zombie_count int NOT NULL DEFAULT 0, chain_head bytea);
CREATE UNIQUE INDEX inflight_participant ON inflight (participant_id) WHERE ordered;
CREATE TABLE archive (attempt_id uuid NOT NULL, outbox_id uuid NOT NULL, instruction_id text NOT NULL, participant_id text NOT NULL, sequence_id bigint NOT NULL,
  idempotency_key text NOT NULL, rail_type text NOT NULL, tenant_id text, correlation_id text, payload jsonb, attempt_no int NOT NULL,
  state text NOT NULL CHECK (state IN ('DISPATCHING','DISPATCHED','RETRYABLE','FAILED','ZOMBIE_REQUEUE','REPLAYED')),
  relayer_id text, claim_attempt_id uuid, claimed_at timestamptz NOT NULL, completed_at timestamptz, next_attempt_at timestamptz,
  rail_reference text, rail_code text, error_code text, error_message text, latency_ms int, late boolean NOT NULL DEFAULT false,
  created_at timestamptz NOT NULL DEFAULT clock_timestamp(), prev_hash bytea, hash bytea,
  PRIMARY KEY (attempt_id, created_at)) PARTITION BY RANGE (created_at);
CREATE INDEX archive_outbox ON archive (outbox_id, claimed_at DESC);
CREATE INDEX archive_brin ON archive USING brin (created_at);
CREATE TABLE archive_default PARTITION OF archive DEFAULT;
DO $$
DECLARE m date := date_trunc('month', now());
BEGIN
  FOR i IN 0..1 LOOP
    EXECUTE format('CREATE TABLE %I PARTITION OF archive FOR VALUES FROM (%L) TO (%L)',
                   'archive_' || to_char(m, 'YYYY_MM'), m, m + interval '1 month');
    m := m + interval '1 month';
  END LOOP;
END $$;
CREATE TABLE sequences (participant_id text PRIMARY KEY, queued int NOT NULL);
INSERT INTO sequences SELECT 'p' || i, 5001 FROM generate_series(0, 9) i;
INSERT INTO pending (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type, payload, next_attempt_at)
  SELECT gen_random_uuid(), 'ins-' || i || '-' || s, 'p' || i, s, 'key-' || i || '-' || s, 'sandbox',
  '{"amount_minor":1000,"currency":"USD","destination":"acct-1"}', 'infinity'
  FROM generate_series(0, 9) i, generate_series(1, 5000) s;
INSERT INTO inflight SELECT gen_random_uuid(), gen_random_uuid(), 1, 'r', true, now(), now(), 'x', 'p' || i, 0, 'k', 'sandbox', NULL, NULL, '{}', now()
  FROM generate_series(0, 9) i;
VACUUM ANALYZE;
