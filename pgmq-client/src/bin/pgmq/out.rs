//! What `pgmq` prints: JSON lines or aligned tables on stdout, and failures
//! with their exit status.

use serde_json::Value;
use tokio::io::{AsyncWriteExt, BufWriter, Stdout};
use tokio_postgres::error::SqlState;

/// The exit status of a failure. `--help` lists them (see `EXIT_CODES`);
/// scripts branch on them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exit {
    /// Anything else.
    Other = 1,
    /// A bad command line (clap exits with 2 on its own errors too).
    Usage = 2,
    /// The queue (or the message) does not exist.
    NotFound = 3,
    /// Refused: no privilege, a confirmation (--yes) missing, an untrusted
    /// pgmq_sdk schema, a login the server turned down.
    Refused = 4,
    /// The database could not be reached; nothing was done.
    Unreachable = 5,
}

/// The exit statuses, as `--help` shows them.
pub(crate) const EXIT_CODES: &str = "\
Exit status: 0 done; 1 any other failure; 2 bad command line (a bad queue name or argument); \
3 not found (the queue, or the message, does not exist); 4 refused (permission denied, \
purge or drop without --yes, an untrusted pgmq_sdk schema, a login the server turned down); \
5 database unreachable (nothing was done).";

/// A failure to report: the message printed after `pgmq: error: `, and the
/// exit status.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) code: Exit,
    pub(crate) msg: String,
}

impl Failure {
    pub(crate) fn new(code: Exit, msg: impl Into<String>) -> Self {
        Failure {
            code,
            msg: msg.into(),
        }
    }

    /// The same failure (and exit status), its message rewritten.
    pub(crate) fn map_msg(self, f: impl FnOnce(String) -> String) -> Self {
        Failure {
            code: self.code,
            msg: f(self.msg),
        }
    }
}

impl From<pgmq_client::Error> for Failure {
    fn from(e: pgmq_client::Error) -> Self {
        Failure::new(exit_for(&e), e.to_string())
    }
}

impl From<String> for Failure {
    fn from(msg: String) -> Self {
        Failure::new(Exit::Other, msg)
    }
}

impl From<serde_json::Error> for Failure {
    fn from(e: serde_json::Error) -> Self {
        Failure::new(Exit::Other, e.to_string())
    }
}

impl From<pgmq_client::reexports::rustls::Error> for Failure {
    fn from(e: pgmq_client::reexports::rustls::Error) -> Self {
        Failure::new(Exit::Other, e.to_string())
    }
}

/// The exit status for a client error.
pub(crate) fn exit_for(e: &pgmq_client::Error) -> Exit {
    use pgmq_client::{CommitOutcome, Error};
    match e {
        Error::QueueNotFound { .. } => Exit::NotFound,
        Error::InvalidQueueName { .. } | Error::InvalidArgument(_) => Exit::Usage,
        Error::SdkSchemaUntrusted { .. } | Error::NotTableOwner { .. } => Exit::Refused,
        // The server answered and turned the login down (SQLSTATE class 28:
        // a wrong password, no pg_hba.conf entry; or it asked for a password
        // and there was none to give): refused, not unreachable, so that a
        // script does not retry it as an outage. A server that answered with
        // another error (no such database) is neither.
        Error::Connect(source) => match source.code() {
            Some(c) if c.code().starts_with("28") => Exit::Refused,
            Some(c)
                if *c == SqlState::TOO_MANY_CONNECTIONS || *c == SqlState::CANNOT_CONNECT_NOW =>
            {
                Exit::Unreachable
            }
            Some(_) => Exit::Other,
            // tokio-postgres' words (in the error's causes, which the
            // client's message includes) for a password the server asked
            // for and the client did not have; it has no error kind to test.
            None if e.to_string().contains("password missing") => Exit::Refused,
            None => Exit::Unreachable,
        },
        Error::PoolTimeout => Exit::Unreachable,
        Error::ConnectionLost {
            outcome: CommitOutcome::NotSent,
            ..
        } => Exit::Unreachable,
        _ if e.sqlstate() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) => Exit::Refused,
        _ => Exit::Other,
    }
}

/// Fails with `msg` and exit status 1.
pub(crate) fn fail<T>(msg: impl Into<String>) -> Result<T, Failure> {
    Err(Failure::new(Exit::Other, msg))
}

/// Buffered output on stdout: JSON lines, or text such as a table.
pub(crate) struct Out(pub(crate) BufWriter<Stdout>);

impl Out {
    pub(crate) fn stdout() -> Self {
        Out(BufWriter::new(tokio::io::stdout()))
    }

    /// `v` as one line of JSON.
    pub(crate) async fn line(&mut self, v: &impl serde::Serialize) -> Result<(), Failure> {
        let mut text = serde_json::to_vec(v)?;
        text.push(b'\n');
        self.bytes(&text).await
    }

    pub(crate) async fn text(&mut self, text: &str) -> Result<(), Failure> {
        self.bytes(text.as_bytes()).await
    }

    async fn bytes(&mut self, bytes: &[u8]) -> Result<(), Failure> {
        self.0
            .write_all(bytes)
            .await
            .map_err(|e| Failure::new(Exit::Other, format!("writing output: {e}")))
    }

    pub(crate) async fn flush(&mut self) -> Result<(), Failure> {
        self.0
            .flush()
            .await
            .map_err(|e| Failure::new(Exit::Other, format!("writing output: {e}")))
    }

    /// `rows` as JSON lines (their fields in their own order), or with
    /// `table` as an aligned table of `cols`.
    pub(crate) async fn rows<T: serde::Serialize>(
        &mut self,
        table: bool,
        cols: &[Col],
        rows: &[T],
    ) -> Result<(), Failure> {
        if table {
            let values = rows
                .iter()
                .map(serde_json::to_value)
                .collect::<Result<Vec<_>, _>>()?;
            return self.text(&render(cols, &values)).await;
        }
        for r in rows {
            self.line(r).await?;
        }
        Ok(())
    }
}

/// A column of a table: its heading, the key of the JSON row it shows, and
/// how it shows it.
#[derive(Clone, Copy)]
pub(crate) struct Col {
    pub(crate) head: &'static str,
    pub(crate) key: &'static str,
    pub(crate) kind: Kind,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A string as it is, a number, true or false.
    Plain,
    /// An RFC 3339 time, to the second, in UTC.
    Time,
    /// JSON (a body, headers), compact, cut at [`JSON_CELL`] characters.
    Json,
}

pub(crate) const fn col(head: &'static str, key: &'static str) -> Col {
    Col {
        head,
        key,
        kind: Kind::Plain,
    }
}

pub(crate) const fn time(head: &'static str, key: &'static str) -> Col {
    Col {
        head,
        key,
        kind: Kind::Time,
    }
}

pub(crate) const fn json(head: &'static str, key: &'static str) -> Col {
    Col {
        head,
        key,
        kind: Kind::Json,
    }
}

/// How many characters of a body a table shows.
const JSON_CELL: usize = 60;

/// One cell: `-` for null or missing; control characters (a newline in a
/// pause reason, an escape sequence) as `?`, so that a value cannot break
/// the table or drive the terminal.
fn cell(v: Option<&Value>, kind: Kind) -> String {
    let text = match (v, kind) {
        (None | Some(Value::Null), _) => return "-".to_owned(),
        (Some(v), Kind::Json) => {
            let s = v.to_string();
            match s.char_indices().nth(JSON_CELL) {
                Some((cut, _)) => format!("{}...", &s[..cut]),
                None => s,
            }
        }
        (Some(Value::String(s)), Kind::Time) => match chrono::DateTime::parse_from_rfc3339(s) {
            Ok(t) => t
                .with_timezone(&chrono::Utc)
                .format("%Y-%m-%d %H:%M:%S")
                .to_string(),
            Err(_) => s.clone(),
        },
        (Some(Value::String(s)), _) => s.clone(),
        (Some(v), _) => v.to_string(),
    };
    text.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// `rows` as a table of `cols`: a heading line, then a line per row, the
/// columns aligned and two spaces apart, with no trailing blanks.
pub(crate) fn render(cols: &[Col], rows: &[Value]) -> String {
    let mut cells: Vec<Vec<String>> = vec![cols.iter().map(|c| c.head.to_owned()).collect()];
    for r in rows {
        cells.push(cols.iter().map(|c| cell(r.get(c.key), c.kind)).collect());
    }
    let widths: Vec<usize> = (0..cols.len())
        .map(|i| {
            cells
                .iter()
                .map(|row| row[i].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut text = String::new();
    for row in &cells {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        text.push_str(line.join("  ").trim_end());
        text.push('\n');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tables_align_and_keep_values_harmless() {
        let cols = [
            col("ID", "id"),
            time("AT", "at"),
            json("BODY", "body"),
            col("WHY", "why"),
        ];
        let rows = [
            json!({"id": 1, "at": "2030-01-02T03:04:05.678901Z", "body": {"a": 1}, "why": "x\ny\u{1b}[2J"}),
            json!({"id": 22, "at": null, "body": "s".repeat(100)}),
        ];
        let text = render(&cols, &rows);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].starts_with("ID  AT                   BODY  "),
            "{text}"
        );
        assert!(lines[0].ends_with("  WHY"), "{text}");
        assert!(
            lines[1].starts_with("1   2030-01-02 03:04:05  {\"a\":1}  "),
            "{text}"
        );
        assert!(lines[1].ends_with("  x?y?[2J"), "{text}");
        assert!(lines[2].starts_with("22  -                    \"sssss"));
        assert!(lines[2].ends_with("s...  -"), "{text}");
        // 60 characters of the body, then the cut.
        assert_eq!(lines[2].matches('s').count(), 59);
    }

    #[test]
    fn errors_map_to_exit_statuses() {
        let e = pgmq_client::Error::QueueNotFound { queue: "q".into() };
        assert_eq!(exit_for(&e), Exit::NotFound);
        assert_eq!(
            exit_for(&pgmq_client::Error::PoolTimeout),
            Exit::Unreachable
        );
        let e = pgmq_client::QueueName::new("a;b").unwrap_err();
        assert_eq!(exit_for(&e), Exit::Usage);
        let e = pgmq_client::Error::SdkSchemaUntrusted { reason: "r".into() };
        assert_eq!(exit_for(&e), Exit::Refused);
        let e = pgmq_client::Error::SdkSchemaMissing { feature: "f" };
        assert_eq!(exit_for(&e), Exit::Other);
    }
}
