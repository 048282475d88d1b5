-- The pgmq_sdk schema, version 2: the state is kept per queue *table*
-- (its oid), not per spelling of the queue's name, and every table is
-- guarded by row-level security (the policies, grants and functions are in
-- pgmq_sdk_objects.sql, applied after this on every install).
--
-- Why the table's oid: PGMQ folds a queue's name to lower case for its
-- table, so `Orders` and `orders` are one queue and must share their keys,
-- pause flag and limit; and a queue dropped and created again is a new
-- table with a new oid, so the keys of the old one no longer answer for it.
--
-- The rows of version 1 are carried over: keys and pause flags of queues
-- that still exist, the limit's running claims and token buckets. Topic
-- keys of version 1 were not tied to a role and are dropped (a topic send
-- retried across the upgrade within its window may be sent again).

CREATE TABLE pgmq_sdk.queue_keys (
    queue_relid oid NOT NULL,
    key text NOT NULL,
    msg_id bigint,
    sent_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (queue_relid, key)
);
CREATE INDEX queue_keys_expires_at ON pgmq_sdk.queue_keys (expires_at);

INSERT INTO pgmq_sdk.queue_keys (queue_relid, key, msg_id, sent_at, expires_at)
SELECT DISTINCT ON (r.relid, k.key) r.relid, k.key, k.result, k.sent_at, k.expires_at
FROM pgmq_sdk.send_keys k
CROSS JOIN LATERAL (
    SELECT pg_catalog.to_regclass(pg_catalog.format('pgmq.%I',
        'q_' || pg_catalog.lower(pg_catalog.substr(k.scope, 7))))::oid AS relid
) r
WHERE k.scope LIKE 'queue:%' AND r.relid IS NOT NULL
ORDER BY r.relid, k.key, k.sent_at;

CREATE TABLE pgmq_sdk.topic_keys (
    routing_key text NOT NULL,
    taken_by oid NOT NULL,
    key text NOT NULL,
    queues integer,
    sent_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (routing_key, taken_by, key)
);
CREATE INDEX topic_keys_expires_at ON pgmq_sdk.topic_keys (expires_at);

CREATE TABLE pgmq_sdk.paused (
    queue_relid oid PRIMARY KEY,
    queue_name text NOT NULL,
    paused_at timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
    reason text
);

INSERT INTO pgmq_sdk.paused (queue_relid, queue_name, paused_at, reason)
SELECT DISTINCT ON (r.relid) r.relid, pg_catalog.lower(p.queue_name), p.paused_at, p.reason
FROM pgmq_sdk.paused_queues p
CROSS JOIN LATERAL (
    SELECT pg_catalog.to_regclass(pg_catalog.format('pgmq.%I',
        'q_' || pg_catalog.lower(p.queue_name)))::oid AS relid
) r
WHERE r.relid IS NOT NULL
ORDER BY r.relid, p.paused_at;

-- A claim made under a fleet-wide limit that may still be running (see
-- pgmq_sdk.read_limited).
CREATE TABLE pgmq_sdk.running (
    queue_relid oid NOT NULL,
    msg_id bigint NOT NULL,
    read_at timestamptz NOT NULL,
    PRIMARY KEY (queue_relid, msg_id, read_at)
);

INSERT INTO pgmq_sdk.running (queue_relid, msg_id, read_at)
SELECT r.relid, c.msg_id, c.read_at
FROM pgmq_sdk.limit_claims c
CROSS JOIN LATERAL (
    SELECT pg_catalog.to_regclass(pg_catalog.format('pgmq.%I',
        'q_' || pg_catalog.lower(c.queue_name)))::oid AS relid
) r
WHERE r.relid IS NOT NULL
ON CONFLICT DO NOTHING;

-- One row per queue read under a fleet-wide limit: the limited reads of a
-- queue lock it in turn (a row lock, which only a role allowed to read the
-- queue can take), and it holds the queue's token bucket.
CREATE TABLE pgmq_sdk.limits (
    queue_relid oid PRIMARY KEY,
    tokens double precision,
    refilled_at timestamptz
);

INSERT INTO pgmq_sdk.limits (queue_relid, tokens, refilled_at)
SELECT DISTINCT ON (r.relid) r.relid, b.tokens, b.refilled_at
FROM pgmq_sdk.rate_buckets b
CROSS JOIN LATERAL (
    SELECT pg_catalog.to_regclass(pg_catalog.format('pgmq.%I',
        'q_' || pg_catalog.lower(b.queue_name)))::oid AS relid
) r
WHERE r.relid IS NOT NULL
ORDER BY r.relid;

DROP FUNCTION IF EXISTS pgmq_sdk.read_limited(text, integer, integer, integer, double precision, double precision);
DROP FUNCTION IF EXISTS pgmq_sdk.send_batch_keyed(text, text[], jsonb[], jsonb[], timestamptz, interval);
DROP FUNCTION IF EXISTS pgmq_sdk.send_topic_keyed(text, text, jsonb, jsonb, integer, interval);
DROP FUNCTION IF EXISTS pgmq_sdk.expire_send_keys(integer);
DROP FUNCTION IF EXISTS pgmq_sdk.pause_queue(text, text);
DROP FUNCTION IF EXISTS pgmq_sdk.resume_queue(text);
DROP TABLE pgmq_sdk.send_keys;
DROP TABLE pgmq_sdk.paused_queues;
DROP TABLE pgmq_sdk.limit_claims;
DROP TABLE pgmq_sdk.rate_buckets;
