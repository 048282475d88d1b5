-- The pgmq_sdk schema, version 6: limits per key (see
-- pgmq_sdk.read_key_limited). No rows of earlier versions change.

-- The token bucket of each key of a queue read under a limit per key with
-- a rate. A row whose bucket is full and whose key has nothing running is
-- deleted by pgmq_sdk.expire_keys; a missing row is a key with a full
-- bucket.
CREATE TABLE pgmq_sdk.key_state (
    queue_relid oid NOT NULL,
    key text NOT NULL,
    -- The bucket's tokens at refilled_at (NULL: full, or no rate limit).
    tokens double precision,
    refilled_at timestamptz,
    -- When the bucket next holds a whole claim (NULL: it does now).
    next_token_at timestamptz,
    -- When the bucket is full again (NULL: it is, or no rate limit).
    full_at timestamptz,
    PRIMARY KEY (queue_relid, key)
);
-- The keys the rate limit turns away, found without reading every key.
CREATE INDEX key_state_throttled ON pgmq_sdk.key_state (queue_relid, next_token_at)
    WHERE next_token_at IS NOT NULL;

-- A claim made under a limit per key that may still be running: it counts
-- while its message is in the queue with the same delivery (`read_at` is
-- the message's last_read_at) and a visibility timeout still ahead.
CREATE TABLE pgmq_sdk.key_running (
    queue_relid oid NOT NULL,
    key text NOT NULL,
    msg_id bigint NOT NULL,
    read_at timestamptz NOT NULL,
    PRIMARY KEY (queue_relid, key, msg_id, read_at)
);
-- The claims whose messages are gone, found from the head of the queue.
CREATE INDEX key_running_msg ON pgmq_sdk.key_running (queue_relid, msg_id);
