-- The pgmq_sdk schema, version 11: a narrower row per deduplication key.
--
-- A key row holds what a keyed send reads back: the queue's table, the
-- key, its message's id and when it expires. The time of its first send
-- was written but never read; it is gone, and the fixed-width columns
-- come first so that the row has no alignment padding. Every keyed
-- message writes one such row (and its primary-key entry), so the row's
-- width is paid in heap and WAL once per message.
--
-- The keys of version 9 are carried over as they are: a key taken before
-- the upgrade stays taken for the rest of its window.

CREATE TABLE pgmq_sdk.queue_keys_v10 (
    msg_id bigint,
    expires_at timestamptz NOT NULL,
    queue_relid oid NOT NULL,
    key text COLLATE "C" NOT NULL,
    CONSTRAINT queue_keys_v10_pkey PRIMARY KEY (queue_relid, key)
);

INSERT INTO pgmq_sdk.queue_keys_v10 (msg_id, expires_at, queue_relid, key)
SELECT k.msg_id, k.expires_at, k.queue_relid, k.key
FROM pgmq_sdk.queue_keys k;

DROP TABLE pgmq_sdk.queue_keys;
ALTER TABLE pgmq_sdk.queue_keys_v10 RENAME TO queue_keys;
ALTER TABLE pgmq_sdk.queue_keys RENAME CONSTRAINT queue_keys_v10_pkey TO queue_keys_pkey;
