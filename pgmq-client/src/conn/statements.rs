//! The SQL of each PGMQ call, SDK call and catalog probe, prepared once
//! per connection. The comments name the file of `pgmq/` or `sdk/` whose
//! calls run each group.
//!
//! Every call names one [`Stmt`]; a pooled [`Connection`](crate::Connection)
//! prepares it on first use and keeps the prepared statement for the life of
//! the connection. Parameters carry explicit casts so that PostgreSQL picks the
//! intended overload of PGMQ's functions. Queue names are always parameters.
//! Catalog functions are written `pg_catalog.f(...)`, so that a function of
//! the same name planted in a schema earlier on the `search_path` is never
//! called in their place.

use tokio_postgres::Statement;

/// The columns of `pgmq.message_record`, in the order `message::raw_from_row` reads.
macro_rules! msg_cols {
    () => {
        "msg_id, read_ct, enqueued_at, last_read_at, vt, message, headers"
    };
}

/// The columns of `pgmq.metrics_result` that `queue::metrics_from_row` reads,
/// by name, on a row aliased `m`.
macro_rules! metrics_cols {
    () => {
        "m.queue_name, m.queue_length, m.newest_msg_age_sec, m.oldest_msg_age_sec, \
         m.total_messages, m.scrape_time, m.queue_visible_length, \
         (pg_catalog.to_jsonb(m) ->> 'default_partition_length')::bigint AS default_partition_length"
    };
}

macro_rules! statements {
    ($($(#[$doc:meta])* $name:ident = $sql:expr;)*) => {
        /// One PGMQ call's SQL.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        #[allow(missing_docs)]
        pub enum Stmt { $($(#[$doc])* $name,)* }

        impl Stmt {
            /// Every statement, in declaration order.
            pub const ALL: &'static [Stmt] = &[$(Stmt::$name,)*];

            /// The SQL text.
            pub const fn sql(self) -> &'static str {
                match self { $(Stmt::$name => $sql,)* }
            }
        }
    };
}

statements! {
    // send.rs. A delay in seconds goes to PGMQ's timestamptz overload with
    // the same expression PGMQ's integer overload computes: that overload is
    // a volatile SQL function, which PostgreSQL cannot inline and so parses
    // and plans again on every call.
    Send = "SELECT * FROM pgmq.send($1::text, $2::jsonb, $3::jsonb, pg_catalog.clock_timestamp() + pg_catalog.make_interval(secs => $4::integer))";
    SendAt = "SELECT * FROM pgmq.send($1::text, $2::jsonb, $3::jsonb, $4::timestamptz)";
    SendBatch = "SELECT * FROM pgmq.send_batch($1::text, $2::jsonb[], $3::jsonb[], pg_catalog.clock_timestamp() + pg_catalog.make_interval(secs => $4::integer))";
    SendBatchAt = "SELECT * FROM pgmq.send_batch($1::text, $2::jsonb[], $3::jsonb[], $4::timestamptz)";
    // keyed.rs: idempotent sends, in the pgmq_sdk schema. The window is in
    // milliseconds.
    SendKeyedOne = "SELECT msg_id, duplicate FROM pgmq_sdk.send_keyed($1::text, $2::text, $3::jsonb, $4::jsonb, pg_catalog.clock_timestamp() + pg_catalog.make_interval(secs => $5::integer), pg_catalog.make_interval(secs => $6::bigint / 1000.0))";
    SendKeyedOneAt = "SELECT msg_id, duplicate FROM pgmq_sdk.send_keyed($1::text, $2::text, $3::jsonb, $4::jsonb, $5::timestamptz, pg_catalog.make_interval(secs => $6::bigint / 1000.0))";
    SendKeyed = "SELECT msg_id, duplicate FROM pgmq_sdk.send_batch_keyed($1::text, $2::text[], $3::jsonb[], $4::jsonb[], pg_catalog.clock_timestamp() + pg_catalog.make_interval(secs => $5::integer), pg_catalog.make_interval(secs => $6::bigint / 1000.0))";
    SendKeyedAt = "SELECT msg_id, duplicate FROM pgmq_sdk.send_batch_keyed($1::text, $2::text[], $3::jsonb[], $4::jsonb[], $5::timestamptz, pg_catalog.make_interval(secs => $6::bigint / 1000.0))";
    SendTopicKeyed = "SELECT queues, duplicate FROM pgmq_sdk.send_topic_keyed($1::text, $2::text, $3::jsonb, $4::jsonb, $5::integer, pg_catalog.make_interval(secs => $6::bigint / 1000.0))";
    // Expired keys go in a transaction of their own (keyed.rs).
    ExpireKeys = "SELECT pgmq_sdk.expire_keys($1::integer)";
    // After a purge (queue.rs), when the schema is there.
    ForgetQueueKeys = "SELECT pgmq_sdk.forget_queue_keys($1::text)";
    // Whether the schema's forget_queue_keys is there: a catalog look that
    // cannot fail, so that a purge inside a caller's transaction never
    // aborts it by calling a missing function.
    SdkPresent = "SELECT pg_catalog.to_regprocedure($1::text) IS NOT NULL";
    // pause.rs, in the pgmq_sdk schema.
    PauseQueue = "SELECT pgmq_sdk.pause_queue($1::text, $2::text)";
    ResumeQueue = "SELECT pgmq_sdk.resume_queue($1::text)";
    QueuePaused = "SELECT pgmq_sdk.queue_paused($1::text)";
    ListPaused = "SELECT queue_name, paused_at, reason FROM pgmq_sdk.paused ORDER BY queue_name";
    // schedule.rs, in the pgmq_sdk schema. An interval is in milliseconds.
    PutSchedule = "SELECT pgmq_sdk.put_schedule($1::text, $2::text, $3::text, $4::text, pg_catalog.make_interval(secs => $5::bigint / 1000.0), $6::jsonb, $7::jsonb, $8::integer)";
    PauseSchedule = "SELECT pgmq_sdk.pause_schedule($1::text, true)";
    ResumeSchedule = "SELECT pgmq_sdk.pause_schedule($1::text, false)";
    RemoveSchedule = "SELECT pgmq_sdk.remove_schedule($1::text)";
    ListSchedules = "SELECT name, queue_name, cron, time_zone, (extract(epoch FROM every) * 1000)::bigint, message, headers, catch_up, paused, next_tick, last_tick, sent, changed_at, created_at FROM pgmq_sdk.schedules ORDER BY name";
    DueSchedules = "SELECT name, cron, time_zone, every_ms, catch_up, next_tick, changed_at, now_ts FROM pgmq_sdk.due_schedules($1::integer)";
    FireSchedule = "SELECT msg_id, tick FROM pgmq_sdk.fire_schedule($1::text, $2::timestamptz, $3::timestamptz, $4::timestamptz[], $5::timestamptz)";
    NextScheduleDue = "SELECT extract(epoch FROM pg_catalog.min(next_tick) - pg_catalog.clock_timestamp())::float8 FROM pgmq_sdk.schedules WHERE NOT paused AND pg_catalog.has_table_privilege(queue_relid, 'INSERT')";
    // claim_cursor.rs, in the pgmq_sdk schema: a claim read's range of
    // msg_ids, and the cursor pulled back to where a short read ended.
    ClaimRange = "INSERT INTO pgmq_sdk.claim_cursors AS c (queue_relid, next_id, granted) VALUES (pgmq_sdk.queue_table($1::text), $2::bigint + $3::bigint, $2::bigint) ON CONFLICT (queue_relid) DO UPDATE SET granted = GREATEST(c.next_id, EXCLUDED.granted), next_id = GREATEST(c.next_id, EXCLUDED.granted) + $3::bigint RETURNING granted";
    RewindClaimCursor = "UPDATE pgmq_sdk.claim_cursors SET next_id = $2::bigint WHERE queue_relid = pgmq_sdk.queue_table($1::text) AND next_id > $2::bigint";
    // limits.rs, in the pgmq_sdk schema.
    ReadLimited = concat!("SELECT ", msg_cols!(), " FROM pgmq_sdk.read_limited($1::text, $2::integer, $3::integer, $4::integer, $5::float8, $6::float8)");
    AckReadLimited = concat!("SELECT ", msg_cols!(), ", acked FROM pgmq_sdk.ack_read_limited($1::text, $2::bigint[], $3::timestamptz[], $4::integer, $5::integer, $6::integer, $7::float8, $8::float8)");
    // key_limits.rs, in the pgmq_sdk schema.
    ReadKeyLimited = concat!("SELECT ", msg_cols!(), " FROM pgmq_sdk.read_key_limited($1::text, $2::integer, $3::integer, $4::boolean, $5::text[], $6::integer, $7::float8, $8::float8)");
    // read.rs
    Read = concat!("SELECT ", msg_cols!(), " FROM pgmq.read($1::text, $2::integer, $3::integer)");
    ReadWhere = concat!("SELECT ", msg_cols!(), " FROM pgmq.read($1::text, $2::integer, $3::integer, $4::jsonb)");
    ReadWithPoll = concat!("SELECT ", msg_cols!(), " FROM pgmq.read_with_poll($1::text, $2::integer, $3::integer, $4::integer, $5::integer, $6::jsonb)");
    Pop = concat!("SELECT ", msg_cols!(), " FROM pgmq.pop($1::text, $2::integer)");
    // fifo.rs
    ReadGrouped = concat!("SELECT ", msg_cols!(), " FROM pgmq.read_grouped($1::text, $2::integer, $3::integer)");
    ReadGroupedWithPoll = concat!("SELECT ", msg_cols!(), " FROM pgmq.read_grouped_with_poll($1::text, $2::integer, $3::integer, $4::integer, $5::integer)");
    ReadGroupedRr = concat!("SELECT ", msg_cols!(), " FROM pgmq.read_grouped_rr($1::text, $2::integer, $3::integer)");
    ReadGroupedRrWithPoll = concat!("SELECT ", msg_cols!(), " FROM pgmq.read_grouped_rr_with_poll($1::text, $2::integer, $3::integer, $4::integer, $5::integer)");
    ReadGroupedHead = concat!("SELECT ", msg_cols!(), " FROM pgmq.read_grouped_head($1::text, $2::integer, $3::integer)");
    ReadGroupedHeadWithPoll = concat!("SELECT ", msg_cols!(), " FROM pgmq.read_grouped_head_with_poll($1::text, $2::integer, $3::integer, $4::integer, $5::integer)");
    CreateFifoIndex = "SELECT pgmq.create_fifo_index($1::text)";
    // ack.rs
    Delete = "SELECT pgmq.delete($1::text, $2::bigint)";
    DeleteBatch = "SELECT * FROM pgmq.delete($1::text, $2::bigint[])";
    Archive = "SELECT pgmq.archive($1::text, $2::bigint)";
    ArchiveBatch = "SELECT * FROM pgmq.archive($1::text, $2::bigint[])";
    SetVt = concat!("SELECT ", msg_cols!(), " FROM pgmq.set_vt($1::text, $2::bigint, $3::integer)");
    SetVtAt = concat!("SELECT ", msg_cols!(), " FROM pgmq.set_vt($1::text, $2::bigint, $3::timestamptz)");
    SetVtBatch = "SELECT msg_id, vt FROM pgmq.set_vt($1::text, $2::bigint[], $3::integer)";
    SetVtBatchAt = "SELECT msg_id, vt FROM pgmq.set_vt($1::text, $2::bigint[], $3::timestamptz)";
    // queue.rs
    Create = "SELECT pgmq.create($1::text)";
    CreateUnlogged = "SELECT pgmq.create_unlogged($1::text)";
    CreatePartitioned = "SELECT pgmq.create_partitioned($1::text, $2::text, $3::text)";
    DropQueue = "SELECT pgmq.drop_queue($1::text)";
    PurgeQueue = "SELECT pgmq.purge_queue($1::text)";
    DetachArchive = "SELECT pgmq.detach_archive($1::text)";
    ListQueues = "SELECT queue_name::text, is_partitioned, is_unlogged, created_at FROM pgmq.list_queues()";
    QueueExists = "SELECT EXISTS (SELECT 1 FROM pgmq.meta WHERE queue_name = $1::text)";
    // Named columns, so that the statement's result keeps its shape when
    // `ALTER EXTENSION pgmq UPDATE` adds fields to `pgmq.metrics_result`
    // (1.13 added `default_partition_length`, read through jsonb so that
    // the same text works on 1.11 and 1.12, where it is NULL).
    Metrics = concat!("SELECT ", metrics_cols!(), " FROM pgmq.metrics($1::text) m");
    MetricsAll = concat!("SELECT ", metrics_cols!(), " FROM pgmq.metrics_all() m");
    // notify.rs
    EnableNotifyInsert = "SELECT pgmq.enable_notify_insert($1::text, $2::integer)";
    DisableNotifyInsert = "SELECT pgmq.disable_notify_insert($1::text)";
    ListNotifyInsertThrottles = "SELECT queue_name, throttle_interval_ms, last_notified_at FROM pgmq.list_notify_insert_throttles()";
    UpdateNotifyInsert = "SELECT pgmq.update_notify_insert($1::text, $2::integer)";
    // topics.rs
    BindTopic = "SELECT pgmq.bind_topic($1::text, $2::text)";
    UnbindTopic = "SELECT pgmq.unbind_topic($1::text, $2::text)";
    SendTopic = "SELECT pgmq.send_topic($1::text, $2::jsonb, $3::jsonb, $4::integer)";
    SendBatchTopic = "SELECT queue_name, msg_id FROM pgmq.send_batch_topic($1::text, $2::jsonb[], $3::jsonb[], $4::integer)";
    SendBatchTopicAt = "SELECT queue_name, msg_id FROM pgmq.send_batch_topic($1::text, $2::jsonb[], $3::jsonb[], $4::timestamptz)";
    ListTopicBindings = "SELECT pattern, queue_name, bound_at, compiled_regex FROM pgmq.list_topic_bindings()";
    ListTopicBindingsFor = "SELECT pattern, queue_name, bound_at, compiled_regex FROM pgmq.list_topic_bindings($1::text)";
    TestRouting = "SELECT pattern, queue_name, compiled_regex FROM pgmq.test_routing($1::text)";
    // The remaining public functions of PGMQ 1.13 (functions.rs).
    CreateNonPartitioned = "SELECT pgmq.create_non_partitioned($1::text)";
    ConvertArchivePartitioned = "SELECT pgmq.convert_archive_partitioned($1::text, $2::text, $3::text, $4::integer)";
    CreateFifoIndexesAll = "SELECT pgmq.create_fifo_indexes_all()";
    ValidateQueueName = "SELECT pgmq.validate_queue_name($1::text)";
    FormatTableName = "SELECT pgmq.format_table_name($1::text, $2::text)";
    ValidateRoutingKey = "SELECT pgmq.validate_routing_key($1::text)";
    ValidateTopicPattern = "SELECT pgmq.validate_topic_pattern($1::text)";
    AcquireQueueLock = "SELECT pgmq.acquire_queue_lock($1::text)";
    // catalog.rs: catalog looks about a queue's table, `$1` its quoted
    // name, and the transaction-local timeouts for DDL on it.
    QueueTableColumns = "SELECT a.attname::text, pg_catalog.format_type(a.atttypid, a.atttypmod) \
        FROM pg_catalog.pg_attribute a \
        WHERE a.attrelid = pg_catalog.to_regclass($1::text) AND a.attnum > 0 AND NOT a.attisdropped";
    QueueTableLockHolders = "SELECT a.pid, coalesce(a.application_name, ''), coalesce(a.state, ''), l.mode, \
        coalesce(extract(epoch FROM pg_catalog.now() - a.xact_start)::float8, 0) \
        FROM pg_catalog.pg_locks l JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid \
        WHERE l.locktype = 'relation' AND l.granted \
        AND l.relation = pg_catalog.to_regclass($1::text) AND a.pid <> pg_catalog.pg_backend_pid() \
        ORDER BY a.xact_start LIMIT $2::bigint";
    SetLocalTimeouts = "SELECT pg_catalog.set_config('lock_timeout', $1::text, true), pg_catalog.set_config('statement_timeout', $2::text, true)";
    // autovacuum.rs: the queue table's owner, whether the connected role
    // may change it (its owner, a member of the owning role, a superuser),
    // whether it is a partitioned parent, and its storage parameters.
    QueueTableAutovacuum = "SELECT pg_catalog.pg_get_userbyid(c.relowner)::text, \
        pg_catalog.pg_has_role(c.relowner, 'USAGE'), \
        EXISTS (SELECT FROM pg_catalog.pg_partitioned_table p WHERE p.partrelid = c.oid), \
        coalesce(c.reloptions, '{}')::text[] \
        FROM pg_catalog.pg_class c WHERE c.oid = pg_catalog.to_regclass($1::text)";
    // vacuum.rs: the dead and live row versions the statistics count in a
    // queue's table (with its partitions, if partitioned), NULL when the
    // table does not exist.
    QueueTableDeadRows = "SELECT sum(s.n_dead_tup)::bigint, sum(s.n_live_tup)::bigint \
        FROM pg_catalog.pg_stat_user_tables s WHERE s.relid = pg_catalog.to_regclass($1::text) \
        OR s.relid IN (SELECT t.relid FROM pg_catalog.pg_partition_tree(pg_catalog.to_regclass($1::text)) t)";
}

impl Stmt {
    /// Whether the statement runs something of the `pgmq_sdk` schema: a
    /// connection checks who owns that schema before its first such call
    /// ([`crate::sdk::sdk_schema`], "Trust").
    pub(crate) fn is_sdk(self) -> bool {
        matches!(
            self,
            Stmt::SendKeyedOne
                | Stmt::SendKeyedOneAt
                | Stmt::SendKeyed
                | Stmt::SendKeyedAt
                | Stmt::SendTopicKeyed
                | Stmt::ExpireKeys
                | Stmt::ForgetQueueKeys
                | Stmt::PauseQueue
                | Stmt::ResumeQueue
                | Stmt::QueuePaused
                | Stmt::ListPaused
                | Stmt::ReadLimited
                | Stmt::AckReadLimited
                | Stmt::PutSchedule
                | Stmt::PauseSchedule
                | Stmt::ResumeSchedule
                | Stmt::RemoveSchedule
                | Stmt::ListSchedules
                | Stmt::DueSchedules
                | Stmt::FireSchedule
                | Stmt::NextScheduleDue
                | Stmt::ReadKeyLimited
                | Stmt::ClaimRange
                | Stmt::RewindClaimCursor
        )
    }

    /// The types of the statement's parameters, read off the casts its SQL
    /// puts on each (`$1::text`): for running it unnamed (`query_typed`),
    /// where the server is told the types instead of inferring them.
    pub(crate) fn param_types(self) -> &'static [tokio_postgres::types::Type] {
        static TYPES: std::sync::OnceLock<Vec<Vec<tokio_postgres::types::Type>>> =
            std::sync::OnceLock::new();
        &TYPES.get_or_init(|| {
            Stmt::ALL
                .iter()
                .map(|s| parse_param_types(s.sql()))
                .collect()
        })[self as usize]
    }
}

/// The type of each `$N::type` cast in `sql`, by parameter number.
fn parse_param_types(sql: &str) -> Vec<tokio_postgres::types::Type> {
    use tokio_postgres::types::Type;
    let mut types: Vec<Option<Type>> = Vec::new();
    let mut rest = sql;
    while let Some(i) = rest.find('$') {
        rest = &rest[i + 1..];
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let Ok(n) = digits.parse::<usize>() else {
            continue;
        };
        let after = &rest[digits.len()..];
        let Some(cast) = after.strip_prefix("::") else {
            continue;
        };
        let name: String = cast
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '[' || *c == ']')
            .collect();
        let ty = match name.as_str() {
            "text" => Type::TEXT,
            "integer" => Type::INT4,
            "bigint" => Type::INT8,
            "bigint[]" => Type::INT8_ARRAY,
            "jsonb" => Type::JSONB,
            "jsonb[]" => Type::JSONB_ARRAY,
            "timestamptz" => Type::TIMESTAMPTZ,
            "timestamptz[]" => Type::TIMESTAMPTZ_ARRAY,
            "text[]" => Type::TEXT_ARRAY,
            "boolean" => Type::BOOL,
            "float8" => Type::FLOAT8,
            other => panic!("statement parameter ${n} has a cast this crate does not map: {other}"),
        };
        if types.len() < n {
            types.resize(n, None);
        }
        types[n - 1] = Some(ty);
    }
    types
        .into_iter()
        .enumerate()
        .map(|(i, t)| t.unwrap_or_else(|| panic!("statement parameter ${} has no cast", i + 1)))
        .collect()
}

/// Number of statements; the size of each connection's cache.
pub(crate) const COUNT: usize = Stmt::ALL.len();

/// The most SQL texts (statements on queue tables, by queue) one connection
/// keeps prepared; past it the texts are forgotten and prepared again.
const MAX_TEXTS: usize = 256;

/// A connection's prepared statements: one slot per [`Stmt`], and the SQL
/// texts that name a queue's table (see `Executor::query_text`), by text.
///
/// An entry can be forgotten ([`forget`](Self::forget)) when the server
/// says its plan went stale (see `call::is_stale_plan`), so that the
/// next use prepares it again.
pub(crate) struct StatementCache {
    /// Run every call as an unnamed statement instead (PgBouncer's
    /// transaction mode before 1.21): nothing is cached.
    pub(crate) unnamed: bool,
    slots: Box<[std::sync::Mutex<Option<Statement>>]>,
    texts: std::sync::Mutex<std::collections::HashMap<Box<str>, Statement>>,
    /// Whether this connection found the `pgmq_sdk` schema trustworthy
    /// (`sdk_schema::check_trust`); checked again after [`clear`](Self::clear).
    pub(crate) sdk_trusted: std::sync::atomic::AtomicBool,
}

/// Locks `m`, recovering from a poisoned lock (the guarded map or slot is
/// valid whatever a panicking holder did: entries are only inserted or
/// removed whole).
fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl StatementCache {
    pub(crate) fn new(unnamed: bool) -> Self {
        StatementCache {
            unnamed,
            slots: (0..COUNT).map(|_| std::sync::Mutex::new(None)).collect(),
            texts: std::sync::Mutex::new(std::collections::HashMap::new()),
            sdk_trusted: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The prepared statement for SQL text `sql`, preparing it with the
    /// given parameter types on first use.
    pub(crate) async fn get_text(
        &self,
        client: &tokio_postgres::Client,
        sql: &str,
        types: &[tokio_postgres::types::Type],
    ) -> Result<Statement, tokio_postgres::Error> {
        if let Some(s) = lock(&self.texts).get(sql) {
            return Ok(s.clone());
        }
        let prepared = client.prepare_typed(sql, types).await?;
        let mut texts = lock(&self.texts);
        if texts.len() >= MAX_TEXTS {
            texts.clear();
        }
        texts.insert(sql.into(), prepared.clone());
        Ok(prepared)
    }

    /// The prepared statement for `stmt`, preparing it on first use (two
    /// callers that race on the first use both prepare; the last one's
    /// statement is kept).
    pub(crate) async fn get(
        &self,
        client: &tokio_postgres::Client,
        stmt: Stmt,
    ) -> Result<Statement, tokio_postgres::Error> {
        if let Some(s) = lock(&self.slots[stmt as usize]).as_ref() {
            return Ok(s.clone());
        }
        let prepared = client.prepare(stmt.sql()).await?;
        *lock(&self.slots[stmt as usize]) = Some(prepared.clone());
        Ok(prepared)
    }

    /// Forgets `stmt`'s prepared statement: the next use prepares it again.
    pub(crate) fn forget(&self, stmt: Stmt) {
        lock(&self.slots[stmt as usize]).take();
    }

    /// Forgets the prepared statement of SQL text `sql`.
    pub(crate) fn forget_text(&self, sql: &str) {
        lock(&self.texts).remove(sql);
    }

    /// Forgets every prepared statement (after PGMQ was re-installed, say).
    pub(crate) fn clear(&mut self) {
        for s in self.slots.iter() {
            lock(s).take();
        }
        lock(&self.texts).clear();
        self.sdk_trusted
            .store(false, std::sync::atomic::Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_statements_parameters_have_a_type() {
        for s in Stmt::ALL {
            let n = s.sql().matches('$').count();
            let types = s.param_types();
            assert!(!types.is_empty() || n == 0, "{s:?}");
        }
        assert_eq!(
            Stmt::Read.param_types(),
            &[
                tokio_postgres::types::Type::TEXT,
                tokio_postgres::types::Type::INT4,
                tokio_postgres::types::Type::INT4
            ]
        );
    }

    /// The statements that look at the catalogs or set a setting rather
    /// than call PGMQ or the SDK.
    const CATALOG: [Stmt; 6] = [
        Stmt::SdkPresent,
        Stmt::QueueTableColumns,
        Stmt::QueueTableLockHolders,
        Stmt::SetLocalTimeouts,
        Stmt::QueueTableAutovacuum,
        Stmt::QueueTableDeadRows,
    ];

    #[test]
    fn every_statement_uses_parameters_for_names() {
        for s in Stmt::ALL {
            let sql = s.sql();
            // PGMQ's or the SDK's objects, or a catalog probe.
            assert!(
                sql.contains("pgmq.") || sql.contains("pgmq_sdk.") || CATALOG.contains(s),
                "{s:?}"
            );
            // The literals are fixed words: a field name of PGMQ's own
            // type, a lock type, the settings set, an empty default.
            let mut sql_ = sql.to_owned();
            for fixed in [
                "'default_partition_length'",
                "'relation'",
                "'lock_timeout'",
                "'statement_timeout'",
                "'USAGE'",
                "'INSERT'",
                "'{}'",
                "''",
            ] {
                sql_ = sql_.replace(fixed, "");
            }
            assert!(!sql_.contains('\''), "{s:?} has a literal");
        }
        assert_eq!(COUNT, Stmt::ALL.len());
    }

    #[test]
    fn every_statement_on_the_sdk_schema_checks_trust_first() {
        for s in Stmt::ALL {
            assert_eq!(s.sql().contains("pgmq_sdk."), s.is_sdk(), "{s:?}");
        }
    }

    #[test]
    fn catalog_functions_are_qualified() {
        let texts: Vec<&str> = Stmt::ALL
            .iter()
            .map(|s| s.sql())
            .chain([crate::conn::version::DETECT_SQL])
            .collect();
        for sql in texts {
            for f in [
                "count(",
                "clock_timestamp(",
                "make_interval(",
                "now(",
                "unnest(",
                "array_agg(",
                "jsonb_build_object(",
                "to_regclass(",
                "to_regprocedure(",
                "current_database(",
            ] {
                for (i, _) in sql.match_indices(f) {
                    let before = &sql[..i];
                    assert!(before.ends_with("pg_catalog."), "unqualified {f} in {sql}");
                }
            }
        }
        assert_eq!(Stmt::ALL[Stmt::Read as usize], Stmt::Read);
    }
}
