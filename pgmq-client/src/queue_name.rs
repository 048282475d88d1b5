//! The validated queue-name type.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use crate::error::{shorten, Error};

/// PGMQ's limit: `template_pgmq_q_` (16) plus the name must fit PostgreSQL's
/// 63-byte identifiers.
pub const MAX_QUEUE_NAME_LEN: usize = 47;

/// A queue name that PGMQ accepts, checked before any SQL runs.
///
/// Rules: 1 to 47 characters, each an ASCII lowercase letter, digit or `_`.
/// PGMQ lowercases table names, so `Orders` and `orders` would share tables;
/// uppercase is therefore refused rather than silently folded. Quotes, `;`,
/// `--`, `$`, spaces and non-ASCII characters are refused too. Names are sent
/// to the server as bound parameters. The calls that are statements on the
/// queue's tables rather than PGMQ functions
/// ([`read_from`](crate::Pgmq::read_from), the fenced writes such as
/// [`delete_fenced`](crate::Pgmq::delete_fenced), and
/// [`release_batch`](crate::Pgmq::release_batch)) quote the table name built
/// from a validated name, which cannot close the quotes.
///
/// Cloning is cheap (the name is shared).
///
/// ```
/// use pgmq_client::QueueName;
///
/// let q = QueueName::new("orders_v2")?;
/// assert_eq!(q.as_str(), "orders_v2");
/// assert!(QueueName::new("x'; drop table pgmq.meta; --").is_err());
/// assert!(QueueName::new(&"a".repeat(48)).is_err());
/// # Ok::<(), pgmq_client::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QueueName(Arc<str>);

impl QueueName {
    /// Validates `name`.
    pub fn new(name: &str) -> Result<Self, Error> {
        validate(name)?;
        Ok(QueueName(Arc::from(name)))
    }

    /// The name as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The PGMQ queue table, `pgmq.q_<name>`.
    pub fn table(&self) -> String {
        format!("pgmq.q_{}", self.0)
    }

    /// The queue table as a quoted identifier for SQL text, `pgmq."q_<name>"`.
    ///
    /// Safe to splice into SQL by construction: a validated name holds only
    /// `[a-z0-9_]`, so it can neither close the quotes nor change case.
    pub fn quoted_table(&self) -> String {
        format!("pgmq.\"q_{}\"", self.0)
    }

    /// The archive table as a quoted identifier for SQL text,
    /// `pgmq."a_<name>"` (safe to splice, as [`quoted_table`](Self::quoted_table)).
    pub fn quoted_archive_table(&self) -> String {
        format!("pgmq.\"a_{}\"", self.0)
    }

    /// The PGMQ archive table, `pgmq.a_<name>`.
    pub fn archive_table(&self) -> String {
        format!("pgmq.a_{}", self.0)
    }

    /// The channel PGMQ notifies on insert once
    /// [`enable_notify_insert`](crate::Pgmq::enable_notify_insert) ran:
    /// `pgmq.q_<name>.INSERT`.
    pub fn insert_channel(&self) -> String {
        format!("pgmq.q_{}.INSERT", self.0)
    }
}

fn validate(name: &str) -> Result<(), Error> {
    let fail = |reason| {
        Err(Error::InvalidQueueName {
            name: shorten(name),
            reason,
        })
    };
    if name.is_empty() {
        return fail("the name is empty");
    }
    if name.len() > MAX_QUEUE_NAME_LEN {
        return fail("longer than 47 characters, PGMQ's limit");
    }
    for c in name.chars() {
        match c {
            'a'..='z' | '0'..='9' | '_' => {}
            'A'..='Z' => {
                return fail(
                    "uppercase letters: PGMQ folds table names to lowercase; use lowercase",
                )
            }
            _ => return fail("only ASCII lowercase letters, digits and '_' are allowed"),
        }
    }
    Ok(())
}

impl FromStr for QueueName {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        QueueName::new(s)
    }
}

impl TryFrom<&str> for QueueName {
    type Error = Error;
    fn try_from(s: &str) -> Result<Self, Error> {
        QueueName::new(s)
    }
}

impl TryFrom<String> for QueueName {
    type Error = Error;
    fn try_from(s: String) -> Result<Self, Error> {
        QueueName::new(&s)
    }
}

impl AsRef<str> for QueueName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for QueueName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for QueueName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl serde::Serialize for QueueName {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for QueueName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        QueueName::new(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_plain_names() {
        for n in ["a", "orders", "q_1", "_x", "0abc", &"z".repeat(47)] {
            assert!(QueueName::new(n).is_ok(), "{n}");
        }
    }

    #[test]
    fn rejects_hostile_and_odd_names() {
        let long = "a".repeat(48);
        let two_hundred = "b".repeat(200);
        for n in [
            "",
            "a'b",
            "a\"b",
            "a;b",
            "a--b",
            "a$b",
            "a b",
            "a.b",
            "a-b",
            "Orders",
            "ünïcode",
            "名前",
            "x'); drop table pgmq.meta; --",
            "a\0b",
            long.as_str(),
            two_hundred.as_str(),
        ] {
            let err = QueueName::new(n).unwrap_err();
            assert!(
                matches!(err, Error::InvalidQueueName { .. }),
                "{n:?}: {err:?}"
            );
        }
    }

    #[test]
    fn error_names_the_reason_and_truncates() {
        let err = QueueName::new(&"c".repeat(200)).unwrap_err().to_string();
        assert!(err.contains("47"), "{err}");
        assert!(err.len() < 200, "{err}");
        let err = QueueName::new("Orders").unwrap_err().to_string();
        assert!(err.contains("lowercase"), "{err}");
    }

    #[test]
    fn derived_names() {
        let q = QueueName::new("jobs").unwrap();
        assert_eq!(q.table(), "pgmq.q_jobs");
        assert_eq!(q.archive_table(), "pgmq.a_jobs");
        assert_eq!(q.quoted_table(), "pgmq.\"q_jobs\"");
        assert_eq!(q.insert_channel(), "pgmq.q_jobs.INSERT");
        assert_eq!("jobs".parse::<QueueName>().unwrap(), q);
        let json = serde_json::to_string(&q).unwrap();
        assert_eq!(json, "\"jobs\"");
        assert!(serde_json::from_str::<QueueName>("\"a;b\"").is_err());
    }
}
