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
--   key limit state       UPDATE on the queue's table (a claim needs it)
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
    ON pgmq_sdk.queue_keys, pgmq_sdk.topic_keys, pgmq_sdk.paused, pgmq_sdk.limit_places, pgmq_sdk.limits,
       pgmq_sdk.key_state, pgmq_sdk.key_running
    TO PUBLIC;
GRANT SELECT, INSERT, UPDATE, DELETE ON pgmq_sdk.workers, pgmq_sdk.claim_cursors TO PUBLIC;

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

ALTER TABLE pgmq_sdk.limit_places ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS consumers ON pgmq_sdk.limit_places;
CREATE POLICY consumers ON pgmq_sdk.limit_places
    USING (pg_catalog.has_table_privilege(queue_relid, 'UPDATE'))
    WITH CHECK (pg_catalog.has_table_privilege(queue_relid, 'UPDATE'));

ALTER TABLE pgmq_sdk.limits ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS consumers ON pgmq_sdk.limits;
CREATE POLICY consumers ON pgmq_sdk.limits
    USING (pg_catalog.has_table_privilege(queue_relid, 'UPDATE'))
    WITH CHECK (pg_catalog.has_table_privilege(queue_relid, 'UPDATE'));

ALTER TABLE pgmq_sdk.key_state ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS consumers ON pgmq_sdk.key_state;
CREATE POLICY consumers ON pgmq_sdk.key_state
    USING (pg_catalog.has_table_privilege(queue_relid, 'UPDATE'))
    WITH CHECK (pg_catalog.has_table_privilege(queue_relid, 'UPDATE'));

ALTER TABLE pgmq_sdk.key_running ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS consumers ON pgmq_sdk.key_running;
CREATE POLICY consumers ON pgmq_sdk.key_running
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
-- One message under one key: what send_batch_keyed does for a batch of
-- one, in plain statements. A single send pays mostly for its statements,
-- not its rows, so this path has no arrays to unnest, no ordering of keys
-- and one dynamic statement, a plain INSERT like pgmq.send's own.
CREATE OR REPLACE FUNCTION pgmq_sdk.send_keyed(
    queue_name text,
    key text,
    msg jsonb,
    headers jsonb,
    delay timestamptz,
    key_window interval
) RETURNS TABLE (msg_id bigint, duplicate boolean)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET enable_seqscan = off AS $fn$
#variable_conflict use_column
DECLARE
    relid oid;
    id bigint;
    taken bigint;
BEGIN
    IF key IS NULL THEN
        RAISE EXCEPTION 'send_keyed: the key is NULL' USING ERRCODE = '22004';
    END IF;
    IF key_window <= interval '0' THEN
        RAISE EXCEPTION 'send_keyed: the key window must be positive' USING ERRCODE = '22023';
    END IF;
    relid := pgmq_sdk.queue_table(queue_name);
    PERFORM pgmq_sdk.require(relid, 'INSERT', 'an idempotent send');
    id := nextval(pg_get_serial_sequence(relid::regclass::text, 'msg_id')::regclass);
    INSERT INTO pgmq_sdk.queue_keys AS s (msg_id, expires_at, queue_relid, key)
    VALUES (id, clock_timestamp() + key_window, relid, send_keyed.key)
    ON CONFLICT ON CONSTRAINT queue_keys_pkey DO UPDATE
        SET msg_id = excluded.msg_id, expires_at = excluded.expires_at
        WHERE s.expires_at <= clock_timestamp()
    RETURNING s.msg_id INTO taken;
    IF taken IS NULL THEN
        -- Taken before: its row is committed (a concurrent sender's insert
        -- was waited for), so this statement's snapshot sees it.
        RETURN QUERY SELECT s.msg_id, true FROM pgmq_sdk.queue_keys s
            WHERE s.queue_relid = relid AND s.key = send_keyed.key;
        RETURN;
    END IF;
    EXECUTE pg_catalog.format(
        'INSERT INTO %s (msg_id, vt, message, headers) OVERRIDING SYSTEM VALUE '
        'VALUES ($1, $2, $3, $4)', relid::regclass)
    USING id, delay, msg, headers;
    RETURN QUERY SELECT id, false;
END
$fn$;

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
-- messages are inserted into the queue's table with those ids, the same
-- columns pgmq.send_batch writes.
--
-- Two paths. The first expects every key to be new, the common case: one
-- statement draws the ids, inserts the keys with a plain INSERT and the
-- messages, so that each key costs one descent of the key table's primary
-- key (its insert, with the unique check) and no speculative insertion. A
-- key already in the table, or twice in the batch, fails that statement
-- with a unique violation; a key another transaction is inserting makes
-- it wait for that transaction first, like any unique check. The
-- statement runs in a subtransaction of its own (the EXCEPTION block), so
-- that failure undoes all of it, and the second path then runs: each
-- distinct key inserted with ON CONFLICT, an expired key taken over in
-- place, and the messages of the keys taken inserted. An id drawn for a
-- message that was not sent is never used (a gap in the sequence, as a
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

    -- Every key new: keys and messages in one statement.
    BEGIN
        EXECUTE pg_catalog.format(
            'WITH drawn AS ('
            '  SELECT u.k, u.m, u.h, u.i, pg_catalog.nextval($1) AS id'
            '  FROM unnest($2, $3, $4) WITH ORDINALITY AS u(k, m, h, i)'
            '), keyed AS ('
            '  INSERT INTO pgmq_sdk.queue_keys (msg_id, expires_at, queue_relid, key)'
            '  SELECT d.id, pg_catalog.clock_timestamp() + $5, $6, d.k'
            '  FROM drawn d ORDER BY d.k COLLATE "C"'
            '), sent AS ('
            '  INSERT INTO %s (msg_id, vt, message, headers) OVERRIDING SYSTEM VALUE'
            '  SELECT d.id, $7, d.m, d.h FROM drawn d ORDER BY d.i'
            ') SELECT pg_catalog.array_agg(d.id ORDER BY d.i) FROM drawn d', relid::regclass)
        INTO sent
        USING ids_seq, keys, msgs, headers, key_window, relid, delay;
        RETURN QUERY SELECT u.id, false FROM unnest(sent) AS u(id);
        RETURN;
    EXCEPTION WHEN unique_violation THEN
        NULL;
    END;

    -- Some key taken (or given twice): each distinct key, in key order.
    WITH firsts AS (
        SELECT DISTINCT ON (u.k COLLATE "C") u.k, u.i
        FROM unnest(keys) WITH ORDINALITY AS u(k, i)
        ORDER BY u.k COLLATE "C", u.i
    ), drawn AS (
        SELECT f.k, f.i, nextval(ids_seq) AS id
        FROM (SELECT f.k, f.i FROM firsts f ORDER BY f.i) f
    ), taken AS (
        INSERT INTO pgmq_sdk.queue_keys AS s (msg_id, expires_at, queue_relid, key)
        SELECT d.id, clock_timestamp() + key_window, relid, d.k
        FROM drawn d
        ORDER BY d.k COLLATE "C"
        ON CONFLICT ON CONSTRAINT queue_keys_pkey DO UPDATE
            SET msg_id = excluded.msg_id, expires_at = excluded.expires_at
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
            'SELECT u.id, $1, u.m, u.h '
            'FROM unnest($2, $3, $4) WITH ORDINALITY AS u(id, m, h, i) '
            'WHERE u.id IS NOT NULL ORDER BY u.i', relid::regclass)
        USING delay, sent, msgs, headers;
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
    DELETE FROM pgmq_sdk.limit_places r
    WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_class c WHERE c.oid = r.queue_relid);
    GET DIAGNOSTICS n = ROW_COUNT;
    total := total + n;
    DELETE FROM pgmq_sdk.key_running r
    WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_class c WHERE c.oid = r.queue_relid);
    GET DIAGNOSTICS n = ROW_COUNT;
    total := total + n;
    -- A key's state with a full bucket and no claim of the key recorded is
    -- the same as no row (see pgmq_sdk.read_key_limited); rows a claim
    -- holds are passed over.
    DELETE FROM pgmq_sdk.key_state s
    WHERE s.ctid = ANY (ARRAY(
        SELECT e.ctid FROM pgmq_sdk.key_state e
        WHERE (e.full_at IS NULL OR e.full_at <= now_ts)
          AND (NOT EXISTS (SELECT 1 FROM pg_catalog.pg_class c WHERE c.oid = e.queue_relid)
               OR NOT EXISTS (SELECT 1 FROM pgmq_sdk.key_running r
                              WHERE r.queue_relid = e.queue_relid AND r.key = e.key))
        LIMIT max_rows
        FOR UPDATE SKIP LOCKED));
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
-- The places: a limit of N places has N rows of pgmq_sdk.limit_places for
-- the queue (made by the first read that needs them), each holding the
-- claim that took it last (`msg_id`, `read_at`). A place is free while it
-- holds no claim, or its claim has ended: its message is gone from the
-- queue, or in it with another delivery (`last_read_at`), or its
-- visibility timeout has passed. A delete, archive, retry or release ends
-- the delivery and frees the place at once; a crashed worker's place is
-- freed when its visibility timeout passes. No process has to tell another.
--
-- A read of up to `qty` messages:
--   1. locks up to `qty` places among 1..max_running that look free, in
--      the order of the index on read_at (never used first, then the oldest
--      claim), passing over places another read holds (FOR UPDATE SKIP
--      LOCKED): reads of one queue take different places and never wait for
--      each other;
--   2. looks again, in a statement of its own (its own snapshot, taken once
--      the locks are held), which of the locked places are free: a place
--      whose claim committed after step 1 began is seen taken, so two reads
--      never take one place;
--   3. claims with pgmq.read at most as many messages as places are free
--      (and as the bucket allows) and writes each message's claim into a
--      place, in the same transaction as the claim.
-- Under a rate limit the reads of a queue also take turns on its row of
-- pgmq_sdk.limits, which holds the token bucket (a row lock, which only a
-- role allowed to read the queue can take). Bitmap scans are off inside
-- the function: a plain index scan stops at the places it needs, and
-- marks the entries of dead row versions for later scans to skip.
--
-- The limit must be the same in every process that reads the queue this
-- way: a read counts only the places up to its own `max_running`.
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
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET enable_bitmapscan = off AS $fn$
#variable_conflict use_column
DECLARE
    relid oid := pgmq_sdk.queue_table(queue_name);
    now_ts timestamptz;
    room integer := qty;
    tok double precision;
    refilled timestamptz;
    avail double precision;
    locked integer[];
    free_places integer[];
    n integer := 0;
BEGIN
    PERFORM pgmq_sdk.require(relid, 'UPDATE', 'a fleet-wide limit');
    IF per_second IS NOT NULL THEN
        INSERT INTO pgmq_sdk.limits AS l (queue_relid) VALUES (relid)
        ON CONFLICT ON CONSTRAINT limits_pkey DO NOTHING;
        SELECT l.tokens, l.refilled_at INTO tok, refilled
        FROM pgmq_sdk.limits l WHERE l.queue_relid = relid FOR UPDATE;
    END IF;
    IF max_running IS NOT NULL AND room > 0 THEN
        IF NOT EXISTS (SELECT 1 FROM pgmq_sdk.limit_places p
                       WHERE p.queue_relid = relid AND p.place = max_running) THEN
            INSERT INTO pgmq_sdk.limit_places (queue_relid, place)
            SELECT relid, g FROM pg_catalog.generate_series(1, max_running) g
            ON CONFLICT ON CONSTRAINT limit_places_pkey DO NOTHING;
        END IF;
        EXECUTE pg_catalog.format(
            'SELECT pg_catalog.array_agg(s.place) FROM ('
            'SELECT p.place FROM pgmq_sdk.limit_places p '
            'WHERE p.queue_relid = $1 AND p.place <= $2 AND (p.msg_id IS NULL OR NOT EXISTS ('
            'SELECT 1 FROM %1$s m WHERE m.msg_id = p.msg_id AND m.last_read_at = p.read_at '
            'AND m.vt > $3)) '
            'ORDER BY p.queue_relid, p.read_at NULLS FIRST LIMIT $4 FOR UPDATE OF p SKIP LOCKED) s',
            relid::regclass)
        INTO locked USING relid, max_running, clock_timestamp(), room;
        now_ts := clock_timestamp();
        EXECUTE pg_catalog.format(
            'SELECT pg_catalog.array_agg(p.place) FROM pgmq_sdk.limit_places p '
            'WHERE p.queue_relid = $1 AND p.place = ANY ($2) AND (p.msg_id IS NULL OR NOT EXISTS ('
            'SELECT 1 FROM %1$s m WHERE m.msg_id = p.msg_id AND m.last_read_at = p.read_at '
            'AND m.vt > $3))',
            relid::regclass)
        INTO free_places USING relid, coalesce(locked, '{}'), now_ts;
        room := least(room, coalesce(pg_catalog.cardinality(free_places), 0));
    ELSE
        now_ts := clock_timestamp();
    END IF;
    IF per_second IS NOT NULL THEN
        avail := least(burst, coalesce(tok, burst)
            + greatest(0, extract(epoch FROM now_ts - coalesce(refilled, now_ts))::double precision) * per_second);
        room := least(room, floor(avail)::integer);
    END IF;
    IF room > 0 THEN
        RETURN QUERY
            WITH got AS (
                SELECT r.msg_id, r.read_ct, r.enqueued_at, r.last_read_at, r.vt, r.message, r.headers,
                       (pg_catalog.row_number() OVER ())::integer AS i
                FROM pgmq.read(read_limited.queue_name, vt_seconds, room) r
            ), kept AS (
                UPDATE pgmq_sdk.limit_places p SET msg_id = g.msg_id, read_at = g.last_read_at
                FROM got g
                WHERE max_running IS NOT NULL AND p.queue_relid = relid
                  AND p.place = free_places[g.i]
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

-- A worker's acknowledgements and its next claims under a fleet-wide limit
-- of places, in one transaction: deletes the messages these deliveries
-- still hold (`ack_ids` with their `ack_read_ats`, fenced as the worker's
-- own deletes are: a row whose delivery has changed is left alone), then
-- reads as pgmq_sdk.read_limited does, in a statement of its own that sees
-- the places the deletes freed. Rows with `acked` true are the ids
-- deleted (their other columns NULL); the rest are the messages claimed.
-- A worker pays one round trip and one commit for both, where a delete
-- and a claim each cost one: what a place waits for between two runs.
-- Needs DELETE on the queue's table besides what read_limited needs.
CREATE OR REPLACE FUNCTION pgmq_sdk.ack_read_limited(
    queue_name text,
    ack_ids bigint[],
    ack_read_ats timestamptz[],
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
    headers jsonb,
    acked boolean
)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
#variable_conflict use_column
DECLARE
    relid oid := pgmq_sdk.queue_table(queue_name);
    deleted bigint[];
BEGIN
    IF cardinality(ack_ids) IS DISTINCT FROM cardinality(ack_read_ats) THEN
        RAISE EXCEPTION 'ack_read_limited: % ids for % read times',
            cardinality(ack_ids), cardinality(ack_read_ats) USING ERRCODE = '22023';
    END IF;
    EXECUTE pg_catalog.format(
        'WITH d AS (DELETE FROM %s AS m '
        'USING ROWS FROM (pg_catalog.unnest($1::bigint[]), pg_catalog.unnest($2::timestamptz[])) AS r(id, read_at) '
        'WHERE m.msg_id = r.id AND m.last_read_at = r.read_at AND m.msg_id = ANY($1::bigint[]) '
        'RETURNING m.msg_id) SELECT pg_catalog.array_agg(d.msg_id) FROM d',
        relid::regclass)
    INTO deleted USING ack_ids, ack_read_ats;
    RETURN QUERY
        SELECT u.id, NULL::integer, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz,
               NULL::jsonb, NULL::jsonb, true
        FROM pg_catalog.unnest(deleted) AS u(id);
    RETURN QUERY
        SELECT r.msg_id, r.read_ct, r.enqueued_at, r.last_read_at, r.vt, r.message, r.headers, false
        FROM pgmq_sdk.read_limited(ack_read_limited.queue_name, vt_seconds, qty, max_running,
                                   per_second, burst) r;
END
$fn$;

-- Limits per key -----------------------------------------------------------
--
-- A claim of up to `qty` messages of a queue under a limit per key: each
-- message's key is its headers' (key_in_headers) or its body's value at
-- `key_path` (the `#>>` operator: a text, or NULL), and a key may have at
-- most `max_running` claims running (NULL: no such limit) and take at most
-- `per_second` claims a second with bursts of `burst` (NULL: no rate
-- limit). A message without a key is not limited. The key's path is a
-- parameter: no caller's text becomes SQL.
--
-- A key's claim counts as running (a row of pgmq_sdk.key_running) the way
-- a fleet-wide limit's does: while its message is in the queue with the
-- same delivery (`last_read_at`) and a visibility timeout still ahead. A
-- delete, archive, retry or release ends the delivery and frees the place
-- at once; a killed worker's place is freed when its visibility timeout
-- passes.
--
-- The steps, each a statement of its own (each sees what the claims
-- committed before it began):
--   1. the keys at a limit now: those with max_running claims running,
--      and those whose bucket holds less than a claim;
--   2. up to `qty` visible messages in msg_id order whose key is not one
--      of them, locked and passing over messages another claim holds
--      (FOR UPDATE SKIP LOCKED, as pgmq.read): the messages of a key at
--      its limit stay in the queue, unread and unchanged, and never stand
--      in front of other keys' messages;
--   3. a transaction advisory lock on each of their keys, tried, never
--      waited for (pg_try_advisory_xact_lock, in a lock space of the
--      queue's own, on the key's hash): a key is claimed by one
--      transaction at a time, a claim never waits for another's key, and
--      no lock order is needed, as no claim waits for any;
--   4. (nothing: locks taken, nothing written);
--   5. each locked key's room (its limit less its running claims, and its
--      bucket of pgmq_sdk.key_state refilled up to `burst`), and the first
--      messages of each key that fit, with every message without a key;
--   6. the buckets of the locked keys charged (under a rate limit), and
--      the claim: the messages' visibility timeout, read count and
--      last_read_at set as pgmq.read sets them, a running row written for
--      each keyed message (under a limit of places);
--   7. running rows whose messages are gone (below the queue's lowest
--      msg_id) deleted, up to 100 at a time, passing over rows another
--      transaction holds; under a rate limit, now and then, full buckets
--      of keys with nothing running (pgmq_sdk.expire_keys deletes them
--      too).
-- A candidate whose key is not locked, or has no room, is left as it was.
-- A running claim is checked against its message with the message's
-- primary key (a subquery per row), whatever the planner thinks of the
-- tables' sizes. Two keys whose hashes collide share a lock: one of them
-- waits a claim, never more. A role that may connect can hold a key's
-- advisory lock and so hold back that key's claims; it cannot make them
-- pass the limit. Bitmap scans are off inside it, as in read_limited:
-- pgmq_sdk.key_running gains and loses a row per claim, and only a plain
-- index scan marks the entries of its dead rows for later scans to skip.
--
-- The limits must be the same in every process that reads the queue this
-- way. A plain pgmq.read of the queue is neither counted nor limited.
CREATE OR REPLACE FUNCTION pgmq_sdk.read_key_limited(
    queue_name text,
    vt_seconds integer,
    qty integer,
    key_in_headers boolean,
    key_path text[],
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
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET enable_bitmapscan = off AS $fn$
#variable_conflict use_column
DECLARE
    relid oid := pgmq_sdk.queue_table(queue_name);
    q text;
    now_ts timestamptz;
    blocked text[] := '{}';
    cand_ids bigint[];
    cand_keys text[];
    held text[];
    -- The advisory lock space of the queue's keys.
    lock_space integer := pg_catalog.hashtext('pgmq_sdk.read_key_limited:' || relid::text);
    room_keys text[];
    room_n integer[];
    room_avail double precision[];
    chosen bigint[];
BEGIN
    PERFORM pgmq_sdk.require(relid, 'UPDATE', 'a limit per key');
    IF key_in_headers IS NULL OR coalesce(cardinality(key_path), 0) = 0
        OR array_position(key_path, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'read_key_limited: give the key''s place: headers or body, and a path'
            USING ERRCODE = '22023';
    END IF;
    IF (max_running IS NULL AND per_second IS NULL) OR max_running < 1
        OR per_second <= 0 OR per_second = 'NaN'::float8 OR per_second = 'Infinity'::float8
        OR (per_second IS NOT NULL AND (burst IS NULL OR burst < 1 OR burst = 'NaN'::float8
                                        OR burst = 'Infinity'::float8))
        OR vt_seconds < 0 OR qty < 1 THEN
        RAISE EXCEPTION 'read_key_limited: a limit of % running, % a second (burst %), vt %, qty %',
            max_running, per_second, burst, vt_seconds, qty USING ERRCODE = '22023';
    END IF;
    -- Each step must see what claims committed before it: a snapshot
    -- held for the whole transaction would count a key's claims as they
    -- were at its start.
    IF pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'read_key_limited: needs READ COMMITTED, not %',
            pg_catalog.current_setting('transaction_isolation') USING ERRCODE = '25001';
    END IF;
    q := relid::regclass::text;
    now_ts := clock_timestamp();

    -- 1.
    IF max_running IS NOT NULL THEN
        EXECUTE pg_catalog.format(
            'SELECT coalesce(array_agg(b.key), ''{}'') FROM ('
            'SELECT c.key FROM pgmq_sdk.key_running c '
            'WHERE c.queue_relid = $1 AND coalesce((SELECT m.last_read_at = c.read_at AND m.vt > $2 '
            'FROM %s m WHERE m.msg_id = c.msg_id), false) '
            'GROUP BY c.key HAVING count(*) >= $3) b', q)
        INTO blocked USING relid, now_ts, max_running;
    END IF;
    IF per_second IS NOT NULL THEN
        blocked := blocked || ARRAY(
            SELECT s.key FROM pgmq_sdk.key_state s
            WHERE s.queue_relid = relid AND s.next_token_at > now_ts);
    END IF;

    -- 2.
    EXECUTE pg_catalog.format(
        'SELECT array_agg(c.msg_id ORDER BY c.msg_id), array_agg(c.k ORDER BY c.msg_id) FROM ('
        'SELECT m.msg_id, x.k FROM %s m '
        'CROSS JOIN LATERAL (SELECT CASE WHEN $1 THEN m.headers #>> $2 ELSE m.message #>> $2 END AS k) x '
        'WHERE m.vt <= $3 AND (x.k IS NULL OR x.k <> ALL ($4)) '
        'ORDER BY m.msg_id LIMIT $5 FOR UPDATE OF m SKIP LOCKED) c', q)
    INTO cand_ids, cand_keys USING key_in_headers, key_path, now_ts, blocked, qty;
    IF cand_ids IS NULL THEN
        RETURN;
    END IF;

    -- 3.
    held := ARRAY(
        SELECT k FROM (SELECT DISTINCT k FROM unnest(cand_keys) k WHERE k IS NOT NULL) d
        WHERE pg_catalog.pg_try_advisory_xact_lock(lock_space, pg_catalog.hashtext(k)));

    -- 5.
    IF cardinality(held) > 0 THEN
        IF max_running IS NOT NULL THEN
            EXECUTE pg_catalog.format(
                'DELETE FROM pgmq_sdk.key_running d WHERE d.ctid = ANY (ARRAY('
                'SELECT c.ctid FROM pgmq_sdk.key_running c '
                'WHERE c.queue_relid = $1 AND c.key = ANY ($2) AND NOT coalesce(('
                'SELECT m.last_read_at = c.read_at AND m.vt > $3 '
                'FROM %s m WHERE m.msg_id = c.msg_id), false) FOR UPDATE SKIP LOCKED))', q)
            USING relid, held, now_ts;
        END IF;
        EXECUTE pg_catalog.format(
            'SELECT array_agg(h.key), array_agg(least('
            '  CASE WHEN $3 IS NULL THEN $5 ELSE $3 - coalesce(r.n, 0) END,'
            '  CASE WHEN $4 IS NULL THEN $5 ELSE floor(coalesce(b.avail, $6))::integer END)),'
            ' array_agg(coalesce(b.avail, $6)) '
            'FROM unnest($2::text[]) h(key) '
            'LEFT JOIN (SELECT c.key, count(*)::integer AS n FROM pgmq_sdk.key_running c '
            '  WHERE c.queue_relid = $1 AND c.key = ANY ($2) AND $3 IS NOT NULL AND coalesce(('
            '  SELECT m.last_read_at = c.read_at AND m.vt > $7 FROM %s m WHERE m.msg_id = c.msg_id), false) '
            '  GROUP BY c.key) r '
            '  ON r.key = h.key '
            'LEFT JOIN (SELECT s.key, least($6, coalesce(s.tokens, $6) + greatest(0, '
            '  extract(epoch FROM $7 - coalesce(s.refilled_at, $7))::double precision) * $4) AS avail '
            '  FROM pgmq_sdk.key_state s WHERE s.queue_relid = $1 AND s.key = ANY ($2)) b '
            '  ON b.key = h.key', q)
        INTO room_keys, room_n, room_avail
        USING relid, held, max_running, per_second, qty, burst, now_ts;
    END IF;
    chosen := ARRAY(
        SELECT c.id FROM (
            SELECT c.id, c.k, row_number() OVER (PARTITION BY c.k ORDER BY c.id) AS rn
            FROM unnest(cand_ids, cand_keys) AS c(id, k)) c
        LEFT JOIN unnest(room_keys, room_n) AS r(key, n) ON r.key = c.k
        WHERE c.k IS NULL OR c.rn <= r.n
        ORDER BY c.id);

    -- 6.
    IF per_second IS NOT NULL AND cardinality(held) > 0 THEN
        INSERT INTO pgmq_sdk.key_state AS s
            (queue_relid, key, tokens, refilled_at, next_token_at, full_at)
        SELECT relid, v.key, v.left_over, now_ts,
            CASE WHEN v.left_over < 1
                THEN now_ts + pg_catalog.make_interval(secs => (1 - v.left_over) / per_second) END,
            CASE WHEN v.left_over < burst
                THEN now_ts + pg_catalog.make_interval(secs => (burst - v.left_over) / per_second) END
        FROM (
            SELECT r.key, r.avail - (SELECT count(*) FROM unnest(cand_ids, cand_keys) AS c(id, k)
                                     WHERE c.k = r.key AND c.id = ANY (chosen)) AS left_over
            FROM unnest(room_keys, room_avail) AS r(key, avail)
        ) v
        ORDER BY v.key
        ON CONFLICT ON CONSTRAINT key_state_pkey DO UPDATE
            SET tokens = excluded.tokens, refilled_at = excluded.refilled_at,
                next_token_at = excluded.next_token_at, full_at = excluded.full_at;
    END IF;
    IF cardinality(chosen) > 0 THEN
        RETURN QUERY EXECUTE pg_catalog.format(
            'WITH got AS ('
            'UPDATE %s m SET vt = $2 + pg_catalog.make_interval(secs => $3), '
            'read_ct = m.read_ct + 1, last_read_at = $2 WHERE m.msg_id = ANY ($1) '
            'RETURNING m.msg_id, m.read_ct, m.enqueued_at, m.last_read_at, m.vt, m.message, m.headers'
            '), kept AS ('
            'INSERT INTO pgmq_sdk.key_running (queue_relid, key, msg_id, read_at) '
            'SELECT $4, c.k, g.msg_id, g.last_read_at FROM got g '
            'JOIN unnest($5::bigint[], $6::text[]) AS c(id, k) ON c.id = g.msg_id '
            'WHERE c.k IS NOT NULL AND $7'
            ') SELECT g.msg_id, g.read_ct, g.enqueued_at, g.last_read_at, g.vt, g.message, g.headers '
            'FROM got g ORDER BY g.msg_id', q)
        USING chosen, now_ts, vt_seconds, relid, cand_ids, cand_keys, max_running IS NOT NULL;
    END IF;

    -- 7.
    IF max_running IS NOT NULL THEN
        EXECUTE pg_catalog.format(
            'DELETE FROM pgmq_sdk.key_running d WHERE d.ctid = ANY (ARRAY('
            'SELECT c.ctid FROM pgmq_sdk.key_running c WHERE c.queue_relid = $1 '
            'AND c.msg_id < coalesce((SELECT min(m.msg_id) FROM %s m), '
            '(SELECT max(e.msg_id) + 1 FROM pgmq_sdk.key_running e WHERE e.queue_relid = $1)) '
            'ORDER BY c.msg_id LIMIT 100 FOR UPDATE SKIP LOCKED))', q)
        USING relid;
    END IF;
    -- About one claim in twenty: up to 100 of the queue's full buckets of
    -- keys with nothing running, the same as no row.
    IF per_second IS NOT NULL AND pg_catalog.random() < 0.05 THEN
        DELETE FROM pgmq_sdk.key_state d WHERE d.ctid = ANY (ARRAY(
            SELECT s.ctid FROM pgmq_sdk.key_state s
            WHERE s.queue_relid = relid AND (s.full_at IS NULL OR s.full_at <= now_ts)
              AND NOT EXISTS (SELECT 1 FROM pgmq_sdk.key_running r
                              WHERE r.queue_relid = relid AND r.key = s.key)
            LIMIT 100 FOR UPDATE SKIP LOCKED));
    END IF;
END
$fn$;

REVOKE ALL ON ALL FUNCTIONS IN SCHEMA pgmq_sdk FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    pgmq_sdk.queue_table(text),
    pgmq_sdk.require(oid, text, text),
    pgmq_sdk.send_keyed(text, text, jsonb, jsonb, timestamptz, interval),
    pgmq_sdk.send_batch_keyed(text, text[], jsonb[], jsonb[], timestamptz, interval),
    pgmq_sdk.send_topic_keyed(text, text, jsonb, jsonb, integer, interval),
    pgmq_sdk.expire_keys(integer),
    pgmq_sdk.forget_queue_keys(text),
    pgmq_sdk.pause_queue(text, text),
    pgmq_sdk.resume_queue(text),
    pgmq_sdk.queue_paused(text),
    pgmq_sdk.read_limited(text, integer, integer, integer, double precision, double precision),
    pgmq_sdk.ack_read_limited(text, bigint[], timestamptz[], integer, integer, integer, double precision, double precision),
    pgmq_sdk.read_key_limited(text, integer, integer, boolean, text[], integer, double precision, double precision)
    TO PUBLIC;

-- Periodic sends -------------------------------------------------------------
--
-- A schedule's row is visible to a role that may read or send to its queue
-- (SELECT or INSERT on the queue's table) and can be created, changed,
-- paused, fired or removed by a role that may send to it (INSERT): firing
-- it is a send. The tick times are computed by the client (pgmq-client's
-- cron and interval arithmetic) from the database's clock, which
-- pgmq_sdk.due_schedules returns; pgmq_sdk.fire_schedule refuses a tick
-- later than that clock.

GRANT SELECT, INSERT, UPDATE, DELETE ON pgmq_sdk.schedules TO PUBLIC;

ALTER TABLE pgmq_sdk.schedules ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS readers ON pgmq_sdk.schedules;
CREATE POLICY readers ON pgmq_sdk.schedules FOR SELECT
    USING (pg_catalog.has_table_privilege(queue_relid, 'SELECT'));
DROP POLICY IF EXISTS senders ON pgmq_sdk.schedules;
CREATE POLICY senders ON pgmq_sdk.schedules
    USING (pg_catalog.has_table_privilege(queue_relid, 'INSERT'))
    WITH CHECK (pg_catalog.has_table_privilege(queue_relid, 'INSERT'));

-- Creates the schedule `schedule_name`, or replaces its spec (keeping
-- whether it is paused, and what it sent): true when it was created. A
-- changed spec starts over from now: its first tick is the first after
-- this call, ticks of the old spec not sent by now are not sent.
CREATE OR REPLACE FUNCTION pgmq_sdk.put_schedule(
    schedule_name text,
    queue_name text,
    cron text,
    time_zone text,
    every interval,
    message jsonb,
    headers jsonb,
    catch_up integer
) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
#variable_conflict use_variable
DECLARE
    relid oid := pgmq_sdk.queue_table(queue_name);
    created boolean;
BEGIN
    PERFORM pgmq_sdk.require(relid, 'INSERT', 'a schedule');
    INSERT INTO pgmq_sdk.schedules AS s
        (name, queue_relid, queue_name, cron, time_zone, every, message, headers, catch_up)
    VALUES (schedule_name, relid, lower(queue_name), cron, coalesce(time_zone, 'UTC'), every,
            message, headers, catch_up)
    ON CONFLICT ON CONSTRAINT schedules_pkey DO UPDATE
        SET queue_relid = excluded.queue_relid, queue_name = excluded.queue_name,
            cron = excluded.cron, time_zone = excluded.time_zone, every = excluded.every,
            message = excluded.message, headers = excluded.headers,
            catch_up = excluded.catch_up, next_tick = NULL,
            changed_at = clock_timestamp()
    RETURNING (xmax = 0) INTO created;
    RETURN created;
END
$fn$;

-- Pauses (paused = true) or resumes a schedule: true when that changed
-- it. A resumed schedule starts over from now: ticks due while it was
-- paused are not sent.
CREATE OR REPLACE FUNCTION pgmq_sdk.pause_schedule(schedule_name text, paused boolean) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
#variable_conflict use_variable
BEGIN
    UPDATE pgmq_sdk.schedules s
    SET paused = paused,
        next_tick = CASE WHEN paused THEN s.next_tick END,
        changed_at = CASE WHEN paused THEN s.changed_at ELSE clock_timestamp() END
    WHERE s.name = schedule_name AND s.paused IS DISTINCT FROM paused;
    RETURN FOUND;
END
$fn$;

-- Removes a schedule: true when there was one.
CREATE OR REPLACE FUNCTION pgmq_sdk.remove_schedule(schedule_name text) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
#variable_conflict use_variable
BEGIN
    DELETE FROM pgmq_sdk.schedules s WHERE s.name = schedule_name;
    RETURN FOUND;
END
$fn$;

-- The schedules due by the database's clock (now_ts, returned on each row)
-- that the caller may fire, earliest first, at most `max_rows`: the ones
-- not paused whose next tick has come, or whose next tick is not placed
-- yet (just created, changed or resumed). Takes no lock: the firing is
-- fenced on what this returned.
CREATE OR REPLACE FUNCTION pgmq_sdk.due_schedules(max_rows integer) RETURNS TABLE (
    name text,
    cron text,
    time_zone text,
    every_ms bigint,
    catch_up integer,
    next_tick timestamptz,
    changed_at timestamptz,
    now_ts timestamptz
)
LANGUAGE sql SET search_path = pg_catalog, pg_temp AS $fn$
    SELECT s.name, s.cron, s.time_zone,
           (extract(epoch FROM s.every) * 1000)::bigint,
           s.catch_up, s.next_tick, s.changed_at, clock_timestamp()
    FROM pgmq_sdk.schedules s
    WHERE NOT s.paused
      AND (s.next_tick IS NULL OR s.next_tick <= clock_timestamp())
      AND pg_catalog.has_table_privilege(s.queue_relid, 'INSERT')
    ORDER BY s.next_tick NULLS FIRST
    LIMIT max_rows
$fn$;

-- Fires a schedule: sends its message once for each of `ticks` (in
-- order, each with the headers x-pgmq-schedule and x-pgmq-tick added to
-- its own) and moves its next tick to `new_next`, in one statement, when
-- the schedule is still as the caller read it (not paused, the same
-- next_tick and changed_at) and no other transaction holds its row;
-- otherwise it does nothing and returns no rows. Returns each sent
-- message's id and tick. Raises 22023 for a tick later than the
-- database's clock or a next tick not after the last tick.
CREATE OR REPLACE FUNCTION pgmq_sdk.fire_schedule(
    schedule_name text,
    seen_next timestamptz,
    seen_changed timestamptz,
    ticks timestamptz[],
    new_next timestamptz
) RETURNS TABLE (msg_id bigint, tick timestamptz)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
#variable_conflict use_variable
DECLARE
    s pgmq_sdk.schedules%ROWTYPE;
    n integer := coalesce(cardinality(ticks), 0);
    last_t timestamptz := (SELECT max(t) FROM unnest(ticks) AS u(t));
BEGIN
    IF last_t > clock_timestamp() THEN
        RAISE EXCEPTION 'fire_schedule: tick % is later than the database''s clock', last_t
            USING ERRCODE = '22023';
    END IF;
    IF new_next IS NULL OR new_next <= last_t THEN
        RAISE EXCEPTION 'fire_schedule: the next tick % is not after the last tick %', new_next, last_t
            USING ERRCODE = '22023';
    END IF;
    SELECT * INTO s FROM pgmq_sdk.schedules x
    WHERE x.name = schedule_name AND NOT x.paused
      AND x.next_tick IS NOT DISTINCT FROM seen_next AND x.changed_at = seen_changed
    FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    UPDATE pgmq_sdk.schedules x
    SET next_tick = new_next, last_tick = coalesce(last_t, x.last_tick), sent = x.sent + n
    WHERE x.name = schedule_name;
    IF n > 0 THEN
        RETURN QUERY
            SELECT b.id, ticks[b.i]
            FROM pgmq.send_batch(
                s.queue_name,
                ARRAY(SELECT s.message FROM generate_series(1, n)),
                ARRAY(SELECT coalesce(s.headers, '{}'::jsonb) || jsonb_build_object(
                          'x-pgmq-schedule', s.name,
                          'x-pgmq-tick', to_char(u.t AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'))
                      FROM unnest(ticks) WITH ORDINALITY AS u(t, i) ORDER BY u.i),
                clock_timestamp()) WITH ORDINALITY AS b(id, i);
    END IF;
END
$fn$;

REVOKE ALL ON FUNCTION
    pgmq_sdk.put_schedule(text, text, text, text, interval, jsonb, jsonb, integer),
    pgmq_sdk.pause_schedule(text, boolean),
    pgmq_sdk.remove_schedule(text),
    pgmq_sdk.due_schedules(integer),
    pgmq_sdk.fire_schedule(text, timestamptz, timestamptz, timestamptz[], timestamptz)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    pgmq_sdk.put_schedule(text, text, text, text, interval, jsonb, jsonb, integer),
    pgmq_sdk.pause_schedule(text, boolean),
    pgmq_sdk.remove_schedule(text),
    pgmq_sdk.due_schedules(integer),
    pgmq_sdk.fire_schedule(text, timestamptz, timestamptz, timestamptz[], timestamptz)
    TO PUBLIC;

-- Claim cursors ---------------------------------------------------------------
--
-- A queue's cursor row is read and moved by whoever may claim from the
-- queue (UPDATE on its table, as pgmq.read needs anyway). It is a hint for
-- where a claim read starts (pgmq-client's claim_cursor.rs): a role that
-- moves it only changes where the fleet's ranged reads begin, never which
-- messages exist or are visible, and the workers' reads from the start
-- claim whatever a moved cursor passed over.

-- (Granted to PUBLIC with the other tables, under Grants above.)
ALTER TABLE pgmq_sdk.claim_cursors ENABLE ROW LEVEL SECURITY;
DROP POLICY IF EXISTS consumers ON pgmq_sdk.claim_cursors;
CREATE POLICY consumers ON pgmq_sdk.claim_cursors
    USING (pg_catalog.has_table_privilege(queue_relid, 'UPDATE'))
    WITH CHECK (pg_catalog.has_table_privilege(queue_relid, 'UPDATE'));
