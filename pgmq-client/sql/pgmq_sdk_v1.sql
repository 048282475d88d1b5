-- The pgmq_sdk schema, version 1: the objects pgmq-client and pgmq-worker
-- keep beside PGMQ's own (PGMQ's tables and functions are never altered).
-- Applied by `pgmq install-sdk` or `Client::install_sdk_schema`, in one
-- transaction, which also records the version in pgmq_sdk.schema_version.
-- Every function runs with search_path = pg_catalog, pg_temp and names
-- PGMQ's and this schema's objects qualified.

CREATE SCHEMA IF NOT EXISTS pgmq_sdk;

CREATE TABLE pgmq_sdk.schema_version (
    version integer PRIMARY KEY,
    installed_at timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp()
);

-- Idempotent sends --------------------------------------------------------
--
-- One row per deduplication key taken: `scope` is 'queue:' || queue name,
-- or 'topic:' || routing key for a topic send; `result` is the id of the
-- message the key sent (a queue send) or the number of queues it reached
-- (a topic send). A key is taken for its window from its first send; once
-- `expires_at` has passed it is free again, and expired rows are deleted
-- by the keyed sends themselves (pgmq_sdk.expire_send_keys).
CREATE TABLE pgmq_sdk.send_keys (
    scope text NOT NULL,
    key text NOT NULL,
    result bigint,
    sent_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (scope, key)
);
CREATE INDEX send_keys_expires_at ON pgmq_sdk.send_keys (expires_at);

-- Deletes up to `max_rows` expired keys, passing over rows another
-- transaction holds; returns how many it deleted. enable_seqscan is off
-- inside it, so that the scan is always a range of the expires_at index:
-- a plan made while the table's statistics said it was empty (analyzed
-- just after the install, or after a mass delete) would otherwise read the
-- whole table on every keyed send, however large it grew. The time is
-- taken once, in a subquery: compared with clock_timestamp() itself
-- (volatile), the index on expires_at would be read whole as a filter,
-- every key checked on every send, instead of only the expired ones.
CREATE FUNCTION pgmq_sdk.expire_send_keys(max_rows integer) RETURNS integer
LANGUAGE sql SET search_path = pg_catalog, pg_temp SET enable_seqscan = off AS $fn$
    WITH gone AS (
        DELETE FROM pgmq_sdk.send_keys k
        WHERE k.ctid = ANY (ARRAY(
            SELECT e.ctid FROM pgmq_sdk.send_keys e
            WHERE e.expires_at <= (SELECT clock_timestamp())
            ORDER BY e.expires_at
            LIMIT max_rows
            FOR UPDATE SKIP LOCKED))
        RETURNING 1)
    SELECT count(*)::integer FROM gone
$fn$;

-- Sends each message whose key is free (or expired) and takes the key for
-- `key_window`; a message whose key is taken (by an earlier send, or by an
-- earlier message of this batch) is not sent, and its row says the id the
-- key's first send returned. Rows come back in the order of `msgs`.
--
-- Two transactions sending one key at once: the second waits on the first's
-- key row (INSERT ... ON CONFLICT), then sees it taken if the first
-- committed, or takes it if the first rolled back.
--
-- After the insert, keys are looked up one by one on the primary key
-- rather than joined, and enable_seqscan is off inside it: a session
-- caches its plans with the statistics of the moment, and a plan made
-- while send_keys was empty (just installed, or analyzed after a mass
-- delete) would otherwise scan the whole table on every later call.
CREATE FUNCTION pgmq_sdk.send_batch_keyed(
    queue_name text,
    keys text[],
    msgs jsonb[],
    headers jsonb[],
    delay timestamptz,
    key_window interval
) RETURNS TABLE (msg_id bigint, duplicate boolean)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET enable_seqscan = off AS $fn$
DECLARE
    scope_name text := 'queue:' || queue_name;
    fresh integer[];
    ids bigint[];
    p integer;
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
    PERFORM pgmq_sdk.expire_send_keys(cardinality(keys) + 16);

    -- Takes each distinct key (in key order, so that two batches sharing
    -- keys lock them in one order and cannot deadlock); the positions of
    -- the first message of each key taken are the messages to send.
    WITH firsts AS (
        SELECT DISTINCT ON (u.k) u.k, u.i
        FROM unnest(keys) WITH ORDINALITY AS u(k, i)
        ORDER BY u.k, u.i
    ), taken AS (
        INSERT INTO pgmq_sdk.send_keys AS s (scope, key, result, sent_at, expires_at)
        SELECT scope_name, f.k, NULL, clock_timestamp(), clock_timestamp() + key_window
        FROM firsts f
        ORDER BY f.k
        ON CONFLICT ON CONSTRAINT send_keys_pkey DO UPDATE
            SET result = NULL, sent_at = excluded.sent_at, expires_at = excluded.expires_at
            WHERE s.expires_at <= clock_timestamp()
        RETURNING s.key
    )
    SELECT array_agg(f.i::integer ORDER BY f.i) INTO fresh
    FROM firsts f JOIN taken t ON t.key = f.k;

    IF fresh IS NOT NULL THEN
        SELECT array_agg(t.id ORDER BY t.n) INTO ids
        FROM pgmq.send_batch(
            queue_name,
            ARRAY(SELECT msgs[p.i] FROM unnest(fresh) WITH ORDINALITY AS p(i, n) ORDER BY p.n),
            CASE WHEN headers IS NULL THEN NULL::jsonb[]
                 ELSE ARRAY(SELECT headers[p.i] FROM unnest(fresh) WITH ORDINALITY AS p(i, n) ORDER BY p.n)
            END,
            delay
        ) WITH ORDINALITY AS t(id, n);
        FOR p IN 1 .. cardinality(fresh) LOOP
            UPDATE pgmq_sdk.send_keys s SET result = ids[p]
            WHERE s.scope = scope_name AND s.key = keys[fresh[p]];
        END LOOP;
    END IF;

    RETURN QUERY
        SELECT (SELECT s.result FROM pgmq_sdk.send_keys s
                WHERE s.scope = scope_name AND s.key = u.k),
               NOT coalesce(u.i = ANY (fresh), false)
        FROM unnest(keys) WITH ORDINALITY AS u(k, i)
        ORDER BY u.i;
END
$fn$;

-- A topic send (pgmq.send_topic) under a key: routes the message when the
-- key is free; returns the number of queues the key's first send reached.
CREATE FUNCTION pgmq_sdk.send_topic_keyed(
    routing_key text,
    key text,
    msg jsonb,
    headers jsonb,
    delay integer,
    key_window interval
) RETURNS TABLE (queues integer, duplicate boolean)
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp SET enable_seqscan = off AS $fn$
DECLARE
    scope_name text := 'topic:' || routing_key;
    fresh boolean := false;
    reached integer;
BEGIN
    IF key IS NULL THEN
        RAISE EXCEPTION 'send_topic_keyed: the key is NULL' USING ERRCODE = '22004';
    END IF;
    IF key_window <= interval '0' THEN
        RAISE EXCEPTION 'send_topic_keyed: the key window must be positive' USING ERRCODE = '22023';
    END IF;
    PERFORM pgmq_sdk.expire_send_keys(17);
    INSERT INTO pgmq_sdk.send_keys AS s (scope, key, result, sent_at, expires_at)
    VALUES (scope_name, key, NULL, clock_timestamp(), clock_timestamp() + key_window)
    ON CONFLICT ON CONSTRAINT send_keys_pkey DO UPDATE
        SET result = NULL, sent_at = excluded.sent_at, expires_at = excluded.expires_at
        WHERE s.expires_at <= clock_timestamp()
    RETURNING true INTO fresh;
    IF coalesce(fresh, false) THEN
        reached := pgmq.send_topic(routing_key, msg, headers, delay);
        UPDATE pgmq_sdk.send_keys s SET result = reached
        WHERE s.scope = scope_name AND s.key = send_topic_keyed.key;
        RETURN QUERY SELECT reached, false;
    ELSE
        RETURN QUERY SELECT s.result::integer, true FROM pgmq_sdk.send_keys s
        WHERE s.scope = scope_name AND s.key = send_topic_keyed.key;
    END IF;
END
$fn$;

-- Pause and resume ---------------------------------------------------------
--
-- A queue listed here is paused: workers stop claiming from it (running
-- handlers finish and their acknowledgements are written) until it is
-- resumed. PGMQ's own functions are unaffected: a plain pgmq.read still
-- reads.
CREATE TABLE pgmq_sdk.paused_queues (
    queue_name text PRIMARY KEY,
    paused_at timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
    reason text
);

-- Pauses a queue; true when it was running until now.
CREATE FUNCTION pgmq_sdk.pause_queue(queue_name text, reason text) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pgmq.meta m WHERE m.queue_name = pause_queue.queue_name) THEN
        RAISE EXCEPTION 'Queue % does not exist', queue_name;
    END IF;
    INSERT INTO pgmq_sdk.paused_queues AS p (queue_name, reason)
    VALUES (pause_queue.queue_name, pause_queue.reason)
    ON CONFLICT ON CONSTRAINT paused_queues_pkey DO NOTHING;
    RETURN FOUND;
END
$fn$;

-- Resumes a queue; true when it was paused until now.
CREATE FUNCTION pgmq_sdk.resume_queue(queue_name text) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    DELETE FROM pgmq_sdk.paused_queues p WHERE p.queue_name = resume_queue.queue_name;
    RETURN FOUND;
END
$fn$;

-- Limits across a fleet ----------------------------------------------------
--
-- The claims made through pgmq_sdk.read_limited that may still be running:
-- a row counts while its message is in the queue with the same delivery
-- (`last_read_at`) and a visibility timeout still ahead. A delete, archive,
-- retry or release ends the delivery and frees the row's place at once; a
-- crashed worker's place is freed when its visibility timeout passes. Rows
-- that no longer count are deleted by the next limited read.
CREATE TABLE pgmq_sdk.limit_claims (
    queue_name text NOT NULL,
    msg_id bigint NOT NULL,
    read_at timestamptz NOT NULL,
    PRIMARY KEY (queue_name, msg_id, read_at)
);

-- The token bucket of each queue read with a rate limit.
CREATE TABLE pgmq_sdk.rate_buckets (
    queue_name text PRIMARY KEY,
    tokens double precision NOT NULL,
    refilled_at timestamptz NOT NULL
);

-- pgmq.read under a fleet-wide limit: at most `max_running` messages of the
-- queue claimed through this function and still running (NULL: no limit),
-- and at most `per_second` claims per second with bursts of `burst` (NULL:
-- no rate limit). Limited reads of one queue take turns on a transaction
-- advisory lock, so two never count the same free place.
CREATE FUNCTION pgmq_sdk.read_limited(
    queue_name text,
    vt integer,
    qty integer,
    max_running integer,
    per_second double precision,
    burst double precision
) RETURNS SETOF pgmq.message_record
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    now_ts timestamptz := clock_timestamp();
    room integer := qty;
    running integer;
    avail double precision;
    got pgmq.message_record[];
    n integer;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('pgmq_sdk.read_limited'), hashtext(queue_name));
    IF max_running IS NOT NULL THEN
        EXECUTE format(
            'DELETE FROM pgmq_sdk.limit_claims c WHERE c.queue_name = $1 AND NOT EXISTS ('
            'SELECT 1 FROM pgmq.%I m WHERE m.msg_id = c.msg_id AND m.last_read_at = c.read_at '
            'AND m.vt > $2)', 'q_' || lower(queue_name))
        USING queue_name, now_ts;
        SELECT count(*)::integer INTO running
        FROM pgmq_sdk.limit_claims c WHERE c.queue_name = read_limited.queue_name;
        room := least(room, max_running - running);
    END IF;
    IF per_second IS NOT NULL THEN
        INSERT INTO pgmq_sdk.rate_buckets AS b (queue_name, tokens, refilled_at)
        VALUES (read_limited.queue_name, burst, now_ts)
        ON CONFLICT ON CONSTRAINT rate_buckets_pkey DO NOTHING;
        SELECT least(burst, b.tokens + greatest(0, extract(epoch FROM now_ts - b.refilled_at)::double precision) * per_second)
        INTO avail
        FROM pgmq_sdk.rate_buckets b WHERE b.queue_name = read_limited.queue_name;
        room := least(room, floor(avail)::integer);
    END IF;
    IF room > 0 THEN
        SELECT array_agg(r) INTO got FROM pgmq.read(queue_name, vt, room) r;
    END IF;
    n := coalesce(cardinality(got), 0);
    IF max_running IS NOT NULL AND n > 0 THEN
        INSERT INTO pgmq_sdk.limit_claims (queue_name, msg_id, read_at)
        SELECT read_limited.queue_name, g.msg_id, g.last_read_at FROM unnest(got) g;
    END IF;
    IF per_second IS NOT NULL THEN
        UPDATE pgmq_sdk.rate_buckets b SET tokens = avail - n, refilled_at = now_ts
        WHERE b.queue_name = read_limited.queue_name;
    END IF;
    IF n > 0 THEN
        RETURN QUERY SELECT * FROM unnest(got);
    END IF;
END
$fn$;
