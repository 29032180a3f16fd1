-- The archive's partitions are read through their parents only
-- (docs/audit.md, "Tenants").
--
-- Row-level security by tenant is on the parents, attempts and
-- attempts_detached (roles.sql). PostgreSQL applies a parent's policies
-- to the queries that name the parent, never to one that names a
-- partition: a reader scoped to one tenant who could read a month's
-- partition by its name (attempts_2026_09, attempts_default, a detached
-- month) read every tenant's rows there. Reading through a parent needs
-- the privilege on the parent alone, so nobody but the owner needs any
-- privilege on a partition, and none keeps one.
--
-- seal_archive_partition makes a partition so: it revokes every privilege
-- on it from every role but its owner (PUBLIC included: a grant left by an
-- earlier roles.sql, which granted auditors and operators every table of
-- the schema; one by hand; one from ALTER DEFAULT PRIVILEGES on a month
-- created later), and turns on row-level security without a policy, so a
-- grant made anyway still reads no row of it (a partition's own policies
-- do not apply to queries through its parent). The owner, to whom the
-- policies never apply, reads it as before. It is called on each month
-- ensure_attempt_partitions creates, on each month `outbox archive
-- detach` moves, and here on every partition there is; roles.sql does the
-- same on every run.
CREATE FUNCTION {{.schema}}.seal_archive_partition(p regclass) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
  g oid;
BEGIN
  IF NOT (SELECT c.relrowsecurity FROM pg_catalog.pg_class c WHERE c.oid = p) THEN
    EXECUTE format('ALTER TABLE %s ENABLE ROW LEVEL SECURITY', p);
  END IF;
  FOR g IN SELECT DISTINCT a.grantee FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
           WHERE c.oid = p AND a.grantee <> c.relowner LOOP
    IF g = 0 THEN
      EXECUTE format('REVOKE ALL ON TABLE %s FROM PUBLIC', p);
    ELSE
      EXECUTE format('REVOKE ALL ON TABLE %s FROM %s', p, g::regrole);
    END IF;
  END LOOP;
END $$;

-- ensure_attempt_partitions, as in 002, and each month it creates is
-- sealed. Where the roles are in place it runs as the owner (relayers
-- call it), whose new tables get whatever the owner's default privileges
-- say; sealing takes that back. CREATE OR REPLACE resets SECURITY DEFINER
-- and the search path, so they are set again as they were (later
-- migrations take SECURITY DEFINER here as the sign that the roles are in
-- place); its EXECUTE grants are kept.
DO $m$
DECLARE
  definer boolean := (SELECT prosecdef FROM pg_proc WHERE oid = '{{.schema}}.ensure_attempt_partitions(int)'::regprocedure);
BEGIN
  CREATE OR REPLACE FUNCTION {{.schema}}.ensure_attempt_partitions(months_ahead int DEFAULT 3) RETURNS void
  LANGUAGE plpgsql AS $fn$
  DECLARE
    m date;
    name text;
  BEGIN
    FOR i IN 0..months_ahead LOOP
      m := (date_trunc('month', now() AT TIME ZONE 'UTC') + make_interval(months => i))::date;
      name := 'attempts_' || to_char(m, 'YYYY_MM');
      IF to_regclass(format('%I.%I', '{{.schema}}', name)) IS NULL THEN
        BEGIN
          EXECUTE format('CREATE TABLE %I.%I PARTITION OF %I.attempts FOR VALUES FROM (%L) TO (%L)',
                         '{{.schema}}', name, '{{.schema}}',
                         (m::timestamp AT TIME ZONE 'UTC'), ((m + interval '1 month')::timestamp AT TIME ZONE 'UTC'));
          -- Row triggers are inherited from the parent; TRUNCATE triggers are
          -- not, so each partition gets its own.
          EXECUTE format('CREATE TRIGGER attempts_no_truncate BEFORE TRUNCATE ON %I.%I
                          FOR EACH STATEMENT EXECUTE FUNCTION %I.reject_attempt_change()', '{{.schema}}', name, '{{.schema}}');
          PERFORM {{.schema}}.seal_archive_partition(format('%I.%I', '{{.schema}}', name)::regclass);
        EXCEPTION WHEN check_violation THEN
          -- "updated partition constraint for default partition would be
          -- violated": rows of this month are in the default partition.
          RAISE WARNING 'outbox: cannot create partition %.%: the default partition holds rows of that month (%); move them out to create it',
            '{{.schema}}', name, SQLERRM;
        END;
      END IF;
    END LOOP;
  END $fn$;
  IF definer THEN
    ALTER FUNCTION {{.schema}}.ensure_attempt_partitions(int) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
  END IF;
END $m$;

-- Every partition there is, attached (the default one too) or detached.
SELECT {{.schema}}.seal_archive_partition(i.inhrelid::regclass)
FROM pg_inherits i
WHERE i.inhparent IN ('{{.schema}}.attempts'::regclass, '{{.schema}}.attempts_detached'::regclass);
