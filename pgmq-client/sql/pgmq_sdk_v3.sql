-- The pgmq_sdk schema, version 3: a queue key is one row and one index
-- entry, its primary key. The index on expires_at is dropped: every keyed
-- send paid an entry in it per message, for the sake of the housekeeping
-- that deletes expired keys. That housekeeping (pgmq_sdk.expire_keys) now
-- sweeps the table in windows of blocks instead, each call the next
-- window, numbered by the sequence below, so that successive calls (of any
-- client) pass over the whole table in turn. No rows change.

DROP INDEX pgmq_sdk.queue_keys_expires_at;

CREATE SEQUENCE pgmq_sdk.queue_keys_sweep;
