-- The pgmq_sdk schema, version 8: claim cursors. Workers that share a
-- queue hand each claim read its own range of msg_ids from one row per
-- queue table (pgmq-client's claim_cursor.rs): the row's next_id is where
-- the next range starts, granted where the last one started. The row is
-- a hint, never a fence: a range that starts past a visible message
-- only delays it until a read from the start (the worker makes those in
-- any case), so the table is unlogged (its updates write no WAL and
-- their commits wait for no flush; a crash empties it, and the next claim
-- starts it again), and guarded by row-level security
-- (pgmq_sdk_objects.sql).

CREATE UNLOGGED TABLE pgmq_sdk.claim_cursors (
    queue_relid oid PRIMARY KEY,
    next_id bigint NOT NULL,
    granted bigint NOT NULL
);
