-- Archive lifecycle (docs/operations.md).
--
-- Detached months. `outbox archive detach` moves whole monthly partitions
-- out of attempts, where the hot path writes, into attempts_detached: they
-- stay in the database, append-only, readable by auditors and by `audit
-- verify` (through the archive view), and can be exported to a file.
-- Nothing here deletes a row.
CREATE TABLE {{.schema}}.attempts_detached (LIKE {{.schema}}.attempts) PARTITION BY RANGE (created_at);
CREATE TRIGGER attempts_append_only
  BEFORE UPDATE OR DELETE ON {{.schema}}.attempts_detached
  FOR EACH ROW EXECUTE FUNCTION {{.schema}}.reject_attempt_change();
CREATE TRIGGER attempts_no_truncate
  BEFORE TRUNCATE ON {{.schema}}.attempts_detached
  FOR EACH STATEMENT EXECUTE FUNCTION {{.schema}}.reject_attempt_change();
REVOKE UPDATE, DELETE, TRUNCATE ON {{.schema}}.attempts_detached FROM PUBLIC;

-- The whole archive, attached and detached, for everything that reads the
-- history rather than writes it (verify, trails). Runs with the reader's
-- privileges, so row-level security applies. A migration that adds a
-- column to attempts recreates this view (SELECT * is expanded once).
CREATE VIEW {{.schema}}.archive WITH (security_invoker = true) AS
  SELECT * FROM {{.schema}}.attempts
  UNION ALL
  SELECT * FROM {{.schema}}.attempts_detached;

-- Retired idempotency keys: the compact form a key takes when the archive
-- month that dispatched its instruction is detached (found through the
-- archive, so the enqueue pays for no index on the keys' time). The key itself is kept as a
-- 16-byte digest of (tenant, instruction id, key), so a replay of it is
-- still refused forever (pending.ErrKeyRetired: never dispatched twice);
-- what is lost is the original receipt (the payload hash, to tell a replay
-- from a mismatch). Participant and sequence stay, so gap-free sequences
-- remain checkable; the outbox id leads to the instruction's trail.
CREATE TABLE {{.schema}}.retired_keys (
  digest         bytea PRIMARY KEY,
  outbox_id      uuid NOT NULL,
  tenant_id      text,
  participant_id text NOT NULL,
  sequence_id    bigint NOT NULL,
  created_at     timestamptz NOT NULL, -- the first enqueue
  retired_at     timestamptz NOT NULL DEFAULT now()
);
CREATE TRIGGER retired_keys_append_only
  BEFORE UPDATE OR DELETE ON {{.schema}}.retired_keys
  FOR EACH ROW EXECUTE FUNCTION {{.schema}}.reject_change();
CREATE TRIGGER retired_keys_no_truncate
  BEFORE TRUNCATE ON {{.schema}}.retired_keys
  FOR EACH STATEMENT EXECUTE FUNCTION {{.schema}}.reject_change();

-- key_digest is a retired key's identity: an injective encoding (lengths
-- first) of the three parts, hashed, truncated to 128 bits. It is STABLE
-- as its body is (textsend is): declared IMMUTABLE, the planner would not
-- inline it into the enqueue's statements, and a SQL function that is not
-- inlined is planned again on every execution, which cost the single
-- enqueue a fifth of its throughput.
CREATE FUNCTION {{.schema}}.key_digest(tenant_id text, instruction_id text, idempotency_key text) RETURNS bytea
LANGUAGE sql STABLE PARALLEL SAFE AS $$
  SELECT substr(sha256(textsend(length(tenant_id)::text || ':' || tenant_id || length(instruction_id)::text || ':'
                                || instruction_id || idempotency_key)), 1, 16)
$$;

-- key_retired_race fails the statement (and so the enqueue's transaction)
-- when a key the transaction just inserted turns out to be retired: the
-- retirement committed while the enqueue waited on the old key row's lock.
-- The enqueue's first statement filters retired keys; this closes the
-- window between its snapshot and the lock.
CREATE FUNCTION {{.schema}}.key_retired_race(outbox_id uuid) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'outbox: idempotency key of outbox % was retired while this transaction enqueued it', outbox_id
    USING ERRCODE = 'OBKR1';
END $$;
