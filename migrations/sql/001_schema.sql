-- The outbox schema. {{.schema}} is the configured schema name (default
-- "outbox"); Migrate creates the schema itself under its advisory lock.

-- uuidv7 for rows the database creates itself (attempt ids); PostgreSQL 15
-- has no built-in. Layout per RFC 9562: 48-bit unix ms, version 7, variant 2.
CREATE FUNCTION {{.schema}}.uuidv7() RETURNS uuid
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
  SELECT encode(
    set_bit(set_bit(
      overlay(uuid_send(gen_random_uuid())
              PLACING substring(int8send((extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
              FROM 1 FOR 6),
      52, 1), 53, 1),
    'hex')::uuid
$$;

-- Per-participant sequences. next_sequence_id is the id the next enqueue
-- gets. Bumped inside the enqueue transaction, so a rollback un-bumps it:
-- committed sequences per participant are gap-free.
CREATE TABLE {{.schema}}.sequences (
  participant_id   text PRIMARY KEY,
  next_sequence_id bigint NOT NULL CHECK (next_sequence_id > 0)
);

-- bump_sequence allocates one sequence id for a participant.
CREATE FUNCTION {{.schema}}.bump_sequence(p_participant_id text) RETURNS bigint
LANGUAGE sql VOLATILE AS $$
  INSERT INTO {{.schema}}.sequences AS s (participant_id, next_sequence_id)
  VALUES (p_participant_id, 2)
  ON CONFLICT (participant_id) DO UPDATE SET next_sequence_id = s.next_sequence_id + 1
  RETURNING s.next_sequence_id - 1
$$;

-- bump_sequences allocates counts[i] consecutive ids for participant_ids[i]
-- and returns the first id of each range. Rows are locked in participant
-- order so concurrent batches cannot deadlock on each other.
CREATE FUNCTION {{.schema}}.bump_sequences(p_participant_ids text[], p_counts int[])
RETURNS TABLE (participant_id text, first_sequence_id bigint)
LANGUAGE sql VOLATILE AS $$
  WITH wanted AS (
    SELECT u.p, sum(u.n)::bigint AS n
    FROM unnest(p_participant_ids, p_counts) AS u(p, n)
    GROUP BY u.p
  ), bumped AS (
    INSERT INTO {{.schema}}.sequences AS s (participant_id, next_sequence_id)
    SELECT w.p, w.n + 1 FROM wanted w ORDER BY w.p
    ON CONFLICT (participant_id) DO UPDATE SET next_sequence_id = s.next_sequence_id + excluded.next_sequence_id - 1
    RETURNING s.participant_id, s.next_sequence_id
  )
  SELECT b.participant_id, b.next_sequence_id - w.n
  FROM bumped b JOIN wanted w ON w.p = b.participant_id
$$;

-- Permanent idempotency: one (tenant, instruction, key) -> one outbox id,
-- forever. Outlives the pending row, so a replayed request after dispatch is
-- still recognised. tenant_id '' is the "no tenant" scope (NOT NULL keeps the
-- primary key usable for lookups; it acts like UNIQUE NULLS NOT DISTINCT).
CREATE TABLE {{.schema}}.idempotency_keys (
  tenant_id       text NOT NULL DEFAULT '',
  instruction_id  text NOT NULL,
  idempotency_key text NOT NULL,
  outbox_id       uuid NOT NULL UNIQUE,
  participant_id  text NOT NULL,
  sequence_id     bigint, -- set in the same transaction that inserts the row
  payload_hash    bytea NOT NULL,
  created_at      timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (tenant_id, instruction_id, idempotency_key)
);

-- The hot queue: instructions waiting for (re)dispatch. Small, churns fast.
CREATE TABLE {{.schema}}.pending (
  outbox_id       uuid PRIMARY KEY,
  instruction_id  text NOT NULL,
  participant_id  text NOT NULL,
  sequence_id     bigint NOT NULL,
  idempotency_key text NOT NULL,
  rail_type       text NOT NULL,
  tenant_id       text,
  correlation_id  text,
  payload         jsonb NOT NULL,
  attempt_count   int NOT NULL DEFAULT 0,
  next_attempt_at timestamptz NOT NULL DEFAULT now(),
  created_at      timestamptz NOT NULL DEFAULT now(), -- first enqueue; kept across retries
  UNIQUE (participant_id, sequence_id)
) WITH (
  fillfactor = 90,
  autovacuum_vacuum_scale_factor = 0.0,
  autovacuum_vacuum_threshold = 1000,
  autovacuum_vacuum_insert_scale_factor = 0.0,
  autovacuum_vacuum_insert_threshold = 10000,
  autovacuum_analyze_scale_factor = 0.0,
  autovacuum_analyze_threshold = 5000,
  autovacuum_vacuum_cost_delay = 0
);
CREATE INDEX pending_due_idx ON {{.schema}}.pending (next_attempt_at, created_at);

-- One row per instruction being dispatched right now: written by the claim,
-- removed by the outcome. Carries everything needed to requeue it, so the
-- reaper never reads the archive.
CREATE TABLE {{.schema}}.inflight (
  outbox_id       uuid PRIMARY KEY,
  attempt_id      uuid NOT NULL,
  attempt_no      int NOT NULL,
  relayer_id      text NOT NULL,
  ordered         boolean NOT NULL,
  claimed_at      timestamptz NOT NULL,
  lease_until     timestamptz NOT NULL,
  instruction_id  text NOT NULL,
  participant_id  text NOT NULL,
  sequence_id     bigint NOT NULL,
  idempotency_key text NOT NULL,
  rail_type       text NOT NULL,
  tenant_id       text,
  correlation_id  text,
  payload         jsonb NOT NULL,
  created_at      timestamptz NOT NULL
) WITH (
  autovacuum_vacuum_scale_factor = 0.0,
  autovacuum_vacuum_threshold = 1000,
  autovacuum_analyze_scale_factor = 0.0,
  autovacuum_analyze_threshold = 5000,
  autovacuum_vacuum_cost_delay = 0
);
CREATE INDEX inflight_lease_idx ON {{.schema}}.inflight (lease_until);
CREATE INDEX inflight_participant_idx ON {{.schema}}.inflight (participant_id);
-- Per-participant ordering, enforced by the database and not only by the
-- claim query: at most one ordered in-flight instruction per participant.
CREATE UNIQUE INDEX inflight_ordered_participant_idx ON {{.schema}}.inflight (participant_id) WHERE ordered;

-- The archive: one row per state change of an instruction, append-only.
-- Partitioned by month of created_at; retention drops whole partitions.
CREATE TABLE {{.schema}}.attempts (
  attempt_id      uuid NOT NULL DEFAULT {{.schema}}.uuidv7(),
  outbox_id       uuid NOT NULL,
  instruction_id  text NOT NULL,
  participant_id  text NOT NULL,
  sequence_id     bigint NOT NULL,
  idempotency_key text NOT NULL,
  rail_type       text NOT NULL,
  tenant_id       text,
  correlation_id  text,
  payload         jsonb,          -- what was sent: on DISPATCHING (and REPLAYED) rows only
  attempt_no      int NOT NULL,
  state           text NOT NULL CHECK (state IN ('DISPATCHING','DISPATCHED','RETRYABLE','FAILED','ZOMBIE_REQUEUE','REPLAYED')),
  relayer_id      text,
  claim_attempt_id uuid,          -- for outcome rows: the DISPATCHING row they close
  claimed_at      timestamptz NOT NULL,
  completed_at    timestamptz,
  next_attempt_at timestamptz,    -- RETRYABLE / ZOMBIE_REQUEUE: when it is due again
  rail_reference  text,
  rail_code       text,
  error_code      text,
  error_message   text,
  latency_ms      int,
  late            boolean NOT NULL DEFAULT false, -- outcome recorded after the lease was reaped
  created_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
  PRIMARY KEY (attempt_id, created_at)
) PARTITION BY RANGE (created_at);
CREATE INDEX attempts_outbox_idx ON {{.schema}}.attempts (outbox_id, claimed_at DESC);
CREATE INDEX attempts_instruction_idx ON {{.schema}}.attempts (instruction_id, claimed_at DESC);
CREATE INDEX attempts_dispatching_age_idx ON {{.schema}}.attempts (claimed_at) WHERE state = 'DISPATCHING';
-- A row outside every monthly partition still lands somewhere: never lose a
-- write because partition maintenance fell behind.
CREATE TABLE {{.schema}}.attempts_default PARTITION OF {{.schema}}.attempts DEFAULT;

-- ensure_attempt_partitions creates the monthly partitions from the current
-- month to months_ahead months later. Idempotent; called by Migrate and by
-- relayers at start-up.
CREATE FUNCTION {{.schema}}.ensure_attempt_partitions(months_ahead int DEFAULT 3) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
  m date;
  name text;
BEGIN
  FOR i IN 0..months_ahead LOOP
    m := (date_trunc('month', now() AT TIME ZONE 'UTC') + make_interval(months => i))::date;
    name := 'attempts_' || to_char(m, 'YYYY_MM');
    IF to_regclass(format('%I.%I', '{{.schema}}', name)) IS NULL THEN
      EXECUTE format('CREATE TABLE %I.%I PARTITION OF %I.attempts FOR VALUES FROM (%L) TO (%L)',
                     '{{.schema}}', name, '{{.schema}}',
                     (m::timestamp AT TIME ZONE 'UTC'), ((m + interval '1 month')::timestamp AT TIME ZONE 'UTC'));
      -- Row triggers are inherited from the parent; TRUNCATE triggers are
      -- not, so each partition gets its own.
      EXECUTE format('CREATE TRIGGER attempts_no_truncate BEFORE TRUNCATE ON %I.%I
                      FOR EACH STATEMENT EXECUTE FUNCTION %I.reject_attempt_change()', '{{.schema}}', name, '{{.schema}}');
    END IF;
  END LOOP;
END $$;
-- Append-only, enforced by the database: UPDATE, DELETE and TRUNCATE fail
-- for everyone, owner included. Retention detaches and drops partitions.
CREATE FUNCTION {{.schema}}.reject_attempt_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'outbox attempts are append-only: % is not allowed', TG_OP
    USING ERRCODE = 'insufficient_privilege';
END $$;
CREATE TRIGGER attempts_append_only
  BEFORE UPDATE OR DELETE ON {{.schema}}.attempts
  FOR EACH ROW EXECUTE FUNCTION {{.schema}}.reject_attempt_change();
CREATE TRIGGER attempts_no_truncate
  BEFORE TRUNCATE ON {{.schema}}.attempts
  FOR EACH STATEMENT EXECUTE FUNCTION {{.schema}}.reject_attempt_change();
CREATE TRIGGER attempts_no_truncate
  BEFORE TRUNCATE ON {{.schema}}.attempts_default
  FOR EACH STATEMENT EXECUTE FUNCTION {{.schema}}.reject_attempt_change();
REVOKE UPDATE, DELETE, TRUNCATE ON {{.schema}}.attempts FROM PUBLIC;
SELECT {{.schema}}.ensure_attempt_partitions(3);



-- Instructions that failed terminally. Replay moves one back to pending;
-- acknowledging marks it handled. DLQ depth is a count over the partial
-- index of unacknowledged rows.
CREATE TABLE {{.schema}}.dead_letters (
  outbox_id       uuid PRIMARY KEY,
  instruction_id  text NOT NULL,
  participant_id  text NOT NULL,
  sequence_id     bigint NOT NULL,
  idempotency_key text NOT NULL,
  rail_type       text NOT NULL,
  tenant_id       text,
  correlation_id  text,
  payload         jsonb NOT NULL,
  attempt_count   int NOT NULL,
  error_code      text NOT NULL,
  error_message   text,
  attempt_id      uuid NOT NULL, -- the FAILED attempt
  created_at      timestamptz NOT NULL, -- first enqueue
  failed_at       timestamptz NOT NULL DEFAULT now(),
  -- An operator accepted the failure: the row stays (the instruction's last
  -- place) but leaves the queue of things to handle.
  acknowledged_at timestamptz,
  acknowledged_by text
);
CREATE INDEX dead_letters_open_idx ON {{.schema}}.dead_letters (failed_at) WHERE acknowledged_at IS NULL;

-- Adaptive NOTIFY. A commit that has issued NOTIFY takes a cluster-wide lock,
-- so notifying on every enqueue halves producer throughput. Relayers register
-- here only while idle; the trigger notifies only while a fresh registration
-- exists. A relayer that died leaves a stale row, which is ignored.
CREATE UNLOGGED TABLE {{.schema}}.relayer_idle (
  relayer_id text PRIMARY KEY,
  idle_since timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE FUNCTION {{.schema}}.notify_pending() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  -- Statement triggers also fire for statements that insert nothing (a
  -- duplicate enqueue, an outcome batch without retries): check both.
  IF EXISTS (SELECT 1 FROM {{.schema}}.relayer_idle
             WHERE idle_since > clock_timestamp() - interval '10 seconds')
     AND EXISTS (SELECT 1 FROM inserted) THEN
    PERFORM pg_notify('outbox_pending', '');
  END IF;
  RETURN NULL;
END $$;
-- Statement-level: a batch insert costs one check and at most one NOTIFY.
-- Turn off with: ALTER TABLE <schema>.pending DISABLE TRIGGER pending_notify
-- (or `outbox notify off`); relayers then rely on polling alone.
CREATE TRIGGER pending_notify
  AFTER INSERT ON {{.schema}}.pending
  REFERENCING NEW TABLE AS inserted
  FOR EACH STATEMENT EXECUTE FUNCTION {{.schema}}.notify_pending();
