//! The SDK's own schema features, beside PGMQ's objects in the schema
//! `pgmq_sdk`: its install, upgrade and repair ([`sdk_schema`]),
//! idempotent sends, pausing a queue, reads under a fleet-wide limit or a
//! limit per key, and periodic sends;
//! built on [`pgmq`](crate::pgmq)'s calls and the call path of
//! [`conn`](crate::conn), which checks that the schema may be trusted
//! before a connection first runs anything of it.

pub(crate) mod cadence;
pub(crate) mod claim_cursor;
pub(crate) mod key_limits;
pub(crate) mod keyed;
pub(crate) mod limits;
pub(crate) mod pause;
pub(crate) mod presence;
pub(crate) mod schedule;
pub mod sdk_schema;

pub use cadence::{tick_key, Cadence};
pub use key_limits::{KeyFrom, KeyLimit, MAX_KEY_PATH};
pub use keyed::{DedupKey, Sent, TopicSent, MAX_DEDUP_KEY_LEN};
pub use limits::FleetLimit;
pub use pause::{PausedQueue, PAUSE_FLAG_GRANTS};
pub use presence::{WorkerPresence, PRESENCE_KEPT_SECS};
pub use schedule::{
    DueSchedule, FiredTick, FiringPass, Schedule, ScheduleInfo, DEFAULT_CATCH_UP, MAX_CATCH_UP,
    MAX_SCHEDULE_NAME_LEN, SCHEDULE_HEADER, TICK_HEADER,
};
