-- The detached archive months whose keys have been retired (`outbox
-- archive detach`, internal/store/archive.go). A detach run retires the
-- keys of every detached month not listed here, then lists it, so each
-- month is read once. Without the list every run read every detached
-- month again, to finish a run cut short: about 9 s a run per million
-- instructions a month, on months nobody else reads, through the
-- primary's cache, for as long as they are kept.
--
-- One pass is enough: an instruction's key is retired by the month that
-- holds its last row (DISPATCHED, CANCELLED or ACKNOWLEDGED), and what
-- keeps a key at that month's pass (a requeued copy, a replay) ends in a
-- later month, whose own pass retires it.
CREATE TABLE {{.schema}}.key_retirements (
  partition_name text PRIMARY KEY,         -- the detached partition (attempts_YYYY_MM)
  retired_keys   bigint NOT NULL,          -- keys its pass moved
  finished_at    timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Where the roles are in place, the roles that read the archive
-- (auditors, operators) read this too: `outbox archive list` shows it.
-- roles.sql grants them every table for fresh installs.
DO $$
DECLARE
  g regrole;
BEGIN
  FOR g IN SELECT a.grantee::regrole FROM pg_class c, aclexplode(c.relacl) a
           WHERE c.oid = '{{.schema}}.attempts_detached'::regclass
             AND a.privilege_type = 'SELECT' AND a.grantee <> 0 AND a.grantee <> c.relowner LOOP
    EXECUTE format('GRANT SELECT ON {{.schema}}.key_retirements TO %s', g);
  END LOOP;
END $$;
