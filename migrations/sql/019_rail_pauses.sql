-- Operators pause dispatch to a rail (or to every rail, '*') across the
-- whole relayer fleet, without a deploy: a bank's maintenance window, a
-- rail paying twice, a restore that must be reconciled before anything is
-- sent. Claims and hand-offs leave a paused rail's instructions pending
-- (internal/store/pause.go); what was in flight finishes.

-- rail_pauses holds the pauses in force: one row per paused rail type.
CREATE TABLE {{.schema}}.rail_pauses (
  rail_type text PRIMARY KEY CHECK (btrim(rail_type) <> ''),
  paused_by text NOT NULL,
  reason    text NOT NULL,
  paused_at timestamptz NOT NULL DEFAULT now()
);

-- rail_pause_events is the append-only record of who paused and resumed
-- which rail, when and why.
CREATE TABLE {{.schema}}.rail_pause_events (
  event_id  uuid PRIMARY KEY DEFAULT {{.schema}}.uuidv7(),
  rail_type text NOT NULL,
  action    text NOT NULL CHECK (action IN ('PAUSED', 'RESUMED')),
  operator  text NOT NULL,
  reason    text NOT NULL,
  at        timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE FUNCTION {{.schema}}.rail_pause_events_append_only() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
  RAISE EXCEPTION 'outbox: rail_pause_events is append-only' USING ERRCODE = 'insufficient_privilege';
END $fn$;

CREATE TRIGGER rail_pause_events_append_only
  BEFORE UPDATE OR DELETE OR TRUNCATE ON {{.schema}}.rail_pause_events
  FOR EACH STATEMENT EXECUTE FUNCTION {{.schema}}.rail_pause_events_append_only();

-- pause_rail pauses p_rail_type ('*': every rail) and records who and why;
-- it returns false (and records nothing) if the rail was already paused.
CREATE FUNCTION {{.schema}}.pause_rail(p_rail_type text, p_operator text, p_reason text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
  PERFORM {{.schema}}.operator_check(p_operator, p_reason);
  IF btrim(coalesce(p_rail_type, '')) = '' THEN
    RAISE EXCEPTION 'outbox: a pause needs a rail type (or * for every rail)' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  INSERT INTO {{.schema}}.rail_pauses (rail_type, paused_by, reason) VALUES (p_rail_type, p_operator, p_reason)
  ON CONFLICT (rail_type) DO NOTHING;
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  INSERT INTO {{.schema}}.rail_pause_events (rail_type, action, operator, reason) VALUES (p_rail_type, 'PAUSED', p_operator, p_reason);
  RETURN true;
END $fn$;

-- resume_rail ends the pause of p_rail_type, records who and why and wakes
-- idle relayers; it returns false (and records nothing) if the rail was
-- not paused.
CREATE FUNCTION {{.schema}}.resume_rail(p_rail_type text, p_operator text, p_reason text) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
  PERFORM {{.schema}}.operator_check(p_operator, p_reason);
  DELETE FROM {{.schema}}.rail_pauses WHERE rail_type = p_rail_type;
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  INSERT INTO {{.schema}}.rail_pause_events (rail_type, action, operator, reason) VALUES (p_rail_type, 'RESUMED', p_operator, p_reason);
  PERFORM pg_notify('outbox_pending', '');
  RETURN true;
END $fn$;

-- Where the roles are in place (partition upkeep then runs as its owner):
-- the functions run as the owner for the roles that may replay dead
-- letters (operators), and the roles that read the queue (relayers,
-- auditors, operators) read the pauses. roles.sql says the same for fresh
-- installs.
DO $$
DECLARE
  g regrole;
BEGIN
  IF (SELECT prosecdef FROM pg_proc WHERE oid = '{{.schema}}.ensure_attempt_partitions(int)'::regprocedure) THEN
    ALTER FUNCTION {{.schema}}.pause_rail(text, text, text) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
    ALTER FUNCTION {{.schema}}.resume_rail(text, text, text) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
    REVOKE ALL ON FUNCTION {{.schema}}.pause_rail(text, text, text), {{.schema}}.resume_rail(text, text, text) FROM PUBLIC;
    FOR g IN SELECT a.grantee::regrole FROM pg_proc p, aclexplode(p.proacl) a
             WHERE p.oid = '{{.schema}}.replay_dead_letter(uuid, text, text)'::regprocedure
               AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner LOOP
      EXECUTE format('GRANT EXECUTE ON FUNCTION {{.schema}}.pause_rail(text, text, text), {{.schema}}.resume_rail(text, text, text) TO %s', g);
    END LOOP;
    FOR g IN SELECT a.grantee::regrole FROM pg_class c, aclexplode(c.relacl) a
             WHERE c.oid = '{{.schema}}.inflight'::regclass
               AND a.privilege_type = 'SELECT' AND a.grantee <> 0 AND a.grantee <> c.relowner LOOP
      EXECUTE format('GRANT SELECT ON {{.schema}}.rail_pauses, {{.schema}}.rail_pause_events TO %s', g);
    END LOOP;
  END IF;
END $$;
