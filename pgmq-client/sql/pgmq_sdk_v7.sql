-- The pgmq_sdk schema, version 7: the presence of workers. A worker that
-- keeps a presence record (pgmq-worker's WorkerBuilder::presence) writes
-- its row every interval: where it runs, what it serves, its rates and
-- state, and when it was last seen (the server's clock). A row not seen
-- for a while is a worker that stopped reporting; one that stopped cleanly
-- says when. The rows are kept per queue table, like the pause flags, and
-- guarded by row-level security (pgmq_sdk_objects.sql).

CREATE TABLE pgmq_sdk.workers (
    worker_id text PRIMARY KEY,
    queue_relid oid NOT NULL,
    queue_name text NOT NULL,
    host text NOT NULL,
    pid integer NOT NULL,
    concurrency integer NOT NULL,
    claimed bigint NOT NULL,
    acked bigint NOT NULL,
    failed bigint NOT NULL,
    claims_per_sec double precision NOT NULL,
    acks_per_sec double precision NOT NULL,
    paused boolean NOT NULL,
    limited boolean NOT NULL,
    started_at timestamptz NOT NULL,
    seen_at timestamptz NOT NULL,
    stopped_at timestamptz
);
CREATE INDEX workers_seen_at ON pgmq_sdk.workers (seen_at);
