//! The SQL of each PGMQ call, prepared once per connection.
//!
//! Every call names one [`Stmt`]; a pooled [`Connection`](crate::Connection)
//! prepares it on first use and keeps the prepared statement for the life of
//! the connection. Parameters carry explicit casts so that PostgreSQL picks the
//! intended overload of PGMQ's functions. Queue names are always parameters.

use tokio::sync::OnceCell;
use tokio_postgres::Statement;

/// The columns of `pgmq.message_record`, in the order `message::raw_from_row` reads.
macro_rules! msg_cols {
    () => {
        "msg_id, read_ct, enqueued_at, last_read_at, vt, message, headers"
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
    // send.rs
    Send = "SELECT * FROM pgmq.send($1::text, $2::jsonb, $3::jsonb, $4::integer)";
    SendAt = "SELECT * FROM pgmq.send($1::text, $2::jsonb, $3::jsonb, $4::timestamptz)";
    SendBatch = "SELECT * FROM pgmq.send_batch($1::text, $2::jsonb[], $3::jsonb[], $4::integer)";
    SendBatchAt = "SELECT * FROM pgmq.send_batch($1::text, $2::jsonb[], $3::jsonb[], $4::timestamptz)";
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
    DeleteBatchCount = "SELECT count(*) FROM pgmq.delete($1::text, $2::bigint[])";
    ArchiveBatchCount = "SELECT count(*) FROM pgmq.archive($1::text, $2::bigint[])";
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
    Metrics = "SELECT * FROM pgmq.metrics($1::text)";
    MetricsAll = "SELECT * FROM pgmq.metrics_all()";
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
}

/// Number of statements; the size of each connection's cache.
pub(crate) const COUNT: usize = Stmt::ALL.len();

/// The most SQL texts (statements on queue tables, by queue) one connection
/// keeps prepared; past it the texts are forgotten and prepared again.
const MAX_TEXTS: usize = 256;

/// A connection's prepared statements: one slot per [`Stmt`], and the SQL
/// texts that name a queue's table (see
/// [`Executor::query_text`](crate::Executor::query_text)), by text.
pub(crate) struct StatementCache {
    slots: Box<[OnceCell<Statement>]>,
    texts: std::sync::Mutex<std::collections::HashMap<Box<str>, Statement>>,
}

impl StatementCache {
    pub(crate) fn new() -> Self {
        StatementCache {
            slots: (0..COUNT).map(|_| OnceCell::new()).collect(),
            texts: std::sync::Mutex::new(std::collections::HashMap::new()),
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
        if let Some(s) = self.lock_texts().get(sql) {
            return Ok(s.clone());
        }
        let prepared = client.prepare_typed(sql, types).await?;
        let mut texts = self.lock_texts();
        if texts.len() >= MAX_TEXTS {
            texts.clear();
        }
        texts.insert(sql.into(), prepared.clone());
        Ok(prepared)
    }

    fn lock_texts(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<Box<str>, Statement>> {
        self.texts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The prepared statement for `stmt`, preparing it on first use.
    pub(crate) async fn get(
        &self,
        client: &tokio_postgres::Client,
        stmt: Stmt,
    ) -> Result<Statement, tokio_postgres::Error> {
        self.slots[stmt as usize]
            .get_or_try_init(|| client.prepare(stmt.sql()))
            .await
            .cloned()
    }

    /// Forgets every prepared statement (after PGMQ was re-installed, say).
    pub(crate) fn clear(&mut self) {
        for s in self.slots.iter_mut() {
            s.take();
        }
        self.lock_texts().clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_statement_uses_parameters_for_names() {
        for s in Stmt::ALL {
            let sql = s.sql();
            assert!(sql.contains("pgmq."), "{s:?}");
            assert!(!sql.contains('\''), "{s:?} has a literal");
        }
        assert_eq!(COUNT, Stmt::ALL.len());
        assert_eq!(Stmt::ALL[Stmt::Read as usize], Stmt::Read);
    }
}
