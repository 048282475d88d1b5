//! PGMQ's functions and tables, as [`Pgmq`](crate::Pgmq) methods on the
//! call path of [`conn`](crate::conn): queues, sending, reading,
//! acknowledging, FIFO groups, notifications, topics, the remaining
//! public functions, and the statements on PGMQ's tables that are not
//! PGMQ functions (the fenced writes and locks, the dead-letter move and
//! the move between queues,
//! `read_from`, the looks, the catalog probes of a queue's table, its
//! autovacuum settings and the vacuum a caller runs); with
//! the message and queue-name types they take and return.

pub(crate) mod ack;
pub(crate) mod autovacuum;
pub(crate) mod catalog;
pub(crate) mod dead_letter;
pub(crate) mod fenced;
pub(crate) mod fifo;
pub(crate) mod functions;
pub(crate) mod message;
pub(crate) mod move_messages;
pub(crate) mod notify;
pub(crate) mod overview;
pub(crate) mod peek;
pub(crate) mod queue;
pub(crate) mod queue_name;
pub(crate) mod read;
pub(crate) mod read_from;
pub(crate) mod redrive;
pub(crate) mod retention;
pub(crate) mod send;
pub(crate) mod topics;
pub mod trace;
pub(crate) mod vacuum;

pub use autovacuum::{TableAutovacuum, QUEUE_TABLE_AUTOVACUUM};
pub use catalog::{LockHolder, TableColumn};
pub use dead_letter::DeadLetter;
pub use fenced::{Receipt, Requeue, MAX_DELAY};
pub use fifo::{GroupStrategy, FIFO_GROUP_HEADER};
pub use message::{Decoded, Delay, Message, RawJson, SendOptions, Undecoded};
pub use move_messages::{MoveBatch, MoveHeaders, MoveSelection, Moved};
pub use notify::{Listener, Notification, NotificationStream, NotifyThrottle};
pub use overview::{DeadLetterReason, QueueOverview};
pub use peek::ArchivedMessage;
pub use queue::{QueueInfo, QueueMetrics};
pub use queue_name::{quote_ident, QueueName, MAX_QUEUE_NAME_LEN, NOTIFY_KEEPS_CASE};
pub use read::ReadOptions;
pub use read_from::ReadFrom;
pub use redrive::{Redrive, RedriveBatch, RedriveMoved, RedriveOptions};
pub use retention::{ArchiveRetention, Pruned};
pub use topics::{RouteMatch, TopicBinding};
pub use vacuum::TableRows;
