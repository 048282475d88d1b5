//! A queue's page: its numbers, its messages as a look that changes
//! nothing (with a JSON filter on body and headers), its archive, and
//! pause / resume with a reason.

use axum::extract::{Path, Query, State};
use axum::response::{Html, IntoResponse, Redirect, Response};
use maud::html;
use pgmq_client::QueueName;

use crate::layout::{age, count, enc, guard_fields, shell};
use crate::pages::{bounded, message_cells, message_heads, posted};
use crate::{AppState, ConsoleError};

/// The query of a queue's page: the JSON filter and where the list starts.
#[derive(serde::Deserialize)]
pub(crate) struct Params {
    filter: Option<String>,
    #[serde(default)]
    after: i64,
}

/// `GET /queues/{name}`.
pub(crate) async fn page(
    State(st): State<AppState>,
    Path(name): Path<String>,
    Query(p): Query<Params>,
) -> Result<Html<String>, ConsoleError> {
    let queue = QueueName::new(&name)?;
    let filter_text = p.filter.as_deref().map(str::trim).filter(|f| !f.is_empty());
    let (filter, filter_error) = match filter_text.map(serde_json::from_str::<serde_json::Value>) {
        None => (None, None),
        Some(Ok(v)) => (Some(v), None),
        Some(Err(e)) => (None, Some(format!("the filter is not JSON: {e}"))),
    };
    let (cap, rows) = (st.opts.count_cap, st.opts.row_limit);
    bounded!(st, conn, tx, pg);
    let o = pg.queue_overview_one(&queue, cap).await?;
    let messages = pg.look(&queue, p.after, filter.as_ref(), rows, cap).await?;
    let archive = pg.peek_archive_raw(&queue, rows).await?;
    let sdk = pg.sdk_schema_present().await?;
    let paused = if sdk {
        pg.paused_queues()
            .await?
            .into_iter()
            .find(|q| q.queue_name == queue.as_str())
    } else {
        None
    };
    drop(tx);
    st.rates.record(
        std::time::Instant::now(),
        [(queue.as_str(), o.sent_total, o.depth)],
        cap,
    );
    let history = st.rates.history(queue.as_str());
    let next = (messages.len() == rows)
        .then(|| messages.last().map(|m| m.msg_id))
        .flatten();
    let base = format!("/queues/{}", queue.as_str());
    let body = html! {
        table { tbody {
            tr { th { "depth" } td.n #depth { (count(o.depth, cap)) } }
            tr { th { "in flight" } td.n { (count(o.in_flight, cap)) } }
            tr { th { "oldest" } td.n { (o.oldest_age_secs.map(age).unwrap_or_default()) } }
            tr { th { "archive" } td.n { (count(o.archive_size, cap)) } }
            tr { th { "paused" } td #paused {
                @match &paused {
                    Some(p) => {
                        span.paused { "paused" } " since " (p.paused_at.format("%Y-%m-%d %H:%M:%S"))
                        @if let Some(r) = &p.reason { " (" (r) ")" }
                    }
                    None => { "no" }
                }
            } }
        } }
        p { a href=(format!("/dead/{}", queue.as_str())) { "Look at it as a dead-letter queue" } }
        @if !st.opts.read_only && sdk {
            @if paused.is_some() {
                form.action method="post" action=(format!("{base}/resume")) {
                    (guard_fields(&st.csrf, "resume every worker on this queue"))
                    button #resume { "Resume" }
                }
            } @else {
                form.action method="post" action=(format!("{base}/pause")) {
                    input type="text" name="reason" placeholder="reason" maxlength="500";
                    " "
                    (guard_fields(&st.csrf, "stop every worker claiming from this queue"))
                    button #pause { "Pause" }
                }
            }
        }
        h2 { "Messages" }
        p.muted { "A look that changes nothing: no message is hidden, counted or locked." }
        form method="get" action=(base) {
            input type="text" name="filter" size="50" value=[filter_text]
                placeholder="JSON the body or headers contain, e.g. {\"attempts\": 3}";
            " " button { "Filter" }
        }
        @if let Some(e) = &filter_error { p.error { (e) } }
        @if filter.is_some() {
            p.muted { "The filter looks at the " (cap) " messages after msg_id " (p.after) "." }
        }
        table #messages {
            thead { tr { (message_heads()) } }
            tbody { @for m in &messages { tr { (message_cells(m)) } } }
        }
        @if let Some(n) = next {
            p { a href=(format!("{base}?after={n}{}", filter_text.map(|f| format!("&filter={}", enc(f))).unwrap_or_default())) { "Next " (rows) } }
        }
        h2 { "Rates" }
        (rates_chart(&history))
        h2 { "Archive" }
        table #archive {
            thead { tr { (message_heads()) th { "archived" } } }
            tbody {
                @for a in &archive {
                    tr { (message_cells(&a.message)) td { (a.archived_at.format("%Y-%m-%d %H:%M:%S")) } }
                }
            }
        }
    };
    Ok(shell(queue.as_str(), None, body))
}

/// `POST /queues/{name}/pause`: with the CSRF token, the confirmation and
/// an optional reason.
pub(crate) async fn pause(
    State(st): State<AppState>,
    Path(name): Path<String>,
    body: String,
) -> Result<Response, ConsoleError> {
    let (queue, f) = posted(&st, &name, &body)?;
    let reason = f.get("reason").map(str::trim).filter(|r| !r.is_empty());
    st.client.pause(&queue, reason).await?;
    Ok(Redirect::to(&format!("/queues/{}", queue.as_str())).into_response())
}

/// `POST /queues/{name}/resume`: with the CSRF token and the confirmation.
pub(crate) async fn resume(
    State(st): State<AppState>,
    Path(name): Path<String>,
    body: String,
) -> Result<Response, ConsoleError> {
    let (queue, _) = posted(&st, &name, &body)?;
    st.client.resume(&queue).await?;
    Ok(Redirect::to(&format!("/queues/{}", queue.as_str())).into_response())
}

/// The queue's rates in and out over the intervals sampled (the last 30),
/// as a chart, or a line saying there is no history yet.
fn rates_chart(history: &[crate::rates::Rate]) -> maud::Markup {
    let last = &history[history.len().saturating_sub(30)..];
    if last.is_empty() {
        return html! {
            p.muted #rates {
                "No rate history yet: the console samples each queue every "
                (crate::rates::SAMPLE_EVERY.as_secs()) " s (and on each page read) and keeps "
                (crate::rates::KEPT.as_secs() / 60) " minutes."
            }
        };
    }
    let labels: Vec<String> = last
        .iter()
        .map(|r| format!("-{:.0}s", r.ago_secs))
        .collect();
    let series = [
        crate::chart::Series {
            name: "in (sent)".to_owned(),
            values: last.iter().map(|r| Some(r.in_per_s)).collect(),
        },
        crate::chart::Series {
            name: "out (deleted or archived)".to_owned(),
            values: last.iter().map(|r| r.out_per_s).collect(),
        },
    ];
    html! { div #rates { (crate::chart::bars(&labels, &series, "msg/s")) } }
}
