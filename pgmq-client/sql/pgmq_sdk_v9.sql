-- The pgmq_sdk schema, version 9: the places of a fleet-wide limit as rows
-- (see pgmq_sdk.read_limited). A limit of N places has N rows per queue,
-- each holding the claim that last took it (`msg_id`, `read_at`); a place
-- is free when that claim has ended. Limited reads lock the free places
-- they take (FOR UPDATE SKIP LOCKED), so the reads of one queue run side
-- by side instead of taking turns on one lock.
--
-- A claim rewrites its place's row; the rows are few and stay few, and
-- the table keeps room on its pages for the new versions.

CREATE TABLE pgmq_sdk.limit_places (
    queue_relid oid NOT NULL,
    place integer NOT NULL,
    msg_id bigint,
    read_at timestamptz,
    PRIMARY KEY (queue_relid, place)
) WITH (fillfactor = 50);

-- The places in the order a read tries them: never used first, then the
-- oldest claim first (the likeliest to have ended).
CREATE INDEX limit_places_read_at ON pgmq_sdk.limit_places (queue_relid, read_at NULLS FIRST);

-- The claims the versions before recorded as running, each in a place of its own.
INSERT INTO pgmq_sdk.limit_places (queue_relid, place, msg_id, read_at)
SELECT r.queue_relid,
       pg_catalog.row_number() OVER (PARTITION BY r.queue_relid ORDER BY r.read_at, r.msg_id)::integer,
       r.msg_id, r.read_at
FROM pgmq_sdk.running r;

DROP TABLE pgmq_sdk.running;
