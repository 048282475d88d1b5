-- The pgmq_sdk schema, version 4: deduplication keys compare by their
-- bytes (collation "C").
--
-- A key is an identifier, never text to sort for a reader, and every
-- keyed send descends the B-tree of its keys' primary key twice (the
-- conflict check and the insert). Under a database's linguistic collation
-- each comparison on that path calls the locale's string comparison; under
-- "C" it is a byte comparison. Equality is the same under both (the
-- database's collations are deterministic), so no key changes meaning: the
-- rows stay, and the primary keys are rebuilt under the new collation.

ALTER TABLE pgmq_sdk.queue_keys ALTER COLUMN key TYPE text COLLATE "C";
ALTER TABLE pgmq_sdk.topic_keys ALTER COLUMN key TYPE text COLLATE "C";

