//! The validated queue-name type.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use crate::conn::args::shorten;
use crate::conn::error::Error;
use crate::conn::version::Version;

/// PGMQ's limit: `template_pgmq_q_` (16) plus the name must fit PostgreSQL's
/// 63-byte identifiers.
pub const MAX_QUEUE_NAME_LEN: usize = 47;

/// A queue name that PGMQ accepts, checked before any SQL runs.
///
/// The rules are PGMQ 1.13's, which other PGMQ clients create queues by,
/// less what cannot be addressed safely from here:
///
/// - 1 to 47 characters (PGMQ's limit: `template_pgmq_q_` plus the name must
///   fit PostgreSQL's 63-byte identifiers);
/// - printable ASCII only: letters of either case, digits, space and
///   punctuation such as `_ - . : / " #`. Non-ASCII letters are refused:
///   PostgreSQL cuts identifiers at 63 bytes, which a 47-character name
///   of them can pass, and lowercases them by the server's locale, so the
///   table name would not be known here. Control characters (NUL, tab,
///   newline) are refused too;
/// - none of `$`, `;`, `'` or `--`, which PGMQ itself refuses.
///
/// PGMQ folds the table name to lowercase: the queue `Orders-EU.v2` lives in
/// `pgmq."q_orders-eu.v2"`, so names that differ only in case share their
/// tables (PGMQ keeps them apart in `pgmq.meta` only). The name is sent to
/// PGMQ's functions as given, always as a bound parameter. The calls that
/// are statements on the queue's tables rather than PGMQ functions
/// ([`read_from`](crate::Pgmq::read_from), the fenced writes such as
/// [`delete_fenced`](crate::Pgmq::delete_fenced), and
/// [`release_batch`](crate::Pgmq::release_batch)) name the folded table as
/// a quoted identifier ([`quoted_table`](Self::quoted_table)), its `"`
/// doubled, so no name can close the quotes.
///
/// Cloning is cheap (the name is shared).
///
/// ```
/// use pgmq_client::QueueName;
///
/// let q = QueueName::new("orders_v2")?;
/// assert_eq!(q.as_str(), "orders_v2");
/// let eu = QueueName::new("Orders-EU.v2")?;
/// assert_eq!(eu.quoted_table(), r#"pgmq."q_orders-eu.v2""#);
/// assert!(QueueName::new("x'; drop table pgmq.meta; --").is_err());
/// assert!(QueueName::new(&"a".repeat(48)).is_err());
/// # Ok::<(), pgmq_client::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QueueName(Arc<str>);

/// The first PGMQ whose insert trigger notifies queues whose names have
/// uppercase letters, on `pgmq.q_<name as given>.INSERT`. Before it the
/// trigger rebuilt the name from the (lowercased) table name, matched no
/// throttle row for such a queue, and sent nothing.
pub const NOTIFY_KEEPS_CASE: Version = Version::new(1, 13, 1);

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

    /// The queue table's name as PGMQ makes it: `q_` and the name, folded
    /// to lowercase (`q_orders-eu.v2`), unquoted and without the schema.
    pub fn table_name(&self) -> String {
        format!("q_{}", self.0.to_ascii_lowercase())
    }

    /// The archive table's name as PGMQ makes it, `a_<name folded>`.
    pub fn archive_table_name(&self) -> String {
        format!("a_{}", self.0.to_ascii_lowercase())
    }

    /// The PGMQ queue table, `pgmq.q_<name folded>`, for display. In SQL
    /// text use [`quoted_table`](Self::quoted_table): a name with `-`, `.`
    /// or a space is no identifier unquoted.
    pub fn table(&self) -> String {
        format!("pgmq.{}", self.table_name())
    }

    /// The queue table as a quoted identifier for SQL text,
    /// `pgmq."q_<name folded>"`: safe to splice, since [`quote_ident`]
    /// doubles any `"` in it.
    pub fn quoted_table(&self) -> String {
        format!("pgmq.{}", quote_ident(&self.table_name()))
    }

    /// The archive table as a quoted identifier for SQL text,
    /// `pgmq."a_<name folded>"` (safe to splice, as [`quoted_table`](Self::quoted_table)).
    pub fn quoted_archive_table(&self) -> String {
        format!("pgmq.{}", quote_ident(&self.archive_table_name()))
    }

    /// The PGMQ archive table, `pgmq.a_<name folded>`, for display.
    pub fn archive_table(&self) -> String {
        format!("pgmq.{}", self.archive_table_name())
    }

    /// The channel PGMQ notifies on insert once
    /// [`enable_notify_insert`](crate::Pgmq::enable_notify_insert) ran:
    /// `pgmq.q_<name as given>.INSERT`. That is the channel of every PGMQ
    /// this crate supports for names without uppercase letters; for a name
    /// with them, PGMQ before [`NOTIFY_KEEPS_CASE`] (1.13.1) sends nothing
    /// (see [`insert_channel_for`](Self::insert_channel_for)).
    pub fn insert_channel(&self) -> String {
        format!("pgmq.q_{}.INSERT", self.0)
    }

    /// The channel the insert trigger of PGMQ `version` notifies for this
    /// queue; None when that version's trigger never notifies it (a name
    /// with uppercase letters before 1.13.1).
    ///
    /// ```
    /// use pgmq_client::{QueueName, Version};
    /// let q = QueueName::new("Orders-EU")?;
    /// assert_eq!(q.insert_channel_for(Version::new(1, 13, 0)), None);
    /// assert_eq!(
    ///     q.insert_channel_for(Version::new(1, 13, 1)).as_deref(),
    ///     Some("pgmq.q_Orders-EU.INSERT")
    /// );
    /// # Ok::<(), pgmq_client::Error>(())
    /// ```
    pub fn insert_channel_for(&self, version: Version) -> Option<String> {
        // Before 1.13.1 the channel is `'pgmq.' || TG_TABLE_NAME`, the
        // folded table name, and it is only sent when that matches the
        // queue's name: when the name has no uppercase letters, where it
        // equals `insert_channel()`.
        if version < NOTIFY_KEEPS_CASE && self.0.bytes().any(|b| b.is_ascii_uppercase()) {
            return None;
        }
        Some(self.insert_channel())
    }
}

/// `s` as a quoted SQL identifier, as PostgreSQL's `quote_ident` writes it
/// when quoting is needed: in double quotes, each `"` doubled. Always
/// quoted, so case and every character are kept.
///
/// ```
/// assert_eq!(pgmq_client::quote_ident(r#"q_a"b"#), r#""q_a""b""#);
/// ```
pub fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
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
    if !name.is_ascii() {
        return fail(
            "only ASCII characters are allowed: PostgreSQL cuts identifiers at 63 bytes \
             and lowercases other letters by the server's locale",
        );
    }
    if name.len() > MAX_QUEUE_NAME_LEN {
        return fail("longer than 47 characters, PGMQ's limit");
    }
    if name.bytes().any(|b| b.is_ascii_control()) {
        return fail("control characters (NUL, tab, newline) are not allowed");
    }
    if name.contains(['$', ';', '\'']) || name.contains("--") {
        return fail("PGMQ refuses $, ;, -- and ' in queue names");
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
    fn accepts_what_pgmq_accepts_and_can_be_addressed() {
        for n in [
            "a",
            "orders",
            "q_1",
            "_x",
            "0abc",
            &"z".repeat(47),
            "Orders",
            "Orders-EU.v2",
            "a-b",
            "a.b",
            "my queue",
            "a\"b",
            "tenant/orders:high#1",
            "../etc",
            "q/*c*/",
        ] {
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
            "a;b",
            "a--b",
            "a$b",
            "ünïcode",
            "名前",
            "x'); drop table pgmq.meta; --",
            "a\0b",
            "a\tb",
            "a\nb",
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
    fn error_names_the_rule_and_truncates() {
        let err = QueueName::new(&"c".repeat(200)).unwrap_err().to_string();
        assert!(err.contains("47"), "{err}");
        assert!(err.len() < 200, "{err}");
        for (name, rule) in [
            ("a'b", "PGMQ refuses"),
            ("a--b", "--"),
            ("名前", "ASCII"),
            ("a\nb", "control characters"),
            ("", "empty"),
        ] {
            let err = QueueName::new(name).unwrap_err().to_string();
            assert!(err.contains(rule), "{name:?}: {err}");
        }
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

    #[test]
    fn tables_are_folded_and_quoted() {
        let q = QueueName::new("Orders-EU.v2").unwrap();
        assert_eq!(q.table_name(), "q_orders-eu.v2");
        assert_eq!(q.quoted_table(), "pgmq.\"q_orders-eu.v2\"");
        assert_eq!(q.quoted_archive_table(), "pgmq.\"a_orders-eu.v2\"");
        let q = QueueName::new("My \"Q\"").unwrap();
        assert_eq!(q.quoted_table(), "pgmq.\"q_my \"\"q\"\"\"");
        assert_eq!(quote_ident(""), "\"\"");
        assert_eq!(quote_ident("\"\""), "\"\"\"\"\"\"");
    }

    #[test]
    fn the_insert_channel_follows_the_version() {
        let lower = QueueName::new("orders-eu.v2").unwrap();
        let mixed = QueueName::new("Orders-EU.v2").unwrap();
        for v in [Version::new(1, 11, 0), Version::new(1, 13, 0)] {
            assert_eq!(
                lower.insert_channel_for(v).as_deref(),
                Some("pgmq.q_orders-eu.v2.INSERT")
            );
            assert_eq!(mixed.insert_channel_for(v), None);
        }
        for v in [
            NOTIFY_KEEPS_CASE,
            Version::new(1, 14, 0),
            Version::new(2, 0, 0),
        ] {
            assert_eq!(
                mixed.insert_channel_for(v).as_deref(),
                Some("pgmq.q_Orders-EU.v2.INSERT")
            );
        }
    }
}
