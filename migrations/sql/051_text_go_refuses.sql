-- The database refuses the text Go refuses, migration 051.
--
-- Go refuses bad text before anything is written: store.CheckOperator an
-- operator's empty name or reason, a name holding "(database role", and
-- any control or format character (payment.ControlRune); the validators
-- (payment.ValidateText) the same characters, and more than 200 bytes, in
-- an instruction's ids, rail type and correlation id, and an idempotency
-- key that is not printable ASCII or begins or ends with a space. But the
-- roles (docs/audit.md) reach the database without Go: an operator ran
-- replay_dead_letter, acknowledge_dead_letter, cancel_pending, pause_rail,
-- resume_rail and resume_rail_shown with psql, with a reason holding a
-- line break or a bidi override (U+202E), or of many megabytes, which the
-- archive then kept for ever in its hash chain and the console, `outbox
-- audit` and logs showed; operator_check trimmed ASCII spaces only, so a
-- name of no-break spaces passed too. A producer inserted a key row, and
-- made it an instruction through enqueue_pending(_batch), with ids, a
-- rail type or a correlation id Go would refuse. Now:
--
-- * text_free_of_controls(t) is payment.ControlRune over a text, code
--   point for code point (C0 and C1 controls, U+2028 and U+2029, and
--   Unicode's default-ignorable code points: format characters such as
--   bidi overrides and zero-width characters, variation selectors, Hangul
--   fillers), and text_is_blank(t) is strings.TrimSpace(t) == "" (Go's
--   unicode.IsSpace); migrations.TestTextChecksMatchGo asks both of every
--   code point, so they cannot drift apart unseen (a Go release with new
--   Unicode tables fails it, and a migration brings the classes up to
--   date). text_is_identifier(t, n) is both and at most n bytes.
-- * operator_check, which every operator function runs first, also
--   refuses a name or reason that is blank by Go's measure, holds such a
--   character, or is longer than 256 bytes (a name) or 4,096 (a reason):
--   store.MaxOperatorNameBytes and store.MaxReasonBytes. Each refusal is
--   SQLSTATE 22023 naming the parameter (the error's column: operator or
--   reason), as its other refusals now do; nothing is written.
-- * pause_rail refuses a rail type Go's validators would refuse an
--   instruction (22023, column rail_type): no rail is named so, and the
--   pause would be shown as it was typed. resume_rail(_shown) take any
--   rail type, so that a pause made before this migration can be ended.
-- * enqueue_pending(_batch) refuse a rail type or a correlation id Go
--   would refuse (22023, column rail_type or correlation_id) before they
--   allocate anything.
-- * idempotency_keys gets a check per text column: ids as above (200
--   bytes), the key printable ASCII without a space at either end, the
--   tenant '' or an id other than '*' (23514, the constraint named after
--   its column). NOT VALID: a year's keys are hundreds of millions of
--   rows, and validating them here would hold the table's lock (every
--   enqueue) for the scan; rows written before are not checked, new and
--   updated ones are (an enqueue of a key written before that breaks them
--   is refused). docs/operations.md ("Upgrading", 051) has the VALIDATE to
--   run afterwards, which lets enqueues go on, and the query that lists
--   the rows it would refuse. What they cost an enqueue is in
--   docs/performance.md; pending, inflight and the archive, which every
--   claim and outcome write, get no check: their text comes from the key
--   row and the enqueue's arguments, checked here, or from the operator
--   functions and relayers.
--
-- Rows written before (the archive, rail_pause_events, dead letters'
-- acknowledgements) are left as they are: the archive is append-only and
-- in the hash chain.

-- payment.ControlRune's characters (DerivedCoreProperties' default
-- ignorables as Go 1.26's tables have them); U+0000 cannot be in a text.
CREATE FUNCTION {{.schema}}.text_free_of_controls(t text) RETURNS boolean
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $fn$
  SELECT t !~ '[\u0001-\u001f\u007f-\u009f\u00ad\u034f\u0600-\u0605\u061c\u06dd\u070f\u0890-\u0891\u08e2\u115f-\u1160\u17b4-\u17b5\u180b-\u180f\u200b-\u200f\u2028-\u202e\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufffb\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0000-\U000e0fff]'
$fn$;

-- unicode.IsSpace's characters: strings.TrimSpace(t) == "".
CREATE FUNCTION {{.schema}}.text_is_blank(t text) RETURNS boolean
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $fn$
  SELECT t !~ '[^\u0009-\u000d\u0020\u0085\u00a0\u1680\u2000-\u200a\u2028-\u2029\u202f\u205f\u3000]'
$fn$;

-- payment.ValidateText(t, max_bytes) without its UTF-8 check (a text of
-- the database is valid UTF-8): at most max_bytes, free of controls (the
-- first class) and not blank (the second). The key rows' checks run it at every
-- enqueue, twice (the key's insert and its sequence id's update), so text
-- of ASCII alone, every id a producer of this build sends in practice,
-- takes a small expression (printable ASCII, one character not a space):
-- the whole classes cost a single-row insert of a key about as much again
-- as the insert (docs/performance.md). PL/pgSQL, not SQL: a SQL function
-- in a check is inlined, its text parsed, at every statement.
CREATE FUNCTION {{.schema}}.text_is_identifier(t text, max_bytes int) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $fn$
BEGIN
  IF octet_length(t) > max_bytes THEN
    RETURN false;
  END IF;
  IF octet_length(t) = char_length(t) THEN
    RETURN t ~ '^[ -~]*[!-~][ -~]*$';
  END IF;
  RETURN {{.schema}}.text_free_of_controls(t) AND NOT {{.schema}}.text_is_blank(t);
END $fn$;

CREATE OR REPLACE FUNCTION {{.schema}}.operator_check(p_operator text, p_reason text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $fn$
BEGIN
  IF coalesce({{.schema}}.text_is_blank(p_operator), true) THEN
    RAISE EXCEPTION 'outbox: an operator action needs the operator''s name' USING ERRCODE = 'invalid_parameter_value', COLUMN = 'operator';
  END IF;
  IF coalesce({{.schema}}.text_is_blank(p_reason), true) THEN
    RAISE EXCEPTION 'outbox: an operator action needs a reason' USING ERRCODE = 'invalid_parameter_value', COLUMN = 'reason';
  END IF;
  IF position('(database role' IN lower(p_operator)) > 0 THEN
    RAISE EXCEPTION 'outbox: an operator''s name may not contain "(database role": the archive records the database role itself'
      USING ERRCODE = 'invalid_parameter_value', COLUMN = 'operator';
  END IF;
  IF octet_length(p_operator) > 256 THEN
    RAISE EXCEPTION 'outbox: an operator''s name is at most 256 bytes, not %', octet_length(p_operator)
      USING ERRCODE = 'invalid_parameter_value', COLUMN = 'operator';
  END IF;
  IF octet_length(p_reason) > 4096 THEN
    RAISE EXCEPTION 'outbox: an operator action''s reason is at most 4096 bytes, not %', octet_length(p_reason)
      USING ERRCODE = 'invalid_parameter_value', COLUMN = 'reason';
  END IF;
  -- Archived and shown: a line break starts a new line where it is read,
  -- a bidi override reverses what follows. The text is not repeated in
  -- the message, which is logged.
  IF NOT {{.schema}}.text_free_of_controls(p_operator) THEN
    RAISE EXCEPTION 'outbox: an operator''s name may not hold control or format characters (line breaks, bidi overrides, zero-width characters)'
      USING ERRCODE = 'invalid_parameter_value', COLUMN = 'operator';
  END IF;
  IF NOT {{.schema}}.text_free_of_controls(p_reason) THEN
    RAISE EXCEPTION 'outbox: an operator action''s reason may not hold control or format characters (line breaks, bidi overrides, zero-width characters)'
      USING ERRCODE = 'invalid_parameter_value', COLUMN = 'reason';
  END IF;
END $fn$;

-- pause_rail as migration 035 left it, with the rail type's checks;
-- its standing (SECURITY DEFINER where the roles are in place) is taken
-- before and given back after, as 035 does.
DO $m$
DECLARE
  pause_definer boolean := (SELECT prosecdef FROM pg_proc WHERE oid = '{{.schema}}.pause_rail(text, text, text)'::regprocedure);
BEGIN
  CREATE OR REPLACE FUNCTION {{.schema}}.pause_rail(p_rail_type text, p_operator text, p_reason text) RETURNS boolean
  LANGUAGE plpgsql VOLATILE AS $fn$
  BEGIN
    PERFORM {{.schema}}.operator_check(p_operator, p_reason);
    IF coalesce({{.schema}}.text_is_blank(p_rail_type), true) THEN
      RAISE EXCEPTION 'outbox: a pause needs a rail type (or * for every rail)' USING ERRCODE = 'invalid_parameter_value', COLUMN = 'rail_type';
    END IF;
    -- A rail type as an instruction names one (payment.ValidateText): no
    -- rail's name holds more, and one that did could never be claimed.
    IF NOT {{.schema}}.text_is_identifier(p_rail_type, 200) THEN
      RAISE EXCEPTION 'outbox: a paused rail type must be at most 200 bytes of text without control or format characters (line breaks, bidi overrides, zero-width characters)'
        USING ERRCODE = 'invalid_parameter_value', COLUMN = 'rail_type';
    END IF;
    INSERT INTO {{.schema}}.rail_pauses (rail_type, paused_by, reason) VALUES (p_rail_type, p_operator, p_reason)
    ON CONFLICT (rail_type) DO NOTHING;
    IF NOT FOUND THEN
      RETURN false;
    END IF;
    INSERT INTO {{.schema}}.rail_pause_events (rail_type, action, operator, reason, database_role)
    VALUES (p_rail_type, 'PAUSED', p_operator, p_reason, session_user);
    RETURN true;
  END $fn$;

  IF pause_definer THEN
    ALTER FUNCTION {{.schema}}.pause_rail(text, text, text) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
  END IF;
END $m$;

-- enqueue_pending(_batch) as migration 038 left them, with the checks of
-- the rail type and the correlation id first; their standing likewise.
DO $m$
DECLARE
  one_definer boolean := (SELECT prosecdef FROM pg_proc
                          WHERE oid = '{{.schema}}.enqueue_pending(uuid, text, text, text)'::regprocedure);
  batch_definer boolean := (SELECT prosecdef FROM pg_proc
                            WHERE oid = '{{.schema}}.enqueue_pending_batch(uuid[], text[], text[], text[])'::regprocedure);
BEGIN
  CREATE OR REPLACE FUNCTION {{.schema}}.enqueue_pending(p_outbox_id uuid, p_rail_type text, p_correlation_id text, p_payload text)
  RETURNS void
  LANGUAGE plpgsql VOLATILE AS $fn$
  DECLARE
    bound text[]; -- the login role's tenants; NULL: none, or not read
  BEGIN
    -- What payment.ValidateText refuses (the key row's own text is its
    -- table's checks'): nothing is allocated or inserted.
    IF NOT coalesce({{.schema}}.text_is_identifier(p_rail_type, 200), false) THEN
      RAISE EXCEPTION 'outbox: a rail type must be 1 to 200 bytes of text without control or format characters (line breaks, bidi overrides, zero-width characters) and not spaces only'
        USING ERRCODE = 'invalid_parameter_value', COLUMN = 'rail_type';
    END IF;
    IF coalesce(p_correlation_id, '') <> '' AND NOT {{.schema}}.text_is_identifier(p_correlation_id, 200) THEN
      RAISE EXCEPTION 'outbox: a correlation id must be at most 200 bytes of text without control or format characters (line breaks, bidi overrides, zero-width characters) and not spaces only'
        USING ERRCODE = 'invalid_parameter_value', COLUMN = 'correlation_id';
    END IF;
    IF session_user <> current_user THEN
      bound := (SELECT array_agg(b.tenant_id) FROM {{.schema}}.tenant_bindings b WHERE b.role_name = session_user);
    END IF;
    -- No key row: a duplicate, a mismatch or a retired key, not this
    -- enqueue's; nothing is allocated or inserted.
    WITH k AS (
      SELECT i.tenant_id, i.instruction_id, i.participant_id, i.idempotency_key
      FROM {{.schema}}.idempotency_keys i
      WHERE i.outbox_id = p_outbox_id AND i.sequence_id IS NULL
        AND ((i.tenant_id = coalesce(current_setting('outbox.tenant', true), '') AND (bound IS NULL OR i.tenant_id = ANY (bound)))
             OR {{.schema}}.enqueue_tenant_check(i.tenant_id))
    ), f AS (
      INSERT INTO {{.schema}}.sequences AS s (participant_id, next_sequence_id, queued)
      SELECT k.participant_id, 2, 1 FROM k
      ON CONFLICT ON CONSTRAINT sequences_pkey DO UPDATE
        SET next_sequence_id = s.next_sequence_id + 1, queued = s.queued + 1
      RETURNING s.next_sequence_id - 1 AS sequence_id, s.queued - 1 AS queued_before
    ), inserted AS (
      -- With ordering on, only a participant's head is due at once; the
      -- others wait until the outcome of the one before hands them on.
      INSERT INTO {{.schema}}.pending (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
                                      tenant_id, correlation_id, payload, attempt_count, next_attempt_at, created_at,
                                      zombie_attempt_id)
      SELECT p_outbox_id, k.instruction_id, k.participant_id, f.sequence_id, k.idempotency_key, p_rail_type,
             nullif(k.tenant_id, ''), nullif(p_correlation_id, ''), p_payload::jsonb, 0,
             CASE WHEN f.queued_before = 0 OR NOT (SELECT ordered FROM {{.schema}}.settings) THEN now() ELSE 'infinity' END,
             now(), NULL
      FROM k, f
    )
    UPDATE {{.schema}}.idempotency_keys x SET sequence_id = f.sequence_id
    FROM f WHERE x.outbox_id = p_outbox_id;
  END $fn$;

  CREATE OR REPLACE FUNCTION {{.schema}}.enqueue_pending_batch(p_outbox_ids uuid[], p_rail_types text[], p_correlation_ids text[],
                                                               p_payloads text[])
  RETURNS void
  LANGUAGE plpgsql VOLATILE AS $fn$
  DECLARE
    bound text[]; -- the login role's tenants; NULL: none, or not read
  BEGIN
    IF EXISTS (SELECT 1 FROM unnest(p_rail_types) r WHERE NOT coalesce({{.schema}}.text_is_identifier(r, 200), false)) THEN
      RAISE EXCEPTION 'outbox: a rail type must be 1 to 200 bytes of text without control or format characters (line breaks, bidi overrides, zero-width characters) and not spaces only'
        USING ERRCODE = 'invalid_parameter_value', COLUMN = 'rail_type';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(p_correlation_ids) c WHERE c <> '' AND NOT {{.schema}}.text_is_identifier(c, 200)) THEN
      RAISE EXCEPTION 'outbox: a correlation id must be at most 200 bytes of text without control or format characters (line breaks, bidi overrides, zero-width characters) and not spaces only'
        USING ERRCODE = 'invalid_parameter_value', COLUMN = 'correlation_id';
    END IF;
    IF session_user <> current_user THEN
      bound := (SELECT array_agg(b.tenant_id) FROM {{.schema}}.tenant_bindings b WHERE b.role_name = session_user);
    END IF;
    WITH input AS (
      SELECT * FROM unnest(p_outbox_ids, p_rail_types, p_correlation_ids, p_payloads) WITH ORDINALITY
        AS u(outbox_id, rail_type, correlation_id, payload, ord)
    ), fresh AS (
      SELECT i.*, k.row AS key_row, k.tenant_id, k.instruction_id, k.participant_id, k.idempotency_key
      FROM input i
      CROSS JOIN LATERAL (SELECT k.ctid AS row, k.tenant_id, k.instruction_id, k.participant_id, k.idempotency_key
                          FROM {{.schema}}.idempotency_keys k
                          WHERE k.outbox_id = i.outbox_id AND k.sequence_id IS NULL LIMIT 1) k
      WHERE (k.tenant_id = coalesce(current_setting('outbox.tenant', true), '') AND (bound IS NULL OR k.tenant_id = ANY (bound)))
         OR {{.schema}}.enqueue_tenant_check(k.tenant_id)
    ), counts AS (
      SELECT f.participant_id, count(*)::int AS n FROM fresh f GROUP BY f.participant_id
    ), firsts AS (
      SELECT b.participant_id, b.first_sequence_id, b.queued_before
      FROM {{.schema}}.allocate_sequences((SELECT array_agg(c.participant_id) FROM counts c),
                                          (SELECT array_agg(c.n) FROM counts c)) b
    ), numbered AS (
      SELECT f.*, fi.first_sequence_id + row_number() OVER (PARTITION BY f.participant_id ORDER BY f.ord) - 1 AS sequence_id,
             fi.queued_before = 0 AND row_number() OVER (PARTITION BY f.participant_id ORDER BY f.ord) = 1 AS head
      FROM fresh f JOIN firsts fi USING (participant_id)
    ), inserted AS (
      INSERT INTO {{.schema}}.pending (outbox_id, instruction_id, participant_id, sequence_id, idempotency_key, rail_type,
                                      tenant_id, correlation_id, payload, attempt_count, next_attempt_at, created_at,
                                      zombie_attempt_id)
      SELECT n.outbox_id, n.instruction_id, n.participant_id, n.sequence_id, n.idempotency_key, n.rail_type,
             nullif(n.tenant_id, ''), nullif(n.correlation_id, ''), n.payload::jsonb, 0,
             CASE WHEN n.head OR NOT (SELECT ordered FROM {{.schema}}.settings) THEN now() ELSE 'infinity' END, now(), NULL
      FROM numbered n
    )
    UPDATE {{.schema}}.idempotency_keys k SET sequence_id = n.sequence_id
    FROM numbered n WHERE k.ctid = ANY (ARRAY(SELECT x.key_row FROM numbered x)) AND k.ctid = n.key_row;
  END $fn$;

  IF one_definer THEN
    ALTER FUNCTION {{.schema}}.enqueue_pending(uuid, text, text, text) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
  END IF;
  IF batch_definer THEN
    ALTER FUNCTION {{.schema}}.enqueue_pending_batch(uuid[], text[], text[], text[]) SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
  END IF;
END $m$;

-- A producer's key row: what the validators refuse, NOT VALID (above).
ALTER TABLE {{.schema}}.idempotency_keys
  ADD CONSTRAINT idempotency_keys_instruction_id_text CHECK ({{.schema}}.text_is_identifier(instruction_id, 200)) NOT VALID,
  ADD CONSTRAINT idempotency_keys_participant_id_text CHECK ({{.schema}}.text_is_identifier(participant_id, 200)) NOT VALID,
  -- Printable ASCII, no space at either end: it travels in an HTTP header.
  ADD CONSTRAINT idempotency_keys_idempotency_key_text
    CHECK (octet_length(idempotency_key) <= 200 AND idempotency_key ~ '^[!-~](?:[ -~]*[!-~])?$') NOT VALID,
  -- '' is the rows without a tenant; '*' means every tenant (docs/audit.md).
  ADD CONSTRAINT idempotency_keys_tenant_id_text
    CHECK (tenant_id = '' OR (tenant_id <> '*' AND {{.schema}}.text_is_identifier(tenant_id, 200))) NOT VALID;
