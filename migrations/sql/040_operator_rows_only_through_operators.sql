-- Operator rows only through the operators' functions, migration 040.
--
-- A relayer appends to the archive (its claims and outcomes) and to the
-- dead letters (terminal failures): INSERT on both, and row-level security
-- that lets it write any row (the roles script's outbox_relayer_all). So a
-- relayer credential could append an operator's row: a REPLAYED,
-- ACKNOWLEDGED or CANCELLED attempt naming any person and any database
-- role ("cancelled by alice (database role ops_alice): ..."), hashed and
-- chained like the real ones, or a dead letter already acknowledged by
-- anyone. The operators' functions, which write those rows, run as the
-- owner, which no policy restricts. Two restrictive policies now refuse
-- them to relayers (42501, "new row violates row-level security policy"):
-- - attempts: no row in an operator's state;
-- - dead_letters: no row with an acknowledgement.
-- Their check is one comparison per inserted row; the relayers' own rows
-- are unaffected. Where the roles are in place (the relayers' policy
-- exists) the owner creates them here; the roles script (`outbox migrate
-- --create-roles`) creates them otherwise, and again (this build's script
-- may have run before the migration: then they are made afresh).
DO $$
BEGIN
  IF EXISTS (SELECT 1 FROM pg_policies p
             WHERE p.schemaname = '{{.schema}}' AND p.tablename = 'attempts' AND p.policyname = 'outbox_relayer_all') THEN
    DROP POLICY IF EXISTS outbox_relayer_no_operator_rows ON {{.schema}}.attempts;
    CREATE POLICY outbox_relayer_no_operator_rows ON {{.schema}}.attempts AS RESTRICTIVE FOR INSERT TO outbox_relayer
      WITH CHECK (state NOT IN ('REPLAYED', 'ACKNOWLEDGED', 'CANCELLED'));
  END IF;
  IF EXISTS (SELECT 1 FROM pg_policies p
             WHERE p.schemaname = '{{.schema}}' AND p.tablename = 'dead_letters' AND p.policyname = 'outbox_relayer_all') THEN
    DROP POLICY IF EXISTS outbox_relayer_no_acknowledgement ON {{.schema}}.dead_letters;
    CREATE POLICY outbox_relayer_no_acknowledgement ON {{.schema}}.dead_letters AS RESTRICTIVE FOR INSERT TO outbox_relayer
      WITH CHECK (acknowledged_at IS NULL AND acknowledged_by IS NULL AND acknowledged_reason IS NULL);
  END IF;
END $$;
