//! One serializable description of a worker: which kind of handler it runs
//! and every [`WorkerBuilder`] setting, for the harnesses that start
//! workers in child processes (the benchmark's `processes` and
//! `fleet_limit` sections, the fault suite and its campaign).
//!
//! A harness puts a [`WorkerSpec`] in the JSON argument of its child
//! ([`crate::child`]), next to what only it needs (where to record handled
//! ids, a sabotage). The child calls [`WorkerSpec::builder`] and attaches
//! its handler of [`WorkerSpec::handler`]'s kind. A new worker setting is
//! mirrored here once: a field of [`WorkerSettings`] and its line in
//! [`WorkerSettings::apply`].
//!
//! Every setting is optional: absent, the builder's default applies, so a
//! spec written by an older harness still reads. Durations are whole
//! milliseconds, so that the JSON stays readable.
//!
//! ```
//! use pgmq_testkit::spec::{HandlerKind, WorkerSettings, WorkerSpec};
//!
//! let spec = WorkerSpec {
//!     handler: HandlerKind::Transactional,
//!     settings: WorkerSettings {
//!         concurrency: Some(16),
//!         visibility_timeout_ms: Some(30_000),
//!         fleet_limit: Some(4),
//!         ..WorkerSettings::default()
//!     },
//!     ..WorkerSpec::new("orders")
//! };
//! let json = serde_json::to_string(&spec).unwrap();
//! let back: WorkerSpec = serde_json::from_str(&json).unwrap();
//! assert_eq!(back, spec);
//! // Absent settings stay absent.
//! assert!(!json.contains("batch_size"));
//! ```

use std::time::Duration;

use pgmq_client::{FleetLimit, KeyFrom, KeyLimit, QueueName};
use pgmq_worker::{
    Backoff, ClaimReads, QueueVacuum, SchedulerConfig, WakeUp, Worker, WorkerBuilder,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::BoxError;

/// A worker: its queue, its handler's kind, its settings and its pool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerSpec {
    /// The queue it consumes.
    pub queue: String,
    /// Which kind of handler the child attaches (the child decides what
    /// the handler does).
    #[serde(default)]
    pub handler: HandlerKind,
    /// The builder's settings.
    #[serde(default)]
    pub settings: WorkerSettings,
    /// Connections of the worker's client pool (absent: the client's
    /// default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_size: Option<u32>,
    /// `application_name` of the worker's connections (absent: the
    /// client's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub application_name: Option<String>,
}

impl WorkerSpec {
    /// A worker of `queue` with a [`HandlerKind::Context`] handler and
    /// every setting at the builder's default.
    pub fn new(queue: &str) -> WorkerSpec {
        WorkerSpec {
            queue: queue.to_owned(),
            handler: HandlerKind::default(),
            settings: WorkerSettings::default(),
            pool_size: None,
            application_name: None,
        }
    }

    /// The builder of this worker on `client`: its queue checked, its
    /// settings applied. The caller attaches the handler and builds.
    pub fn builder<T: DeserializeOwned + Send + 'static>(
        &self,
        client: pgmq_client::Client,
    ) -> Result<WorkerBuilder<T>, BoxError> {
        let queue = QueueName::new(&self.queue)?;
        self.settings.apply(Worker::<T>::builder(client, queue))
    }
}

/// The kind of handler a worker runs; what it does is the child's own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HandlerKind {
    /// An async handler with a `Context` (`handler_with_context`).
    #[default]
    Context,
    /// A `TransactionalHandler`: its writes commit with the message's
    /// delete.
    Transactional,
    /// A `BlockingHandler` on a dedicated thread.
    Blocking,
}

/// How a worker reads its queue ([`ClaimReads`], by name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClaimReadsSpec {
    /// [`ClaimReads::Bounded`].
    Bounded,
    /// [`ClaimReads::FromStart`].
    FromStart,
    /// [`ClaimReads::Function`].
    Function,
    /// [`ClaimReads::FifoGroups`].
    FifoGroups,
}

impl From<ClaimReadsSpec> for ClaimReads {
    fn from(s: ClaimReadsSpec) -> ClaimReads {
        match s {
            ClaimReadsSpec::Bounded => ClaimReads::Bounded,
            ClaimReadsSpec::FromStart => ClaimReads::FromStart,
            ClaimReadsSpec::Function => ClaimReads::Function,
            ClaimReadsSpec::FifoGroups => ClaimReads::FifoGroups,
        }
    }
}

/// How a worker learns of new messages ([`WakeUp`], by name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WakeUpSpec {
    /// [`WakeUp::Poll`].
    Poll,
    /// [`WakeUp::Notify`].
    Notify,
}

impl From<WakeUpSpec> for WakeUp {
    fn from(s: WakeUpSpec) -> WakeUp {
        match s {
            WakeUpSpec::Poll => WakeUp::Poll,
            WakeUpSpec::Notify => WakeUp::Notify,
        }
    }
}

/// An exponential retry backoff: `base`, doubling up to `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackoffSpec {
    /// The first retry's delay, milliseconds.
    pub base_ms: u64,
    /// The largest delay, milliseconds.
    pub max_ms: u64,
}

/// Every [`WorkerBuilder`] setting a harness may set, each named after the
/// builder's method; `None` leaves the builder's default.
///
/// The builder's testing switches (`fence_off`, `panic_once_in`, ...) are
/// not here: they exist only with pgmq-worker's `fault-injection` feature,
/// and the fault suite sets them from its own sabotage list.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(missing_docs)]
pub struct WorkerSettings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_size: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_capacity: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claimers: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub visibility_timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poll_interval_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wake_up: Option<WakeUpSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notify_throttle_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_backoff: Option<BackoffSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_jitter: Option<bool>,
    /// The dead-letter queue's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter_queue: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_grace_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ack_batch_size: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ack_flush_interval_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ack_capacity: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ack_flushers: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ack_retry_timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ack_drain_timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handler_timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_abandoned_blocking_threads: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_deliveries: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_interval_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub db_timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_reads: Option<ClaimReadsSpec>,
    /// Places of a fleet-wide limit (`FleetLimit::max_running`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet_limit: Option<u32>,
    /// A limit per key (`KeyLimit`): places per key, the key a header.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_limit: Option<KeyLimitSpec>,
    /// The presence record's interval (`WorkerBuilder::presence`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub presence_ms: Option<u64>,
    /// A scheduler of periodic sends beside the worker, its passes at most
    /// this far apart (`WorkerBuilder::scheduler`,
    /// `SchedulerConfig::poll_interval`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler_ms: Option<u64>,
    /// The dead row versions at which the worker vacuums its queue table
    /// (`WorkerBuilder::vacuum`, `QueueVacuum::at_dead_rows`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vacuum: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check_queue: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_small_pool: Option<bool>,
}

/// A limit per key of places (`FleetLimit::max_running`) for each value of
/// the header `header`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyLimitSpec {
    /// The header whose value is the key.
    pub header: String,
    /// Places per key.
    pub max_running: u32,
}

/// `b` with `f(value)` applied when the setting is present.
fn set<B, V>(b: B, v: Option<V>, f: impl FnOnce(B, V) -> B) -> B {
    match v {
        Some(v) => f(b, v),
        None => b,
    }
}

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

impl WorkerSettings {
    /// `b` with every present setting applied; an invalid dead-letter
    /// queue name is an error.
    pub fn apply<T: DeserializeOwned + Send + 'static>(
        &self,
        b: WorkerBuilder<T>,
    ) -> Result<WorkerBuilder<T>, BoxError> {
        let s = self.clone();
        let b = set(b, s.concurrency, |b, v| b.concurrency(v));
        let b = set(b, s.batch_size, |b, v| b.batch_size(v));
        let b = set(b, s.claim_capacity, |b, v| b.claim_capacity(v));
        let b = set(b, s.claimers, |b, v| b.claimers(v));
        let b = set(b, s.visibility_timeout_ms, |b, v| {
            b.visibility_timeout(ms(v))
        });
        let b = set(b, s.poll_interval_ms, |b, v| b.poll_interval(ms(v)));
        let b = set(b, s.wake_up, |b, v| b.wake_up(v.into()));
        let b = set(b, s.notify_throttle_ms, |b, v| b.notify_throttle(ms(v)));
        let b = set(b, s.max_attempts, |b, v| b.max_attempts(v));
        let b = set(b, s.retry_backoff, |b, v| {
            b.retry_backoff(Backoff::exponential(ms(v.base_ms), ms(v.max_ms)))
        });
        let b = set(b, s.retry_jitter, |b, v| b.retry_jitter(v));
        let b = match &s.dead_letter_queue {
            Some(q) => b.dead_letter_queue(QueueName::new(q)?),
            None => b,
        };
        let b = set(b, s.shutdown_grace_ms, |b, v| b.shutdown_grace(ms(v)));
        let b = set(b, s.heartbeat, |b, v| b.heartbeat(v));
        let b = set(b, s.ack_batch_size, |b, v| b.ack_batch_size(v));
        let b = set(b, s.ack_flush_interval_ms, |b, v| {
            b.ack_flush_interval(ms(v))
        });
        let b = set(b, s.ack_capacity, |b, v| b.ack_capacity(v));
        let b = set(b, s.ack_flushers, |b, v| b.ack_flushers(v));
        let b = set(b, s.ack_retry_timeout_ms, |b, v| b.ack_retry_timeout(ms(v)));
        let b = set(b, s.ack_drain_timeout_ms, |b, v| b.ack_drain_timeout(ms(v)));
        let b = set(b, s.handler_timeout_ms, |b, v| b.handler_timeout(ms(v)));
        let b = set(b, s.max_abandoned_blocking_threads, |b, v| {
            b.max_abandoned_blocking_threads(v)
        });
        let b = set(b, s.max_deliveries, |b, v| b.max_deliveries(v));
        let b = set(b, s.metrics_interval_ms, |b, v| b.metrics_interval(ms(v)));
        let b = set(b, s.db_timeout_ms, |b, v| b.db_timeout(ms(v)));
        let b = set(b, s.claim_reads, |b, v| b.claim_reads(v.into()));
        let b = set(b, s.fleet_limit, |b, v| {
            b.fleet_limit(FleetLimit::max_running(v))
        });
        let b = match &s.key_limit {
            Some(k) => b.key_limit(KeyLimit::new(
                KeyFrom::header(k.header.as_str())?,
                FleetLimit::max_running(k.max_running),
            )),
            None => b,
        };
        let b = set(b, s.presence_ms, |b, v| b.presence(Some(ms(v))));
        let b = set(b, s.scheduler_ms, |b, v| {
            b.scheduler(SchedulerConfig::default().poll_interval(ms(v)))
        });
        let b = set(b, s.vacuum, |b, v| {
            b.vacuum(Some(QueueVacuum::at_dead_rows(v)))
        });
        let b = set(b, s.check_queue, |b, v| b.check_queue(v));
        Ok(set(b, s.allow_small_pool, |b, v| b.allow_small_pool(v)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_setting_round_trips() {
        let s = WorkerSettings {
            concurrency: Some(1),
            batch_size: Some(2),
            claim_capacity: Some(3),
            claimers: Some(1),
            visibility_timeout_ms: Some(4_000),
            poll_interval_ms: Some(5),
            wake_up: Some(WakeUpSpec::Notify),
            notify_throttle_ms: Some(6),
            max_attempts: Some(7),
            retry_backoff: Some(BackoffSpec {
                base_ms: 8,
                max_ms: 9,
            }),
            retry_jitter: Some(false),
            dead_letter_queue: Some("dlq".into()),
            shutdown_grace_ms: Some(10),
            heartbeat: Some(true),
            ack_batch_size: Some(11),
            ack_flush_interval_ms: Some(12),
            ack_capacity: Some(13),
            ack_flushers: Some(1),
            ack_retry_timeout_ms: Some(14),
            ack_drain_timeout_ms: Some(15),
            handler_timeout_ms: Some(16),
            max_abandoned_blocking_threads: Some(17),
            max_deliveries: Some(18),
            metrics_interval_ms: Some(19),
            db_timeout_ms: Some(20),
            claim_reads: Some(ClaimReadsSpec::FifoGroups),
            fleet_limit: Some(21),
            key_limit: Some(KeyLimitSpec {
                header: "k".into(),
                max_running: 2,
            }),
            presence_ms: Some(10_000),
            scheduler_ms: Some(500),
            vacuum: Some(10_000),
            check_queue: Some(false),
            allow_small_pool: Some(true),
        };
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<WorkerSettings>(&json).unwrap(), s);
    }

    #[test]
    fn unknown_settings_are_refused() {
        let e = serde_json::from_str::<WorkerSettings>(r#"{"concurency": 4}"#).unwrap_err();
        assert!(e.to_string().contains("concurency"), "{e}");
    }
}
