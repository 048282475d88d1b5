-- The pgmq_sdk schema's functions, row-level security and grants. Applied
-- after the versioned migrations on every install: it creates or replaces
-- each object, so running the install again repairs what was dropped (a
-- `DROP EXTENSION pgmq CASCADE`, say) or changed by hand.
--
-- The privilege model: every table is readable and writable by any role
-- (granted to PUBLIC), but row-level security shows and lets change only
-- the rows of queues whose own table grants the caller the matching right:
--
--   keys of a queue       INSERT on the queue's table (the right to send)
--   pause flag, read      SELECT on the queue's table
--   pause flag, change    UPDATE on the queue's table (with it a role can
--                         already hide every message by moving its vt)
--   fleet limit state     UPDATE on the queue's table (pgmq.read needs it)
--   topic keys            held per role: the role that took the key, and
--                         its members
--
-- so a role gains, through this schema, nothing over a queue that PGMQ's
-- own tables do not already give it. TRUNCATE, REFERENCES and TRIGGER are
-- granted to no one, and only the schema's owner creates objects in it.
-- The functions run with the caller's rights (SECURITY INVOKER), except
-- pgmq_sdk.expire_keys, which deletes only rows whose time has passed.
-- Every function runs with search_path = pg_catalog, pg_temp and names
-- PGMQ's and this schema's objects qualified.

-- Grants --------------------------------------------------------------------

REVOKE ALL ON SCHEMA pgmq_sdk FROM PUBLIC;
GRANT USAGE ON SCHEMA pgmq_sdk TO PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA pgmq_sdk FROM PUBLIC;
GRANT SELECT ON pgmq_sdk.schema_version TO PUBLIC;
GRANT SELECT, INSERT, UPDATE, DELETE
    ON pgmq_sdk.queue_keys, pgmq_sdk.topic_keys, pgmq_sdk.paused, pgmq_sdk.running, pgmq_sdk.limits
    TO PUBLIC;
GRANT SELECT, INSERT, UPDATE, DELETE ON pgmq_sdk.workers TO PUBLIC;

-- Row-level security -------------------------------------------------------

ALTER TABLE pgmq_sdk.queue_keys ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS senders ON pgmq_sdk.queue_keys;
CREATE POLICY senders ON pgmq_sdk.queue_keys
    USING (pg_catalog.has_table_privilege(queue_relid, 'INSERT'))
    WITH CHECK (pg_catalog.has_table_privilege(queue_relid, 'INSERT'));

ALTER TABLE pgmq_sdk.topic_keys ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS takers ON pgmq_sdk.topic_keys;
CREATE POLICY takers ON pgmq_sdk.topic_keys
    USING (CASE WHEN EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.oid = taken_by)
                THEN pg_catalog.pg_has_role(taken_by, 'MEMBER') ELSE false END)
    WITH CHECK (taken_by = (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = CURRENT_USER));

ALTER TABLE pgmq_sdk.paused ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS readers ON pgmq_sdk.paused;
CREATE POLICY readers ON pgmq_sdk.paused FOR SELECT
    USING (pg_catalog.has_table_privilege(queue_relid, 'SELECT'));
DROP POLICY IF EXISTS pausers ON pgmq_sdk.paused;
CREATE POLICY pausers ON pgmq_sdk.paused
    USING (pg_catalog.has_table_privilege(queue_relid, 'UPDATE'))
    WITH CHECK (pg_catalog.has_table_privilege(queue_relid, 'UPDATE'));

ALTER TABLE pgmq_sdk.running ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS consumers ON pgmq_sdk.running;
CREATE POLICY consumers ON pgmq_sdk.running
    USING (pg_catalog.has_table_privilege(queue_relid, 'UPDATE'))
    WITH CHECK (pg_catalog.has_table_privilege(queue_relid, 'UPDATE'));

ALTER TABLE pgmq_sdk.limits ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS consumers ON pgmq_sdk.limits;
CREATE POLICY consumers ON pgmq_sdk.limits
    USING (pg_catalog.has_table_privilege(queue_relid, 'UPDATE'))
    WITH CHECK (pg_catalog.has_table_privilege(queue_relid, 'UPDATE'));

-- Worker presence: read by whoever may read the queue, written by whoever
-- may consume from it (UPDATE on its table, as a worker needs anyway).
ALTER TABLE pgmq_sdk.workers ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS readers ON pgmq_sdk.workers;
CREATE POLICY readers ON pgmq_sdk.workers FOR SELECT
    USING (pg_catalog.has_table_privilege(queue_relid, 'SELECT'));
DROP POLICY IF EXISTS consumers ON pgmq_sdk.workers;
CREATE POLICY consumers ON pgmq_sdk.workers
    USING (pg_catalog.has_table_privilege(queue_relid, 'UPDATE'))
    WITH CHECK (pg_catalog.has_table_privilege(queue_relid, 'UPDATE'));

-- Queues -------------------------------------------------------------------

-- The oid of a queue's table, the way PGMQ names it (lower case): what the
-- schema's rows are kept by. Raises 42P01 when there is no such queue.
CREATE OR REPLACE FUNCTION pgmq_sdk.queue_table(queue_name text) RETURNS oid
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    t oid := pg_catalog.to_regclass(pg_catalog.format('pgmq.%I', 'q_' || pg_catalog.lower(queue_name)))::oid;
BEGIN
    IF t IS NULL THEN
        RAISE EXCEPTION 'queue % does not exist: there is no table pgmq.%',
            queue_name, 'q_' || pg_catalog.lower(queue_name) USING ERRCODE = '42P01';
    END IF;
    RETURN t;
END
$fn$;

-- Raises 42501 unless the caller holds `privilege` on the queue table
-- `relid`; `feature` names what needed it.
CREATE OR REPLACE FUNCTION pgmq_sdk.require(relid oid, privilege text, feature text) RETURNS void
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    IF NOT coalesce(pg_catalog.has_table_privilege(relid, privilege), false) THEN
        RAISE EXCEPTION 'permission denied: % needs % on %', feature, privilege, relid::regclass
            USING ERRCODE = '42501';
    END IF;
END
$fn$;

-- Idempotent sends --------------------------------------------------------
--
-- A key is taken for its window from the moment its first send's
-- statement ran, by the database server's clock; once `expires_at` has
-- passed it is free again. The key row is written in the send's own
-- transaction: a rollback leaves the key free, and a second sender of the
-- same key waits for the first's transaction, then sees the key taken (or
-- free, if the first rolled back or its window had passed by then).
--
-- Sends each message whose key is free (or expired) and takes the key for
-- `key_window`; a message whose key is taken (by an earlier send, or by an
-- earlier message of this batch) is not sent, and its row gives the id
-- that the key's first send returned. Rows come back in the order of
-- `msgs`. Keys are inserted in key order, so two batches sharing keys lock
-- them in one order; the send touches no other key (expired keys are
-- deleted by pgmq_sdk.expire_keys, in transactions of their own), so it
-- never waits on a transaction that does not send one of its keys.
--
-- Each key row is written once, already holding its message's id: the
-- ids are drawn from the queue's own sequence (the identity of its
-- msg_id, in the order of `msgs`) before the keys are taken, and the
-- messages of the keys taken are inserted into the queue's table with
-- those ids, the same columns pgmq.send_batch writes. An id drawn for a
-- key that was taken already is never used (a gap in the sequence, as a
-- rolled-back send leaves). Only the keys that were not taken by this
-- call are looked up afterwards, in a statement of their own, so that a
-- key a concurrent sender committed while this one waited is seen.
--
-- enable_seqscan is off inside it: a plan made while queue_keys was empty
-- (just installed, or analyzed after a mass delete) would otherwise read
-- the whole table on every later call of the session.
CREATE OR REPLACE FUNCTION pgmq_sdk.send_batch_keyed(
    queue_name text,
    keys text[],
    msgs jsonb[],
    headers jsonb[],
    delay timestamptz,
    key_window interval
) RETURNS TABLE (msg_id bigint, duplicate boolean)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET enable_seqscan = off AS $fn$
#variable_conflict use_column
DECLARE
    relid oid;
    ids_seq regclass;
    sent bigint[];
    n_sent integer;
BEGIN
    IF cardinality(keys) IS DISTINCT FROM cardinality(msgs)
        OR (headers IS NOT NULL AND cardinality(headers) <> cardinality(msgs)) THEN
        RAISE EXCEPTION 'send_batch_keyed: % keys for % messages and % headers',
            cardinality(keys), cardinality(msgs), cardinality(headers)
            USING ERRCODE = '22023';
    END IF;
    IF array_position(keys, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'send_batch_keyed: a key is NULL' USING ERRCODE = '22004';
    END IF;
    IF key_window <= interval '0' THEN
        RAISE EXCEPTION 'send_batch_keyed: the key window must be positive' USING ERRCODE = '22023';
    END IF;
    relid := pgmq_sdk.queue_table(queue_name);
    PERFORM pgmq_sdk.require(relid, 'INSERT', 'an idempotent send');
    ids_seq := pg_get_serial_sequence(relid::regclass::text, 'msg_id')::regclass;

    WITH firsts AS (
        SELECT DISTINCT ON (u.k) u.k, u.i
        FROM unnest(keys) WITH ORDINALITY AS u(k, i)
        ORDER BY u.k, u.i
    ), drawn AS (
        SELECT f.k, f.i, nextval(ids_seq) AS id
        FROM (SELECT f.k, f.i FROM firsts f ORDER BY f.i) f
    ), taken AS (
        INSERT INTO pgmq_sdk.queue_keys AS s (queue_relid, key, msg_id, sent_at, expires_at)
        SELECT relid, d.k, d.id, clock_timestamp(), clock_timestamp() + key_window
        FROM drawn d
        ORDER BY d.k
        ON CONFLICT ON CONSTRAINT queue_keys_pkey DO UPDATE
            SET msg_id = excluded.msg_id, sent_at = excluded.sent_at, expires_at = excluded.expires_at
            WHERE s.expires_at <= clock_timestamp()
        RETURNING s.key, s.msg_id
    )
    SELECT array_agg(t.msg_id ORDER BY u.i), count(t.msg_id) INTO sent, n_sent
    FROM unnest(keys) WITH ORDINALITY AS u(k, i)
    LEFT JOIN drawn d ON d.i = u.i
    LEFT JOIN taken t ON t.key = d.k;

    IF n_sent > 0 THEN
        EXECUTE pg_catalog.format(
            'INSERT INTO %s (msg_id, vt, message, headers) OVERRIDING SYSTEM VALUE '
            'SELECT o.id, $1, $2[o.i], $3[o.i] '
            'FROM pg_catalog.unnest($4) WITH ORDINALITY AS o(id, i) '
            'WHERE o.id IS NOT NULL ORDER BY o.i', relid::regclass)
        USING delay, msgs, headers, sent;
    END IF;

    RETURN QUERY
        SELECT coalesce(u.id, (SELECT s.msg_id FROM pgmq_sdk.queue_keys s
                               WHERE s.queue_relid = relid AND s.key = u.k)),
               u.id IS NULL
        FROM unnest(keys, sent) WITH ORDINALITY AS u(k, id, i)
        ORDER BY u.i;
END
$fn$;

-- A topic send (pgmq.send_topic) under a key, held per routing key and per
-- role (the role that takes it and its members): routes the message when
-- the key is free; returns the number of queues the key's first send
-- reached.
CREATE OR REPLACE FUNCTION pgmq_sdk.send_topic_keyed(
    routing_key text,
    key text,
    msg jsonb,
    headers jsonb,
    delay integer,
    key_window interval
) RETURNS TABLE (queues integer, duplicate boolean)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET enable_seqscan = off AS $fn$
#variable_conflict use_variable
DECLARE
    me oid := (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = CURRENT_USER);
    fresh boolean := false;
    reached integer;
BEGIN
    IF key IS NULL THEN
        RAISE EXCEPTION 'send_topic_keyed: the key is NULL' USING ERRCODE = '22004';
    END IF;
    IF key_window <= interval '0' THEN
        RAISE EXCEPTION 'send_topic_keyed: the key window must be positive' USING ERRCODE = '22023';
    END IF;
    INSERT INTO pgmq_sdk.topic_keys AS s (routing_key, taken_by, key, queues, sent_at, expires_at)
    VALUES (routing_key, me, key, NULL, clock_timestamp(), clock_timestamp() + key_window)
    ON CONFLICT ON CONSTRAINT topic_keys_pkey DO UPDATE
        SET queues = NULL, sent_at = excluded.sent_at, expires_at = excluded.expires_at
        WHERE s.expires_at <= clock_timestamp()
    RETURNING true INTO fresh;
    IF coalesce(fresh, false) THEN
        reached := pgmq.send_topic(routing_key, msg, headers, delay);
        UPDATE pgmq_sdk.topic_keys s SET queues = reached
        WHERE s.routing_key = send_topic_keyed.routing_key AND s.taken_by = me
          AND s.key = send_topic_keyed.key;
        RETURN QUERY SELECT reached, false;
    ELSE
        RETURN QUERY SELECT s.queues, true FROM pgmq_sdk.topic_keys s
        WHERE s.routing_key = send_topic_keyed.routing_key AND s.taken_by = me
          AND s.key = send_topic_keyed.key;
    END IF;
END
$fn$;

-- Deletes up to `max_rows` expired keys of each kind, passing over rows
-- another transaction holds, and the pause flags and limit state of queues
-- that no longer exist; returns how many rows it deleted. Runs as the
-- schema's owner (it sees every queue's rows), in its own transaction when
-- called on its own, which is how the client calls it: never inside a
-- send, whose locks it would otherwise hold. The deleted rows have no
-- effect left (an expired key is free; a missing queue has nothing to
-- pause), so who calls it changes nothing.
--
-- Queue keys have no index on expires_at (a keyed send would pay an entry
-- in it per message): each call reads one window of `max_rows` / 10
-- blocks of queue_keys (a TID range scan), the next window after the
-- previous call's by the sequence queue_keys_sweep, wrapping at the end of
-- the table. A table of at most one window is swept whole on every call;
-- a larger one over successive calls. An expired key not yet deleted is
-- free all the same: a send takes it over in place.
CREATE OR REPLACE FUNCTION pgmq_sdk.expire_keys(max_rows integer) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET enable_seqscan = off AS $fn$
DECLARE
    now_ts timestamptz := clock_timestamp();
    n integer;
    total integer := 0;
    width bigint := greatest(1, max_rows / 10);
    blocks bigint := pg_catalog.pg_relation_size('pgmq_sdk.queue_keys')
        / pg_catalog.current_setting('block_size')::bigint;
    windows bigint := greatest(1, (blocks + width - 1) / width);
    first_block bigint := (pg_catalog.nextval('pgmq_sdk.queue_keys_sweep') % windows) * width;
BEGIN
    DELETE FROM pgmq_sdk.queue_keys k
    WHERE k.ctid = ANY (ARRAY(
        SELECT e.ctid FROM pgmq_sdk.queue_keys e
        WHERE e.ctid >= pg_catalog.format('(%s,0)', first_block)::tid
          AND e.ctid < pg_catalog.format('(%s,0)', first_block + width)::tid
          AND e.expires_at <= now_ts
        LIMIT max_rows
        FOR UPDATE SKIP LOCKED));
    GET DIAGNOSTICS n = ROW_COUNT;
    total := total + n;
    DELETE FROM pgmq_sdk.topic_keys k
    WHERE k.ctid = ANY (ARRAY(
        SELECT e.ctid FROM pgmq_sdk.topic_keys e
        WHERE e.expires_at <= now_ts
        ORDER BY e.expires_at
        LIMIT max_rows
        FOR UPDATE SKIP LOCKED));
    GET DIAGNOSTICS n = ROW_COUNT;
    total := total + n;
    SET LOCAL enable_seqscan = on;
    DELETE FROM pgmq_sdk.paused p
    WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_class c WHERE c.oid = p.queue_relid);
    GET DIAGNOSTICS n = ROW_COUNT;
    total := total + n;
    DELETE FROM pgmq_sdk.limits l
    WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_class c WHERE c.oid = l.queue_relid);
    GET DIAGNOSTICS n = ROW_COUNT;
    total := total + n;
    DELETE FROM pgmq_sdk.running r
    WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_class c WHERE c.oid = r.queue_relid);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN total + n;
END
$fn$;

-- Forgets every key of a queue (`Pgmq::purge_queue` calls it after
-- purging the queue, whose messages the keys named); returns how many.
CREATE OR REPLACE FUNCTION pgmq_sdk.forget_queue_keys(queue_name text) RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    relid oid := pgmq_sdk.queue_table(queue_name);
    n integer;
BEGIN
    PERFORM pgmq_sdk.require(relid, 'INSERT', 'forgetting the keys of a queue');
    DELETE FROM pgmq_sdk.queue_keys k WHERE k.queue_relid = relid;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$fn$;

-- Pause and resume ---------------------------------------------------------
--
-- A queue listed in pgmq_sdk.paused is paused: workers stop claiming from
-- it (running handlers finish and their acknowledgements are written) until
-- it is resumed. PGMQ's own functions are unaffected: a plain pgmq.read
-- still reads.

-- Pauses a queue; true when it was running until now.
CREATE OR REPLACE FUNCTION pgmq_sdk.pause_queue(queue_name text, reason text) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    relid oid := pgmq_sdk.queue_table(queue_name);
BEGIN
    PERFORM pgmq_sdk.require(relid, 'UPDATE', 'pausing a queue');
    INSERT INTO pgmq_sdk.paused AS p (queue_relid, queue_name, reason)
    VALUES (relid, lower(pause_queue.queue_name), pause_queue.reason)
    ON CONFLICT ON CONSTRAINT paused_pkey DO NOTHING;
    RETURN FOUND;
END
$fn$;

-- Resumes a queue; true when it was paused until now.
CREATE OR REPLACE FUNCTION pgmq_sdk.resume_queue(queue_name text) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    relid oid := pgmq_sdk.queue_table(queue_name);
BEGIN
    PERFORM pgmq_sdk.require(relid, 'UPDATE', 'resuming a queue');
    DELETE FROM pgmq_sdk.paused p WHERE p.queue_relid = relid;
    RETURN FOUND;
END
$fn$;

-- Whether a queue is paused. Raises 42501 when the caller may not read the
-- queue (and so not its flag either): a worker that cannot read the flag
-- is told so, never answered "not paused".
CREATE OR REPLACE FUNCTION pgmq_sdk.queue_paused(queue_name text) RETURNS boolean
LANGUAGE plpgsql STABLE SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    relid oid := pgmq_sdk.queue_table(queue_name);
BEGIN
    PERFORM pgmq_sdk.require(relid, 'SELECT', 'reading whether a queue is paused');
    RETURN EXISTS (SELECT 1 FROM pgmq_sdk.paused p WHERE p.queue_relid = relid);
END
$fn$;

-- Limits across a fleet ----------------------------------------------------
--
-- pgmq.read under a fleet-wide limit: at most `max_running` messages of the
-- queue claimed through this function and still running (NULL: no limit),
-- and at most `per_second` claims per second with bursts of `burst` (NULL:
-- no rate limit).
--
-- A claim counts as running (a row of pgmq_sdk.running) while its message
-- is in the queue with the same delivery (`last_read_at`) and a visibility
-- timeout still ahead. A delete, archive, retry or release ends the
-- delivery and frees the place at once; a crashed worker's place is freed
-- when its visibility timeout passes. Rows that no longer count are
-- deleted by the next limited read. The limited reads of one queue take
-- turns on the queue's row of pgmq_sdk.limits (a row lock, which only a
-- role allowed to read the queue can take), so two never count the same
-- free place.
--
-- It returns the columns of a message as a table rather than PGMQ's
-- message_record type, so that nothing of PGMQ's is a dependency of it:
-- `DROP EXTENSION pgmq CASCADE` leaves it in place.
CREATE OR REPLACE FUNCTION pgmq_sdk.read_limited(
    queue_name text,
    vt_seconds integer,
    qty integer,
    max_running integer,
    per_second double precision,
    burst double precision
) RETURNS TABLE (
    msg_id bigint,
    read_ct integer,
    enqueued_at timestamptz,
    last_read_at timestamptz,
    vt timestamptz,
    message jsonb,
    headers jsonb
)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
#variable_conflict use_column
DECLARE
    relid oid := pgmq_sdk.queue_table(queue_name);
    now_ts timestamptz;
    room integer := qty;
    n_running integer;
    tok double precision;
    refilled timestamptz;
    avail double precision;
    n integer := 0;
BEGIN
    PERFORM pgmq_sdk.require(relid, 'UPDATE', 'a fleet-wide limit');
    INSERT INTO pgmq_sdk.limits AS l (queue_relid) VALUES (relid)
    ON CONFLICT ON CONSTRAINT limits_pkey DO NOTHING;
    SELECT l.tokens, l.refilled_at INTO tok, refilled
    FROM pgmq_sdk.limits l WHERE l.queue_relid = relid FOR UPDATE;
    now_ts := clock_timestamp();
    IF max_running IS NOT NULL THEN
        EXECUTE pg_catalog.format(
            'DELETE FROM pgmq_sdk.running c WHERE c.queue_relid = $1 AND NOT EXISTS ('
            'SELECT 1 FROM %s m WHERE m.msg_id = c.msg_id AND m.last_read_at = c.read_at '
            'AND m.vt > $2)', relid::regclass)
        USING relid, now_ts;
        SELECT count(*)::integer INTO n_running
        FROM pgmq_sdk.running c WHERE c.queue_relid = relid;
        room := least(room, max_running - n_running);
    END IF;
    IF per_second IS NOT NULL THEN
        avail := least(burst, coalesce(tok, burst)
            + greatest(0, extract(epoch FROM now_ts - coalesce(refilled, now_ts))::double precision) * per_second);
        room := least(room, floor(avail)::integer);
    END IF;
    IF room > 0 THEN
        RETURN QUERY
            WITH got AS (
                SELECT r.msg_id, r.read_ct, r.enqueued_at, r.last_read_at, r.vt, r.message, r.headers
                FROM pgmq.read(read_limited.queue_name, vt_seconds, room) r
            ), kept AS (
                INSERT INTO pgmq_sdk.running (queue_relid, msg_id, read_at)
                SELECT relid, g.msg_id, g.last_read_at FROM got g
                WHERE max_running IS NOT NULL
            )
            SELECT g.msg_id, g.read_ct, g.enqueued_at, g.last_read_at, g.vt, g.message, g.headers
            FROM got g;
        GET DIAGNOSTICS n = ROW_COUNT;
    END IF;
    IF per_second IS NOT NULL THEN
        UPDATE pgmq_sdk.limits l SET tokens = avail - n, refilled_at = now_ts
        WHERE l.queue_relid = relid;
    END IF;
END
$fn$;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgmq_sdk FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    pgmq_sdk.queue_table(text),
    pgmq_sdk.require(oid, text, text),
    pgmq_sdk.send_batch_keyed(text, text[], jsonb[], jsonb[], timestamptz, interval),
    pgmq_sdk.send_topic_keyed(text, text, jsonb, jsonb, integer, interval),
    pgmq_sdk.expire_keys(integer),
    pgmq_sdk.forget_queue_keys(text),
    pgmq_sdk.pause_queue(text, text),
    pgmq_sdk.resume_queue(text),
    pgmq_sdk.queue_paused(text),
    pgmq_sdk.read_limited(text, integer, integer, integer, double precision, double precision)
    TO PUBLIC;
