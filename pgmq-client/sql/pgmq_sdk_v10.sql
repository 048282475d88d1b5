-- The pgmq_sdk schema, version 10: a worker's presence row is keyed by its
-- queue and its worker id together. Keyed by the id alone, a role that may
-- consume one queue could write a row for its own queue under the id a
-- worker of another queue is about to use: that worker's reports would then
-- meet a row that row-level security does not let it update, and fail.

ALTER TABLE pgmq_sdk.workers DROP CONSTRAINT workers_pkey;
ALTER TABLE pgmq_sdk.workers ADD PRIMARY KEY (queue_relid, worker_id);
