//! The pages: one module each, with the actions posted from it.

pub(crate) mod bench;
pub(crate) mod dead;
pub(crate) mod fleet;
pub(crate) mod queue;
pub(crate) mod queues;
pub(crate) mod schedules;

use maud::{html, Markup};
use pgmq_client::{Message, QueueName, RawJson};

use crate::safety::Fields;
use crate::{AppState, ConsoleError};

use crate::layout::pretty;

/// Starts a page's reads: a transaction whose statements end after the
/// console's statement timeout. The caller opens it on a pooled connection
/// and drops it (rolls back) at the end: the reads change nothing.
macro_rules! bounded {
    ($st:expr, $conn:ident, $tx:ident, $pg:ident) => {
        let mut $conn = $st.client.connection().await?;
        let $tx = $conn.transaction().await?;
        let $pg = pgmq_client::Pgmq::on(&$tx);
        $pg.set_local_timeouts($st.opts.statement_timeout, $st.opts.statement_timeout)
            .await?;
    };
}
pub(crate) use bounded;

/// A message's table cells: id, reads, sent, visible at, body, headers
/// (escaped by maud).
pub(crate) fn message_cells(m: &Message<RawJson>) -> Markup {
    html! {
        td.n { (m.msg_id) }
        td.n { (m.read_ct) }
        td { (m.enqueued_at.format("%Y-%m-%d %H:%M:%S")) }
        td { (m.vt.format("%Y-%m-%d %H:%M:%S")) }
        td { pre { (pretty(m.body.get())) } }
        td {
            @if let Some(h) = &m.headers {
                pre { (serde_json::to_string_pretty(h).unwrap_or_default()) }
            }
        }
    }
}

/// The column heads of [`message_cells`].
pub(crate) fn message_heads() -> Markup {
    html! {
        th { "msg_id" } th { "reads" } th { "sent" } th { "visible at" } th { "body" } th { "headers" }
    }
}

/// An action's queue and form, the form checked (its CSRF token and
/// confirmation) before anything is done.
pub(crate) fn posted(
    st: &AppState,
    name: &str,
    body: &str,
) -> Result<(QueueName, Fields), ConsoleError> {
    let queue = QueueName::new(name)?;
    let f = Fields::parse(body)?;
    f.check(st)?;
    Ok((queue, f))
}
