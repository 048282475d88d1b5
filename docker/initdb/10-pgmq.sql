-- Runs once, on the first start of an empty data volume, in $POSTGRES_DB.
CREATE EXTENSION IF NOT EXISTS pgmq;
-- pg_partman, for pgmq.create_partitioned (PGMQ finds it in any schema).
CREATE SCHEMA IF NOT EXISTS partman;
CREATE EXTENSION IF NOT EXISTS pg_partman SCHEMA partman;
