-- Fencing for late completions, and partition upkeep that cannot wedge.

-- zombie_attempt_id is set only on a copy the reaper put back into pending:
-- the DISPATCHING attempt whose lease expired. A relayer whose late outcome
-- withdraws "the requeued copy" deletes a pending row only if it carries its
-- own claim's id, so it can never remove a copy that was claimed and
-- requeued again since (a retry) or that an operator replayed.
ALTER TABLE {{.schema}}.pending ADD COLUMN zombie_attempt_id uuid;

-- ensure_attempt_partitions, as in 001, but a month that cannot be created
-- (the default partition already holds rows of that month, because upkeep
-- fell behind) is reported and skipped instead of aborting the whole call,
-- so later months are still created and new rows stop landing in the
-- default partition.
CREATE OR REPLACE FUNCTION {{.schema}}.ensure_attempt_partitions(months_ahead int DEFAULT 3) RETURNS void
LANGUAGE plpgsql AS $$
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
      EXCEPTION WHEN check_violation THEN
        -- "updated partition constraint for default partition would be
        -- violated": rows of this month are in the default partition.
        RAISE WARNING 'outbox: cannot create partition %.%: the default partition holds rows of that month (%); move them out to create it',
          '{{.schema}}', name, SQLERRM;
      END;
    END IF;
  END LOOP;
END $$;
