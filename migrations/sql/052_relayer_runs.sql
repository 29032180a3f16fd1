-- Each running relayer registers under its relayer id, migration 052.
--
-- A relayer that lost a claim's commit reply looks for what that claim
-- took (LostClaims in internal/store/handoff.go) and hands it back
-- RELEASED, unsent. It tells its own claims from others' by relayer id
-- alone, so a second process running under the same id (replicas sharing
-- a fixed --relayer-id, a RelayOnce pass beside a started relayer) could
-- have its claim released while it sends it: sent twice, and archived as
-- unsent. Nothing detected such a pair.
--
-- Now each run of a relayer (each Start, each pass) inserts a row here
-- under a run id of its own before it claims, refreshes it on a timer, and
-- deletes it when it stops gracefully. claims_until is the latest
-- claimed_at of any claim the run dispatches: a run claims only while a
-- refresh it heard back from covers its claim's round trip, so a claim it
-- dispatches began before the claims_until of a row that committed before
-- that claim did. The look returns nothing while another run of the same
-- id has claims_until after the last claim the looking run heard of: the
-- rows are then left to the reaper, as before the look existed. A run's
-- refreshes also find the other live runs of its id, which it reports.
--
-- Logged, not unlogged like relayer_idle: a registration must outlive a
-- crash or a failover of the database as long as the claims it covers do.
-- The reaper's pass deletes a row whose claims_until is an hour past and
-- that no claim still in flight of its relayer id may be of.
CREATE TABLE {{.schema}}.relayer_runs (
  run_id       uuid PRIMARY KEY,
  relayer_id   text NOT NULL,
  host         text NOT NULL,
  pid          integer NOT NULL,
  started_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
  seen_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
  claims_until timestamptz NOT NULL
);
CREATE INDEX relayer_runs_relayer_idx ON {{.schema}}.relayer_runs (relayer_id);

-- Where the roles are in place (the relayers' policy exists) the owner
-- grants them here; the roles script (`outbox migrate --create-roles`)
-- does it otherwise, and again.
DO $$
BEGIN
  IF EXISTS (SELECT 1 FROM pg_policies p
             WHERE p.schemaname = '{{.schema}}' AND p.tablename = 'pending' AND p.policyname = 'outbox_relayer_all') THEN
    GRANT SELECT, INSERT, UPDATE, DELETE ON {{.schema}}.relayer_runs TO outbox_relayer;
    GRANT SELECT ON {{.schema}}.relayer_runs TO outbox_auditor, outbox_operator;
  END IF;
END $$;
