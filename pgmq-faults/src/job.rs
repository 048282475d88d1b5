//! The body of every message the suite produces, and what it asks its handler
//! to do.

use serde::{Deserialize, Serialize};

/// The header that carries a message's key, also for bodies that hold none
/// (JSON null, a bare array).
pub(crate) const KEY_HEADER: &str = "fault_key";

/// A message body: a unique key, optionally instructions for the handler and
/// some data (a 1 MiB string, a deeply nested array).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Job {
    /// Unique within a run and scenario.
    pub key: i64,
    /// What the handler does with it (nothing special when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub act: Option<Act>,
    /// Opaque data; decoded as a `serde_json::Value`, so its depth counts
    /// against serde_json's recursion limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<serde_json::Value>,
    /// A field whose decoding panics: the body never decodes (the panic
    /// happens inside the worker's decode, before any handler runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boom: Option<Boom>,
}

/// A value that serializes as `true` and panics when deserialized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Boom;

impl Serialize for Boom {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bool(true)
    }
}

impl<'de> Deserialize<'de> for Boom {
    fn deserialize<D: serde::Deserializer<'de>>(_: D) -> Result<Self, D::Error> {
        panic!("planned panic in Deserialize")
    }
}

impl Job {
    pub(crate) fn plain(key: i64) -> Job {
        Job {
            key,
            act: None,
            data: None,
            boom: None,
        }
    }

    pub(crate) fn with(key: i64, act: Act) -> Job {
        Job {
            key,
            act: Some(act),
            data: None,
            boom: None,
        }
    }
}

/// Instructions for the handler, by delivery attempt (`read_ct`, 1 first).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct Act {
    /// Panic on attempts before this one (`i32::MAX`: always).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub panic_before: i32,
    /// Return an error on attempts before this one.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub fail_before: i32,
    /// Sleep this long before recording the handling.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub sleep_ms: u64,
    /// Hang (sleep for an hour) on attempts before this one.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub hang_before: i32,
    /// How long a hang lasts, milliseconds (0: an hour).
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub hang_ms: u64,
    /// Return [`Outcome::Snooze`](pgmq_worker::Outcome::Snooze) (200 ms, no
    /// attempt used) while the message is younger than this: a snooze
    /// undoes its read, so neither `read_ct` nor the attempt can count them.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub snooze_ms: u64,
    /// Fail every attempt unless the message carries the `fault_redriven`
    /// header (a redrive from the dead-letter queue sent it back).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fail_unless_redriven: bool,
    /// On the first delivery, make the claim expire under the running
    /// handler and wait for the next delivery to start before succeeding
    /// (a stale acknowledgement; the worker's `expire_once`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub expire_once: bool,
}

/// Constructors of an [`Act`] that gives one instruction: each sets the
/// field it is named after.
macro_rules! only {
    ($($(#[$doc:meta])* fn $field:ident($($arg:ident: $t:ty)?) = $value:expr;)*) => {
        $(
            $(#[$doc])*
            pub(crate) fn $field($($arg: $t)?) -> Act {
                Act {
                    $field: $value,
                    ..Act::default()
                }
            }
        )*
    };
}

impl Act {
    only! {
        /// Panics on attempts before `n`.
        fn panic_before(n: i32) = n;
        /// Fails on attempts before `n`.
        fn fail_before(n: i32) = n;
        /// Sleeps `ms` before recording the handling.
        fn sleep_ms(ms: u64) = ms;
        /// Hangs (an hour) on attempts before `n`.
        fn hang_before(n: i32) = n;
        /// Snoozes while the message is younger than `ms`.
        fn snooze_ms(ms: u64) = ms;
        /// Fails every attempt unless the message was redriven.
        fn fail_unless_redriven() = true;
        /// Makes the first delivery's claim expire under its handler.
        fn expire_once() = true;
    }
}

fn is_zero(v: &i32) -> bool {
    *v == 0
}

fn is_zero_u64(v: &u64) -> bool {
    *v == 0
}

/// The header asking the fault worker's hook to panic on a message's
/// first attempt: `"before"` (in [`Hook::before`](pgmq_worker::Hook::before))
/// or `"after"` (in [`Hook::after`](pgmq_worker::Hook::after)).
pub(crate) const HOOK_PANIC_HEADER: &str = "fault_hook_panic";

/// The header a message sent back from a dead-letter queue (the
/// campaign's `redrive` fault) carries.
pub(crate) const REDRIVEN_HEADER: &str = "fault_redriven";

/// The headers sent with a key.
pub(crate) fn key_headers(key: i64) -> serde_json::Value {
    serde_json::json!({ KEY_HEADER: key })
}
