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
}

impl Job {
    pub(crate) fn plain(key: i64) -> Job {
        Job {
            key,
            act: None,
            data: None,
        }
    }

    pub(crate) fn with(key: i64, act: Act) -> Job {
        Job {
            key,
            act: Some(act),
            data: None,
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
}

fn is_zero(v: &i32) -> bool {
    *v == 0
}

fn is_zero_u64(v: &u64) -> bool {
    *v == 0
}

/// The headers sent with a key.
pub(crate) fn key_headers(key: i64) -> serde_json::Value {
    serde_json::json!({ KEY_HEADER: key })
}
