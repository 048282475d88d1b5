-- The pgmq_sdk schema, version 5: periodic sends. A schedule sends a given
-- message to a queue on each tick of a cron expression (in a time zone) or
-- of a fixed interval; the functions that change and fire schedules are in
-- pgmq_sdk_objects.sql.
--
-- The row is the schedule's whole state: `next_tick` is the first tick not
-- yet sent (NULL: the first tick after `changed_at`, placed by the next
-- runner that sees it), and pgmq_sdk.fire_schedule sends a tick's message
-- in the same statement that moves `next_tick` past it, fenced on the
-- values the runner read. So a tick is sent exactly when `next_tick`
-- moves past it, once for every runner of the fleet, and a crash between
-- deciding and sending rolls both back.

CREATE TABLE pgmq_sdk.schedules (
    name text PRIMARY KEY CHECK (pg_catalog.length(name) BETWEEN 1 AND 200),
    queue_relid oid NOT NULL,
    queue_name text NOT NULL,
    -- Exactly one of cron (with its time zone) and every.
    cron text,
    time_zone text NOT NULL DEFAULT 'UTC',
    every interval CHECK (every > interval '0'),
    message jsonb NOT NULL,
    headers jsonb,
    -- How many missed ticks (due before the latest due one) a firing sends
    -- besides the latest; older ones are skipped. 0: skip every missed tick.
    catch_up integer NOT NULL DEFAULT 10 CHECK (catch_up BETWEEN 0 AND 10000),
    paused boolean NOT NULL DEFAULT false,
    next_tick timestamptz,
    last_tick timestamptz,
    sent bigint NOT NULL DEFAULT 0,
    changed_at timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
    created_at timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp(),
    CHECK ((cron IS NULL) <> (every IS NULL))
);
CREATE INDEX schedules_due ON pgmq_sdk.schedules (next_tick) WHERE NOT paused;
