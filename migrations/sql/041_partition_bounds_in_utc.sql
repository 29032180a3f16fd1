-- Partition upkeep writes each month's bounds in a form no session setting
-- changes, migration 041.
--
-- ensure_attempt_partitions (migration 031) put the month's bounds into
-- its CREATE TABLE as format('%L') of a timestamptz, which is that value
-- written in the calling session's DateStyle and TimeZone. In any
-- DateStyle but ISO that names the zone by its abbreviation, and
-- PostgreSQL may read the abbreviation as another zone's: a relayer whose
-- database is in Asia/Kolkata with an SQL DateStyle created a month from
-- "01/12/2026 05:30:00 IST", read as Israel's time, 03:30 UTC, so the
-- month's first hours fell outside every partition (into the default
-- partition) or the month overlapped the previous one and was not created
-- (in Asia/Shanghai, "CST" read as America's, fourteen hours off). The
-- bounds are now ISO literals with a zero offset, which every DateStyle
-- reads as the same instant. Same function otherwise (at most 24 months
-- ahead, a month whose rows are in the default partition warned about and
-- skipped, its truncate trigger, sealed); its standing is kept as
-- migration 031 set it (SECURITY DEFINER where the roles are in place;
-- owner and EXECUTE grants are kept by CREATE OR REPLACE).
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
    -- Upkeep keeps a few months ahead; a caller may not have the owner
    -- create a table for every month of centuries.
    IF months_ahead > 24 THEN
      RAISE EXCEPTION 'outbox: archive partitions are kept at most 24 months ahead, not %', months_ahead
        USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOR i IN 0..months_ahead LOOP
      m := (date_trunc('month', now() AT TIME ZONE 'UTC') + make_interval(months => i))::date;
      name := 'attempts_' || to_char(m, 'YYYY_MM');
      IF to_regclass(format('%I.%I', '{{.schema}}', name)) IS NULL THEN
        BEGIN
          -- The bounds as ISO text in UTC, read alike in every DateStyle
          -- and TimeZone.
          EXECUTE format('CREATE TABLE %I.%I PARTITION OF %I.attempts FOR VALUES FROM (%L) TO (%L)',
                         '{{.schema}}', name, '{{.schema}}',
                         to_char(m, 'YYYY-MM-DD') || ' 00:00:00+00',
                         to_char((m + interval '1 month')::date, 'YYYY-MM-DD') || ' 00:00:00+00');
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
